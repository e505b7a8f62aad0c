"""Greedy evaluation of a LLaDA model on a task's split, with d1's settings, and the `dllm-ais eval` command.

d1 (diffu-GRPO) evaluates at temperature 0 with low-confidence remasking, blocks of 32 tokens and gen_length / 2
denoising steps, for gen_length 128, 256 and 512. Every row of the split is sampled (batched, left-padded prompts,
the chat template iff the task asks for it and the tokenizer has one) and scored with the task's own reward;
accuracy = mean reward. `load_for_eval` finds the model to evaluate: a checkpoint directory, a run's latest
checkpoint (full model or base + LoRA adapter), or a preset's model.

Outputs (per gen length, when an output directory is given): `generations.jsonl` (one row per input row: prompt,
completion, reward, gold columns) and `scores.json` (the returned summary), each written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dllm_ais.atomic import atomic_write_text
from dllm_ais.config import CACHE_MODES, Preset, SamplerConfig, override, with_block_length
from dllm_ais.presets import PRESETS, get_preset
from dllm_ais.progress import progress_bar
from dllm_ais.tasks import d1

if TYPE_CHECKING:  # type hints only (run_dir imports torch-side modules)
    from dllm_ais.train.run_dir import RunDir

PROTOCOLS = ("strict", "d1")
"""strict: the task's own prompt and reward (our default). d1: d1's prompts, generation window and parsing."""

D1_BLOCK_LENGTH = 32
"""d1's semi-autoregressive block length at evaluation."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


# ---------------------------------------------------------------------------------------------------------------------
# Sampler settings


