"""Assemble and run a training job from a Preset: task data, model (+ SFT warm-up, LoRA), backend, trainer."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from dllm_ais.config import Preset
from dllm_ais.families import get_family
from dllm_ais.train import grad_diagnostics
from dllm_ais.train.flags import check_trackers
from dllm_ais.train.run_dir import RunDir, resume_checkpoint
from dllm_ais.train.trainer import Policy, Trainer

SFT_DIR = "sft"
SFT_PARTIAL = "sft-partial.pt"
"""State of an SFT warm-up interrupted by Ctrl-C (model, optimizer, schedule, generators); removed once sft/ exists."""


def task_rows_and_reward(preset: Preset):
    """Training rows and the reward function (the task's, or the user's by import path)."""
    from dllm_ais.tasks.registry import get_task
    from dllm_ais.train.rewards import load_reward_set

    tc = preset.train
    try:
        task = get_task(tc.task)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    rows = task.load("train", data_path=tc.data_path, seed=tc.seed, **task_config_kwargs(task.load, tc.task_config))
    if not rows:
        raise ValueError(f"task {tc.task!r} has no training rows (--data {tc.data_path}).")
    reward = load_reward_set(tc.reward_fn, tc.reward_weights, task.reward)
    return task, rows, reward


def check_model_source(mc) -> None:
    """Fail before the run directory is created when `mc.path` is not a loadable checkpoint directory (a hub id is
    fetched here, as loading would): the family's `check_source` parses and checks its config files."""
    if mc.path is None:
        return
    from dllm_ais.models.hub import resolve_checkpoint_dir

    get_family(mc.family).check_source(resolve_checkpoint_dir(mc.path))


def resolve_family_sampler(preset) -> tuple[Preset, str | None, dict | None]:
    """The family's sampler settings resolved against the checkpoint's own (e.g. Dream's alg) and checked before the
    run directory exists (e.g. Dream's --threshold with entropy is refused here, not after the first write):
    (the preset with what runs made explicit, the line saying what the checkpoint sets and what runs, both as a dict
    for config.json) — (preset, None, None) for a family without such settings."""
    family = get_family(preset.model.family)
    if family.resolve_sampler is None:
        return preset, None, None
    return family.resolve_sampler(preset)


def task_config_kwargs(fn, options: dict) -> dict:
    """{"config": TaskConfig(**options)} for a task function taking `config=`, {} when there are no options."""
    if not options:
        return {}
    param = inspect.signature(fn).parameters.get("config")
    if param is None or param.default is inspect.Parameter.empty:
        raise ValueError(f"train.task_config={options} given, but {fn.__module__}.{fn.__name__} takes no config.")
    return {"config": type(param.default)(**options)}


def _sft_pairs(task_name: str, n: int, seed: int, options: dict):
    module = importlib.import_module(f"dllm_ais.tasks.{task_name}")
    if not hasattr(module, "sft_pairs"):
        raise ValueError(f"task {task_name!r} has no sft_pairs(); set train.sft_steps=0 or use the arith task.")
    return module.sft_pairs(n, seed=seed, **task_config_kwargs(module.sft_pairs, options))


def build_policy(preset: Preset, run: RunDir, use_chat_template: bool, progress: bool) -> Policy:
    """Master model (SFT-warmed and cached in <out>/sft when asked), optional LoRA, backend, checkpoint I/O."""
    from dllm_ais.train.sft import warm_up

    tc, mc = preset.train, preset.model
    family_ = get_family(mc.family)
    model, tokenizer = family_.load(mc)
    backend = family_.backend(preset.sampler, model, tokenizer, tc)
    if tc.sft_steps > 0:
        cache = run.path / SFT_DIR
        if cache.is_dir():
            model = family_.load_dir(cache, dtype=getattr(torch, mc.dtype), device=mc.device)
        else:
            pairs = _sft_pairs(tc.task, 20_000, tc.seed, tc.task_config)
            partial = run.path / SFT_PARTIAL  # an interrupted warm-up continues from here (--resume)
            warm_up(model, tokenizer, pairs, tc.sft_steps, tc.sft_batch_size, tc.sft_learning_rate,
                    preset.sampler.gen_length, backend.sft_loss, tokenizer.eos_token_id, tc.seed, progress=progress,
                    checkpoint=partial, chat=use_chat_template)
            family_.save(model, tokenizer, cache)
            partial.unlink(missing_ok=True)
    if tc.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        with torch.random.fork_rng(devices=[]):  # peft draws LoRA's A from the global CPU RNG: the run's seed decides
            torch.manual_seed(tc.seed)  # it (the same on every process, and in a relaunch), the global stream is kept
            model = get_peft_model(model, LoraConfig(r=tc.lora_r, lora_alpha=tc.lora_alpha,
                                                     lora_dropout=tc.lora_dropout,
                                                     target_modules=family_.lora_targets()))

    def save_model(m, directory: Path) -> None:
        if hasattr(m, "peft_config"):
            m.save_pretrained(str(directory / "adapter"))
        else:
            family_.save(m, tokenizer, directory / "model")

    def load_model_state(m, directory: Path) -> None:
        if hasattr(m, "peft_config"):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(m, load_file(str(directory / "adapter" / "adapter_model.safetensors")))
        else:
            m.load_state_dict(family_.load_dir(directory / "model", dtype=next(m.parameters()).dtype,
                                              device="cpu").state_dict())

    return Policy(model=model, tokenizer=tokenizer, backend=backend, save_model=save_model,
                  load_model_state=load_model_state, use_chat_template=use_chat_template)