def d1_sampler(gen_length: int) -> SamplerConfig:
    """d1's evaluation sampler: greedy, low-confidence remasking, blocks of 32, steps = gen_length / 2."""
    block = min(D1_BLOCK_LENGTH, gen_length)
    if gen_length % block:
        raise ValueError(f"gen_length={gen_length}: d1 evaluation uses blocks of {D1_BLOCK_LENGTH} tokens; choose a "
                         f"multiple of {D1_BLOCK_LENGTH} (d1 reports 128, 256, 512).")
    return SamplerConfig(gen_length=gen_length, block_length=block, steps=max(1, gen_length // 2), temperature=0.0,
                         remasking="low_confidence")


def eval_sampler(preset: Preset, gen_length: int | None = None) -> SamplerConfig:
    """Sampler for evaluating `preset`'s model at `gen_length` (None: the preset's length).

    Real checkpoints (preset.model.path set) get `d1_sampler`, unless their family evaluates with its own rollout
    sampler (Family.eval_uses_rollout_sampler: SDAR). The tiny built-in model, and such a family, keep the preset's
    settings at temperature 0; another length keeps the preset's steps per token — in one block (the tiny model), or
    in the preset's blocks (a family with its own sampler: a length off its blocks is refused in one line).
    """
    from dllm_ais.families import get_family

    base = preset.sampler
    own = get_family(preset.model.family).eval_uses_rollout_sampler
    if preset.model.path is not None and not own:
        return d1_sampler(gen_length or base.gen_length)
    if gen_length is None or gen_length == base.gen_length:
        return replace(base, temperature=0.0)
    steps = max(1, gen_length * base.steps // base.gen_length)
    one_block = replace(base, gen_length=gen_length, block_length=gen_length, steps=steps, temperature=0.0)
    return with_block_length(one_block, base.block_length) if own else one_block


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation


def _load_rows(task, split: str, data_path: str | None, limit: int | None, seed: int, task_config: dict | None):
    kwargs = {}
    if task_config:
        from dllm_ais.train.job import task_config_kwargs

        kwargs = task_config_kwargs(task.load, task_config)
    rows = task.load(split, data_path=data_path, limit=limit, seed=seed, **kwargs)
    if not rows:
        raise ValueError(f"task {task.name!r} split {split!r} has no rows (data_path={data_path!r}, limit={limit}).")
    return rows


def evaluate(model, tokenizer, task_name: str, sampler: SamplerConfig, *, split: str = "test",
             data_path: str | None = None, limit: int | None = None, batch_size: int = 16, seed: int = 0,
             out_dir: str | os.PathLike | None = None, progress: bool = False, task_config: dict | None = None,
             meta: dict[str, Any] | None = None, family: str = "llada", protocol: str = "strict",
             temperature: float = 0.0, log_batches: bool = False) -> dict[str, Any]:
    """Greedy completions (or sampled at `temperature`) for every row of `task_name`'s `split`, scored with the task's
    reward.

    model: LLaDAModelLM (or its FP8 copy), or a causal LM with family="qwen"; its device is used.
    sampler: length/blocks/steps/remasking; its temperature is replaced by `temperature` (default 0, d1's setting;
    the corrections study scores sampled accuracy at T = 1, the generator seeded per batch). seed: the procedural
    test set's seed and the sampler's generator (only used by random remasking). task_config: generator options
    of a procedural task (e.g. {"max_operand": 9}). meta: extra entries for the summary (e.g. the model's source).
    protocol: "strict" (the task's prompt and reward) or "d1" (d1's prompts with the "<reasoning>" opening, the
    completion window decoded with special tokens kept, d1's parsing and aggregation; tasks/d1.py).
    Returns {"task", "split", "n", "accuracy" (mean reward; d1 Sudoku: correct cells / empty cells),
    "full_reward_frac", "gen_length", "block_length", "steps", "mean_completion_tokens", "seconds", ...}; with
    `out_dir`, also writes generations.jsonl and scores.json.
    """
    import torch

    from dllm_ais.families import get_family
    from dllm_ais.models.load import encode_prompts
    from dllm_ais.tasks.registry import get_task

    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    try:
        task = get_task(task_name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    check_protocol(protocol, task_name)
    sampler = replace(sampler, temperature=temperature)
    fam = get_family(family)
    block = None if fam.eval_block_length is None else fam.eval_block_length(model, sampler)
    if block is not None:  # the family's own block (Dream uncached: one; SDAR: the trained one)
        sampler = with_block_length(sampler, block)
    rows = _load_rows(task, split, data_path, limit, seed, task_config)
    prompts = [r["prompt"] for r in rows] if protocol == "strict" else [d1.user_prompt(task_name, r) for r in rows]
    prefix = d1.ASSISTANT_PREFIX if protocol == "d1" else ""
    device = next(model.parameters()).device
    backend = get_family(family).backend(sampler, model, tokenizer)
    was_training = model.training
    model.eval()
    completions: list[str] = []
    lengths: list[int] = []
    nfe = 0
    t0 = time.perf_counter()
    batches = progress_bar(range(0, len(rows), batch_size), enabled=progress,
                           desc=f"eval {task_name} L={sampler.gen_length}", unit="batch")
    n_batches = -(-len(rows) // batch_size)
    try:
        for i, start in enumerate(batches):
            if log_batches and not progress:  # no bar (stderr not a tty): one line per batch instead
                print(f"eval {task_name} L={sampler.gen_length}: batch {i + 1}/{n_batches} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            ids, mask = encode_prompts(tokenizer, prompts[start:start + batch_size], chat=task.use_chat_template,
                                       device=device, assistant_prefix=prefix)  # [b, P] left-padded
            generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + start)
            rollout = backend.sample(model, ids, mask, generator)
            nfe += rollout.nfe if rollout.nfe is not None else rollout.num_steps
            for comp, keep in zip(rollout.completion_ids, rollout.completion_mask, strict=True):  # [L], [L]
                if protocol == "d1":  # d1 eval.py: the whole window, special tokens kept
                    completions.append(tokenizer.decode(comp, skip_special_tokens=False))
                else:
                    completions.append(tokenizer.decode(comp[keep], skip_special_tokens=True))
                lengths.append(int(keep.sum()))
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - t0

    rewards, accuracy = score_completions(task_name, protocol, prompts, completions, rows)
    n = len(rows)
    chat = bool(task.use_chat_template and getattr(tokenizer, "chat_template", None))
    scores = {
        "task": task_name, "split": split, "protocol": protocol, "n": n, "accuracy": accuracy,
        "full_reward_frac": sum(r >= 1.0 for r in rewards) / n, "gen_length": sampler.gen_length,
        "block_length": sampler.block_length, "steps": sampler.steps, "temperature": sampler.temperature,
        "remasking": sampler.remasking, "cache": sampler.cache, "threshold": sampler.threshold,
        "nfe": nfe, "chat_template": chat,
        "mean_completion_tokens": sum(lengths) / n, "batch_size": batch_size, "seed": seed, "data_path": data_path,
        "limit": limit, "seconds": seconds, **(meta or {}),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"index": i, "prompt": p, "completion": c, "reward": r, "completion_tokens": t,
                             **{k: v for k, v in row.items() if k != "prompt"}}, default=str)
                 for i, (p, c, r, t, row) in enumerate(zip(prompts, completions, rewards, lengths, rows, strict=True))]
        atomic_write_text(out / "generations.jsonl", "\n".join(lines) + "\n")
        atomic_write_text(out / "scores.json", json.dumps(scores, indent=2, default=str) + "\n")
    return scores


def check_protocol(protocol: str, task: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"--protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}.")
    if protocol == "d1":
        d1.check_task(task)


def score_completions(task_name: str, protocol: str, prompts: list, completions: list[str], rows: list[dict],
                      ) -> tuple[list[float], float]:
    """Per-row rewards and the split's accuracy under `protocol`.

    strict: the task's reward, accuracy = mean reward. d1: (correct, total) per row from tasks/d1.py, reward =
    correct / total, accuracy = Σ correct / Σ total (= the mean for 0/1 tasks; Sudoku: correct cells / empty cells).
    """
    from dllm_ais.tasks.base import reward_columns
    from dllm_ais.tasks.registry import get_task

    if protocol == "d1":
        pairs = [d1.score(task_name, text, row) for text, row in zip(completions, rows, strict=True)]
        total = sum(t for _, t in pairs)
        return [c / t if t else 0.0 for c, t in pairs], (sum(c for c, _ in pairs) / total if total else 0.0)
    rewards = [float(v) for v in get_task(task_name).reward(prompts, completions, **reward_columns(rows))]
    if len(rewards) != len(rows):
        raise RuntimeError(f"task {task_name!r} reward returned {len(rewards)} values for {len(rows)} completions.")
    return rewards, sum(rewards) / len(rows)


# ---------------------------------------------------------------------------------------------------------------------
# Rescoring saved generations


def read_generation_file(path: str | os.PathLike, task: str) -> tuple[str, list[dict], list[str]]:
    """(layout, rows, completions) of a saved generation file, without a model.

    Layouts: "d1" — d1's `*_generations.json`, one JSON object {"generations": [{"question", "generations" (text),
    "ground_truth", ...}]}; its rows are rebuilt in our columns (tasks/d1.py `row_from_d1`). "ours" — our
    generations.jsonl, one object per line with "completion" and the task's columns.
    """
    from dllm_ais.tasks.registry import get_task

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--score-file {path}: no such file.")
    text = path.read_text()
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("generations"), list):
        rows, completions = [], []
        for i, item in enumerate(whole["generations"]):
            if not isinstance(item, dict) or not isinstance(item.get("generations"), str):
                raise ValueError(f"{path}: generations[{i}] has no 'generations' text (d1 layout).")
            try:
                row = d1.row_from_d1(task, item)
            except (TypeError, ValueError, KeyError) as e:
                raise ValueError(f"{path}: generations[{i}]: {e}") from None
            row["prompt"] = item.get("question", "")
            rows.append(row)
            completions.append(item["generations"])
        return "d1", rows, completions
    needed = get_task(task).answer_columns
    rows, completions = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg}); expected d1's *_generations.json or our "
                             "generations.jsonl.") from None
        if not isinstance(item, dict) or not isinstance(item.get("completion"), str):
            raise ValueError(f"{path}:{n}: no 'completion' text (our generations.jsonl layout).")
        missing = [c for c in needed if c not in item]
        if missing:
            raise ValueError(f"{path}:{n}: missing column(s) {missing} that task {task!r} scores with.")
        completions.append(item.pop("completion"))
        item.setdefault("prompt", "")
        rows.append(item)
    if not rows:
        raise ValueError(f"--score-file {path}: no generations in it.")
    return "ours", rows, completions


def rescore(paths: list[str], task: str, protocol: str = "strict") -> tuple[dict[str, Any], list[dict]]:
    """Score saved generations (several files are pooled, as d1 pools its per-rank files) -> (scores, rows)."""
    from dllm_ais.tasks.registry import get_task

    try:
        get_task(task)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    check_protocol(protocol, task)
    rows, completions, layouts = [], [], []
    for path in paths:
        layout, r, c = read_generation_file(path, task)
        rows += r
        completions += c
        layouts.append(layout)
    prompts = [r["prompt"] for r in rows]
    rewards, accuracy = score_completions(task, protocol, prompts, completions, rows)
    scores = {"task": task, "protocol": protocol, "n": len(rows), "accuracy": accuracy,
              "full_reward_frac": sum(r >= 1.0 for r in rewards) / len(rows), "files": list(paths),
              "layouts": layouts}
    out_rows = [{**{k: v for k, v in row.items()}, "completion": c, "reward": r}
                for row, c, r in zip(rows, completions, rewards, strict=True)]
    return scores, out_rows


def cmd_score_file(args: argparse.Namespace) -> int:
    """`dllm-ais eval --score-file FILE --task T [--protocol P] [--out DIR]`: rescore without a model."""
    if not args.task:
        raise ValueError("--score-file needs --task (gsm8k, math500, countdown, sudoku, arith).")
    given = [flag for flag, v in (("--model", args.model), ("--run", args.run), ("--preset", args.preset)) if v]
    if given:
        raise ValueError(f"--score-file rescores saved text without a model; drop {', '.join(given)}.")
    scores, rows = rescore(args.score_file, args.task, args.protocol)
    print(f"{'task':<12} {'protocol':<9} {'n':>6} {'accuracy':>9}")
    print(f"{scores['task']:<12} {scores['protocol']:<9} {scores['n']:>6} {scores['accuracy']:>9.4f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "generations.jsonl",
                          "".join(json.dumps(r, default=str) + "\n" for r in rows))
        atomic_write_text(out / "scores.json", json.dumps(scores, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Which model to evaluate


class EvalModel(NamedTuple):
    """What `load_for_eval` found: the model (eval mode), its tokenizer, the preset it belongs to, a description."""

    model: Any
    tokenizer: Any
    preset: Preset
    source: str


def _tokenizer_for(model_dir: Path | None, preset: Preset, model):
    """The tokenizer saved beside the weights; else the preset's model's (the tiny tokenizer when it has no path)."""
    from dllm_ais.models.hub import resolve_checkpoint_dir
    from dllm_ais.models.load import load_tokenizer
    from dllm_ais.models.tiny import tiny_tokenizer

    if model_dir is not None and any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        tokenizer = load_tokenizer(model_dir, model.config)
    elif preset.model.path is None:
        tokenizer = tiny_tokenizer()
    else:
        tokenizer = load_tokenizer(resolve_checkpoint_dir(preset.model.path), model.config)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = model.config.pad_token_id
    from dllm_ais.families import get_family

    if get_family(preset.model.family).diffusion:  # as the family's load does (LLaDA, Dream): BOS / EoT ids
        from dllm_ais.models.load import fill_token_ids_from_tokenizer

        fill_token_ids_from_tokenizer(model.config, tokenizer)
    return tokenizer


def _load_dir(model_dir: Path, preset: Preset):
    import torch

    from dllm_ais.families import get_family

    load_dir = get_family(preset.model.family).load_dir
    model = load_dir(model_dir, dtype=getattr(torch, preset.model.dtype), device=preset.model.device)
    return model, _tokenizer_for(model_dir, preset, model)


def _verify_for_load(run: RunDir, ckpt: Path, hash_check: bool) -> None:
    """The checkpoint's manifest, for the files a load reads (model/ or adapter/; sizes of all): a mismatch is one
    CheckpointCorrupt naming the file and the newest older checkpoint that verifies (checked as this one, as
    `--resume` does), or saying that none does."""
    from dllm_ais.train.run_dir import CheckpointCorrupt, RunDir  # noqa: F811

    def verify(path: Path) -> None:
        RunDir.verify(path, hash_check, hash_only=("model/", "adapter/"))

    try:
        verify(ckpt)
    except CheckpointCorrupt as e:
        older = [p for p in run.step_dirs() if int(p.name[5:]) < int(ckpt.name[5:])] if ckpt.name[5:].isdigit() else []
        hint = ""
        for path in older:
            try:
                verify(path)
                hint = f" An older checkpoint to try: --model {path} (it verifies)."
                break
            except CheckpointCorrupt:
                continue
        else:
            if older:
                hint = f" No older checkpoint verifies either ({', '.join(p.name for p in older)} checked)."
        raise CheckpointCorrupt(f"{e}{hint} Restore the file, or retrain.") from None


def _load_run(run_path: Path, device: str | None, dtype: str | None, ckpt: Path | None = None,
              hash_check: bool = True) -> EvalModel:
    """A training run's checkpoint (`ckpt`, default its latest), verified against its manifest: model/ directly, or
    the run's base model + adapter/ merged."""
    from dllm_ais.families import get_family
    from dllm_ais.train.job import SFT_DIR
    from dllm_ais.train.run_dir import RunDir, read_run_config

    run = RunDir(run_path)
    if not run.config_file.is_file():
        raise FileNotFoundError(f"--run {run_path}: no config.json, so not a dllm-ais run directory.")
    preset = read_run_config(run_path)
    preset = replace(preset, model=override(preset.model, device=device, dtype=dtype))
    ckpt = run.latest() if ckpt is None else ckpt
    if ckpt is None:
        hint = f" or evaluate its SFT model with --model {run_path / SFT_DIR}" if (run_path / SFT_DIR).is_dir() else ""
        raise FileNotFoundError(f"--run {run_path}: the run has no checkpoint yet (no checkpoints/latest); wait for "
                                f"its first save (train.save_every){hint}.")
    _verify_for_load(run, ckpt, hash_check)
    if (ckpt / "model").is_dir():
        model, tokenizer = _load_dir(ckpt / "model", preset)
    elif (ckpt / "adapter").is_dir():
        from peft import PeftModel

        sft = run_path / SFT_DIR
        if preset.train.sft_steps > 0:  # the trainer put LoRA on the SFT-warmed model
            if not sft.is_dir():
                raise FileNotFoundError(f"--run {run_path}: LoRA run with SFT warm-up, but its base {sft} is missing.")
            model, tokenizer = _load_dir(sft, preset)
        else:
            model, tokenizer = get_family(preset.model.family).load(preset.model)
        model = PeftModel.from_pretrained(model, str(ckpt / "adapter")).merge_and_unload().eval()
    else:
        raise FileNotFoundError(f"--run {run_path}: checkpoint {ckpt.name} has neither model/ nor adapter/.")
    return EvalModel(model, tokenizer, preset, str(ckpt))


def load_for_eval(model_dir: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None,
                  preset: str | Preset | None = None, *, device: str | None = None,
                  dtype: str | None = None, hash_check: bool = True) -> EvalModel:
    """Resolve the model to evaluate.

    model_dir: an official-layout LLaDA directory (a checkpoint's model/, a run's sft/, a downloaded checkpoint;
    a hub id is fetched); its tokenizer is read from it, else the preset's. run_dir: a training run (its config.json
    gives the preset; its latest checkpoint's model/, or base model + adapter/ merged for LoRA runs). Neither: the
    preset's model (the tiny built-in one by default). device/dtype override the preset's. A run's checkpoint is
    verified against its manifest first (sizes; sha256 of model/ or adapter/ unless hash_check is False).
    """
    if model_dir is not None and run_dir is not None:
        raise ValueError("pass either --model DIR or --run RUN_DIR, not both.")
    if run_dir is not None:
        if preset is not None:
            raise ValueError("--preset cannot be combined with --run: the run's config.json names its preset.")
        return _load_run(Path(run_dir), device, dtype, hash_check=hash_check)
    if model_dir is not None and (Path(model_dir) / "trainer_state.pt").is_file():  # <run>/checkpoints/step-N
        if preset is not None:
            raise ValueError("--preset cannot be combined with a checkpoint directory: its run's config.json names "
                             "the preset.")
        step_dir = Path(model_dir)
        return _load_run(step_dir.parent.parent, device, dtype, ckpt=step_dir, hash_check=hash_check)
    preset = get_preset(preset or "tiny-cpu") if not isinstance(preset, Preset) else preset
    preset = replace(preset, model=override(preset.model, device=device, dtype=dtype))
    if model_dir is None:
        from dllm_ais.families import get_family

        model, tokenizer = get_family(preset.model.family).load(preset.model)
        return EvalModel(model, tokenizer, preset, preset.model.path or f"tiny (seed {preset.model.seed})")
    from dllm_ais.models.hub import resolve_checkpoint_dir

    directory = resolve_checkpoint_dir(str(model_dir))
    model, tokenizer = _load_dir(directory, preset)
    return EvalModel(model, tokenizer, preset, str(directory))


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def parse_gen_lengths(values: list[str] | None) -> list[int]:
    """["128,256", "512"] -> [128, 256, 512] (order kept, duplicates dropped); None -> []."""
    out: list[int] = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or int(part) < 1:
                raise ValueError(f"--gen-length {value!r}: expected positive integers, e.g. 128,256,512.")
            if int(part) not in out:
                out.append(int(part))
    return out


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `dllm-ais eval`."""
    parser.add_argument("--preset", default=None, help=f"named preset: {', '.join(PRESETS)} (default tiny-cpu; not "
                        "with --run)")
    parser.add_argument("--model", default=None, help="checkpoint directory: a run's checkpoints/step-N, "
                        "<run>/sft, a downloaded checkpoint (LLaDA official layout; Qwen with a qwen preset) or a "
                        "hub id")
    parser.add_argument("--run", default=None, help="training run directory: evaluate its latest checkpoint")
    from dllm_ais.train.run_dir import add_hash_check_argument

    add_hash_check_argument(parser)
    parser.add_argument("--task", default=None, help="task name (default: the preset's/run's training task)")
    parser.add_argument("--split", default="test", help="split to evaluate (default test)")
    parser.add_argument("--data-path", default=None, help="local jsonl/parquet file for the split (offline)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N rows")
    parser.add_argument("--gen-length", action="append", default=None, metavar="L[,L...]",
                        help="completion length(s), repeatable or comma list; d1: 128,256,512 (block 32, steps L/2). "
                             "Default: the preset's length")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per sampler batch (default 16)")
    parser.add_argument("--out", default=None, help="output directory: one <task>-<split>-gen<L>/ per length with "
                        "generations.jsonl and scores.json (default <run>/evals/<task>-<protocol>-<time> for a run's "
                        "model, else ./evals/…; with --score-file nothing is written unless --out is given)")
    parser.add_argument("--seed", type=int, default=0, help="seed of procedural test sets and sampler noise")
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: the preset's)")
    parser.add_argument("--dtype", default=None, help="parameter dtype: float32, bfloat16, float16 (default: preset's)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a tty")
    parser.add_argument("--protocol", default="strict", choices=PROTOCOLS,
                        help="strict (default): the task's prompt and strict reward. d1: d1's prompts (system prompt, "
                             "'<reasoning>' opening), block 32, steps L/2, d1's answer parsing; Sudoku scores cell "
                             "accuracy (gsm8k, math500, countdown, sudoku)")
    parser.add_argument("--cache", default=None, choices=CACHE_MODES,
                        help="Fast-dLLM block KV cache for the sampler: none (full forwards), prefix (cache before the "
                             "block), dual (cache before and after the block). Default: the protocol's sampler "
                             "(none; --protocol d1 stays d1's sampler unless this is given)")
    parser.add_argument("--threshold", type=float, default=None, metavar="F",
                        help="Fast-dLLM parallel decoding: commit every masked token of the block with confidence "
                             ">= F (and at least one) per step, in (0, 1]. Default: the fixed schedule")
    parser.add_argument("--score-file", action="append", default=None, metavar="FILE",
                        help="rescore saved generations without a model (d1's *_generations.json or our "
                             "generations.jsonl; repeatable, pooled); needs --task")


def default_eval_dir(run: str | None, model: str | None) -> Path:
    """Where `eval` writes without --out: the run's own evals/ (for --run, or --model <run>/checkpoints/step-N or
    <run>/sft), else ./evals/."""
    if run is not None:
        return Path(run) / "evals"
    if model is not None:
        path = Path(model).expanduser()
        for parent in (path.parent.parent, path.parent):  # <run>/checkpoints/step-N, <run>/sft
            if (parent / "config.json").is_file() and (parent / "checkpoints").is_dir():
                return parent / "evals"
    return Path("evals")


def _check_out_dir(out: str | None) -> None:
    """--out names a directory: a file there, or a file among its parents, is one line before any model is loaded."""
    if out is None:
        return
    for path in (Path(out), *Path(out).parents):
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"--out {out}: {path} is a file, not a directory; choose another --out.")


def cmd_eval(args: argparse.Namespace) -> int:
    """Run `dllm-ais eval`: evaluate at each gen length, print a table, write results under --out."""
    from dllm_ais.train.flags import check_device
    from dllm_ais.train.run_dir import CheckpointCorrupt

    _check_out_dir(args.out)
    if args.score_file:
        return cmd_score_file(args)
    check_device(args.device)
    try:
        loaded = load_for_eval(args.model, args.run, args.preset, device=args.device, dtype=args.dtype,
                               hash_check=not args.no_hash_check)
    except CheckpointCorrupt as e:
        raise ValueError(str(e)) from e
    preset = loaded.preset
    if args.model is None and args.run is None and preset.model.path is None:
        print(f"note: no --model or --run: evaluating the UNTRAINED tiny built-in model (random weights, seed "
              f"{preset.model.seed}), so expect accuracy near 0. Pass --run RUN_DIR (its latest checkpoint) or "
              "--model CHECKPOINT_DIR.", file=sys.stderr)
    task = args.task or preset.train.task
    task_config = preset.train.task_config if task == preset.train.task else None
    check_protocol(args.protocol, task)
    out_root = args.out or str(default_eval_dir(args.run, args.model) / f"{task}-{args.protocol}-"
                                                                     f"{time.strftime('%Y%m%d-%H%M%S')}")
    lengths = parse_gen_lengths(args.gen_length) or [None]
    if args.protocol == "d1":  # d1's sampler for every model, the tiny one included
        samplers = [d1_sampler(L or preset.sampler.gen_length) for L in lengths]
    else:
        samplers = [eval_sampler(preset, L) for L in lengths]
    from dllm_ais.families import get_family

    fast = args.cache not in (None, "none") or args.threshold is not None
    if fast and not get_family(preset.model.family).diffusion:
        raise ValueError("--cache/--threshold apply to diffusion (LLaDA, Dream) models only; drop them for this model.")
    samplers = [override(s, cache=args.cache, threshold=args.threshold) for s in samplers]  # None: unchanged
    results = []
    for sampler in samplers:
        tag = "-d1" if args.protocol == "d1" else ""
        out = Path(out_root) / f"{task}-{args.split}{tag}-gen{sampler.gen_length}"
        print(f"eval: {loaded.source} on {task}/{args.split} at gen_length {sampler.gen_length}"
              f"{'' if args.limit is None else f' (first {args.limit} rows)'}, writing {out}", file=sys.stderr,
              flush=True)
        results.append(evaluate(loaded.model, loaded.tokenizer, task, sampler, split=args.split,
                                data_path=args.data_path, limit=args.limit, batch_size=args.batch_size,
                                seed=args.seed, out_dir=out, progress=args.progress or sys.stderr.isatty(),
                                task_config=task_config, meta={"model": loaded.source, "preset": preset.name},
                                family=preset.model.family, protocol=args.protocol, log_batches=True))
    print(f"model: {loaded.source}")
    print(f"{'task':<12} {'split':<6} {'gen_length':>10} {'n':>6} {'accuracy':>9}")
    for r in results:
        print(f"{r['task']:<12} {r['split']:<6} {r['gen_length']:>10} {r['n']:>6} {r['accuracy']:>9.4f}")
    print(f"wrote {out_root}")
    return 0