def build_in_turn(state, build: Callable[[], Policy]) -> Policy:
    """accelerate's main_process_first for the policy, safe to stop: the main process builds first (the SFT warm-up,
    cached in <out>/sft) while the others wait; then every process says whether it was stopped — the main one by
    Ctrl-C / SIGTERM / SIGUSR1 during the warm-up (after saving its state), the others by a signal while they waited
    — and if any was, all stop the same way (exit 130 or RESUME_EXIT_CODE) instead of the others waiting for ever at
    a barrier the main process never reaches. Otherwise the others build (loading the cached warm-up)."""
    if state.num_processes == 1:
        return build()
    from accelerate.utils import gather_object

    from dllm_ais.train.interrupt import Preempted, install_sigint

    policy, stop, waited = None, None, {"stop": None}
    if state.is_main_process:
        try:
            policy = build()
        except (Preempted, KeyboardInterrupt) as e:
            stop = e
        restore = None
    else:  # a signal while waiting is recorded (not a kill), and acted on below with everyone
        restore = install_sigint(lambda: waited["stop"] is not None, lambda reason: waited.update(stop=reason))
    try:
        state.wait_for_everyone()
    finally:
        if restore is not None:
            restore()
    mine = waited["stop"] if stop is None else "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else str(stop)
    reasons = [r for r in gather_object([mine]) if r is not None]
    if reasons:
        if stop is not None:
            raise stop
        print(f"process {state.process_index}: stopping with the run ({reasons[0]} before the first step)",
              file=sys.stderr, flush=True)
        raise KeyboardInterrupt if reasons[0] == "Ctrl-C" else Preempted(reasons[0])
    return policy if policy is not None else build()


def _sft_state(run: RunDir, sft_steps: int) -> str:
    """What a resume without a GRPO checkpoint does with the SFT warm-up (said, never silent)."""
    if sft_steps == 0:
        return "no SFT warm-up in this run"
    if (run.path / SFT_DIR).is_dir():
        return f"the finished SFT warm-up in {run.path / SFT_DIR} is reused"
    partial = run.path / SFT_PARTIAL
    if partial.is_file():
        return f"the SFT warm-up continues from {partial}"
    return (f"the SFT warm-up starts over at step 0 of {sft_steps} (it was stopped before finishing, and only Ctrl-C "
            "or SIGTERM saves a partial one)")


def run_training(preset: Preset, out: str | Path, resume: bool = False, progress: bool = True,
                 steps: int | None = None, save_every: int | None = None, hash_check: bool = True,
                 report_to: list[str] | None = None, save_every_minutes: float | None = None,
                 keep_checkpoints: int | None = None) -> Trainer:
    """Create/resume the run in `out` and train to the end; returns the finished Trainer.

    A resumed run uses the configuration saved in `out`; `steps` / `save_every` / `report_to` /
    `save_every_minutes` / `keep_checkpoints` (if given) change it,
    and the change is recorded in config.json (the CLI refuses every other flag on resume: dllm_ais/train/flags.py).
    It continues from the newest checkpoint that matches its manifest (sha256 too unless `hash_check` is False): see
    run_dir.resume_checkpoint.
    """
    from accelerate import PartialState

    from dllm_ais.train.fsdp_setup import check_fsdp

    state = PartialState(cpu=preset.model.device == "cpu")  # one process, or one per `accelerate launch` rank
    run = RunDir(out)
    if not resume and run.holds_run():
        run.create(preset, resume=False)  # raises the clear "already holds a run" error before any work
    if resume:
        preset = run.create(preset, resume=True)
    if steps is not None:
        preset = replace(preset, train=replace(preset.train, steps=steps))
    if save_every is not None:
        preset = replace(preset, train=replace(preset.train, save_every=save_every))
    if report_to is not None:
        preset = replace(preset, train=replace(preset.train, report_to=list(report_to)))
    for name, value in (("save_every_minutes", save_every_minutes), ("keep_checkpoints", keep_checkpoints)):
        if value is not None:
            preset = replace(preset, train=replace(preset.train, **{name: value}))
    check_fsdp(preset)  # what this preset cannot train under accelerate's FSDP settings: refused before any write
    if preset.train.grad_diagnostics_every and state.num_processes > 1:
        raise ValueError(grad_diagnostics.ONE_PROCESS)
    task, rows, reward = task_rows_and_reward(preset)  # bad task/data fails before the run dir is touched
    check_trackers(preset.train.report_to)  # so does a tracker whose package is missing
    if not resume:
        check_model_source(preset.model)  # a bad --model too: nothing half-made is left behind
    preset, sampling_line, sampling = resolve_family_sampler(preset)  # and a sampler its checkpoint cannot run
    ckpt = resume_checkpoint(run, state, hash_check) if resume else None  # no intact one: refused before any write
    state.wait_for_everyone()  # every process has checked the directory before the main one writes into it
    if state.is_main_process:
        extra = {} if sampling is None else {"sampling": sampling}  # what the checkpoint set, what runs
        preset = run.create(preset, resume=False, extra=extra) if not resume else run.update_config(preset)
        if not resume:  # said when the run starts, not only at its end (a resume names its checkpoint instead)
            print(f"run directory: {run.path}\n{preset.summary()}", file=sys.stderr, flush=True)
        if sampling_line is not None:
            print(sampling_line, file=sys.stderr, flush=True)
    if resume and state.is_main_process and ckpt is None:
        print(f"--resume: {_sft_state(run, preset.train.sft_steps)}", file=sys.stderr, flush=True)
    if preset.model.device.startswith("cuda"):  # each process loads onto its own GPU
        preset = replace(preset, model=replace(preset.model, device=str(state.device)))
    policy = build_in_turn(state, lambda: build_policy(preset, run, task.use_chat_template,
                                                       progress and state.is_main_process))
    trainer = Trainer(preset, policy, run, reward, rows, progress=progress)
    if resume:
        trainer.resume(ckpt)
    trainer.fit()
    return trainer
