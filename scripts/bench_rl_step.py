"""Benchmark whole RL steps (Trainer.train_step): BF16 vs FP8 rollouts at LLaDA-8B shape with LoRA r=128.

  python scripts/bench_rl_step.py                     # GPU: LLaDA-8B shape, random bf16 weights
  python scripts/bench_rl_step.py --smoke             # CPU, the tiny model, seconds (FP8 via the torch reference)

The master is our LLaDAModelLM with LLaDA-8B's shape and random weights (no download; scripts/bench_rollout.py's
random_llada), wrapped in peft LoRA r=128 (α 64) on every projection as d1 trains it; the tokenizer is models/tiny.py's
character tokenizer, and the model config uses its special-token ids (mask, EOS, …), so nothing is downloaded. Prompts
are random printable strings of --prompt-len characters; the reward is a deterministic function of the completion text
(a random model's rewards carry no meaning: only the time of each stage matters). Each precision gets a fresh
`Trainer` (its own optimizer; FP8: `quantize_model(master, backend)` in its constructor) and runs --warmup untimed
steps, then --rl-steps timed ones through the real `Trainer.train_step`, with d1's settings unless overridden
(G = 8, gen 256, block 32, 128 sampler steps, β 0.04, GRPO loss, mismatch ELBO with 4 coupled draws).

Stages per step (seconds; CUDA-synchronised at every boundary, so queued work is counted where it was launched):
  rollout_s   backend.sample (the diffusion rollout with the rollout model)
  mismatch_s  backend.mismatch_log_w (coupled BF16/FP8 ELBO; ~0 for BF16 rollouts, where μ = π_old)
  logp_s      no-grad token log-probs: π_old and the reference (adapters disabled), per inner iteration
  update_s    the gradient updates (forwards with grad, backward, optimizer): the trainer's update time − logp_s
  sync_s      requantising the master into the FP8 copy (0 for BF16)
  step_s      the whole train_step; other_s = step_s − the stages above (rewards, advantages, decoding)
plus peak_mem_gib (CUDA). FP8 rows add step_speedup_vs_bf16 (BF16 step_s / FP8 step_s) and mismatch_fraction
(mismatch_s / step_s). One JSON line per (precision, backend) with the medians over the timed steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
import zlib
from collections import defaultdict
from pathlib import Path

import torch

from dllm_ais import metrics as M
from dllm_ais.analysis import bench_env
from dllm_ais.config import CorrectionConfig, GRPOConfig, ModelConfig, Preset, SamplerConfig, TrainConfig

REPO = Path(__file__).resolve().parent.parent
STAGES = ("rollout_s", "mismatch_s", "logp_s", "update_s", "sync_s")
DEFAULTS = {
    "full": dict(prompts=4, num_generations=8, prompt_len=64, gen_length=256, block_length=32, sampler_steps=128,
                 grad_accum=8, lora_r=128, backends=["auto"], rl_steps=2, warmup=1),
    "smoke": dict(prompts=2, num_generations=2, prompt_len=8, gen_length=8, block_length=4, sampler_steps=4,
                  grad_accum=2, lora_r=4, backends=["torch"], rl_steps=1, warmup=0),
}


class TimedBackend:
    """Wraps a Backend and adds the (synchronised) wall time of each call to `times` under its stage name."""

    def __init__(self, inner, device: torch.device) -> None:
        self.inner, self.device = inner, device
        self.times: dict[str, float] = defaultdict(float)

    def _timed(self, stage: str, fn, *args, **kwargs):
        bench_env.sync(self.device)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        bench_env.sync(self.device)
        self.times[stage] += time.perf_counter() - t0
        return out

    def sample(self, *args, **kwargs):
        return self._timed("rollout_s", self.inner.sample, *args, **kwargs)

    def mismatch_log_w(self, *args, **kwargs):
        return self._timed("mismatch_s", self.inner.mismatch_log_w, *args, **kwargs)

    def token_logp(self, *args, **kwargs):
        if torch.is_grad_enabled():  # inside the update: counted in update_s by the trainer's own clock
            return self.inner.token_logp(*args, **kwargs)
        return self._timed("logp_s", self.inner.token_logp, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def timed_train_step(trainer, timed: TimedBackend, device: torch.device) -> tuple[dict, float]:
    """One Trainer.train_step with `timed`'s stage clocks reset first: (its metrics row, its synchronised seconds)."""
    timed.times.clear()
    bench_env.sync(device)
    t0 = time.perf_counter()
    row = trainer.train_step()
    bench_env.sync(device)
    step_s = time.perf_counter() - t0
    trainer.step += 1
    return row, step_s


def _random_llada_fn():
    """scripts/bench_rollout.py's random_llada (a sibling script, not a package module)."""
    spec = importlib.util.spec_from_file_location("bench_rollout", REPO / "scripts" / "bench_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.random_llada, module.SHAPES


def build_master(size: str, device: torch.device, lora_r: int):
    """(peft LoRA master, tokenizer): LLaDA-8B shape with the tiny tokenizer's ids (full), or the tiny model (smoke)."""
    from peft import LoraConfig, get_peft_model

    from dllm_ais.models.llada.model import LLaDAConfig, lora_target_regex
    from dllm_ais.models.tiny import tiny_config, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    if size == "smoke":
        model = tiny_model(seed=0, dtype=torch.float32).to(device)
    else:
        random_llada, shapes = _random_llada_fn()
        ids = {k: getattr(tiny_config(), k) for k in ("mask_token_id", "eos_token_id", "pad_token_id",
                                                       "bos_token_id", "eot_token_id")}  # fmt: skip
        model = random_llada(LLaDAConfig(**{**shapes["full"], **ids}), seed=0, device=device)
    lora = LoraConfig(r=lora_r, lora_alpha=64.0, lora_dropout=0.0, target_modules=lora_target_regex())
    return get_peft_model(model, lora), tokenizer


def random_rows(n: int, length: int, seed: int) -> list[dict]:
    """n prompts of `length` random printable characters (a seeded generator)."""
    from dllm_ais.models.tiny import CHARS

    g = torch.Generator().manual_seed(seed)
    alphabet = CHARS[:94]  # no whitespace: every character is one token
    picks = torch.randint(0, len(alphabet), (n, length), generator=g).tolist()
    return [{"prompt": "".join(alphabet[i] for i in row)} for row in picks]


def text_reward(prompts, completions, **columns) -> list[float]:
    """A deterministic, graded stand-in reward (crc32 of the text mod 5) so advantages are not all zero."""
    return [float(zlib.crc32(c.encode()) % 5) for c in completions]


def make_preset(args, device: torch.device, precision: str, backend: str | None) -> Preset:
    return Preset(
        "bench-rl-step", "scripts/bench_rl_step.py",
        ModelConfig(dtype="float32" if args.smoke else "bfloat16", device=str(device)),
        SamplerConfig(gen_length=args.gen_length, block_length=args.block_length, steps=args.sampler_steps,
                      temperature=0.9),
        TrainConfig(task="bench", steps=args.warmup + args.rl_steps, prompts_per_step=args.prompts,
                    learning_rate=3e-6, weight_decay=0.1, max_grad_norm=0.2,
                    gradient_accumulation_steps=args.grad_accum, rollout_precision=precision,
                    fp8_backend=backend or "torch", mismatch_num_draws=args.mismatch_draws, lora_r=args.lora_r),
        GRPOConfig(num_generations=args.num_generations, scale_rewards="none", epsilon=0.5, beta=0.04,
                   loss_type="grpo", max_completion_length=args.gen_length, num_iterations=args.num_iterations),
        CorrectionConfig(),
    )  # fmt: skip


def measure(master, tokenizer, args, device: torch.device, precision: str, backend: str | None, rows, run_dir):
    """Run warm-up + timed train_steps with a fresh Trainer; the medians of each stage over the timed steps."""
    from dllm_ais.models.llada.backend import build_backend as _llada_backend
    from dllm_ais.train.run_dir import RunDir
    from dllm_ais.train.trainer import Policy, Trainer

    preset = make_preset(args, device, precision, backend)
    inner = _llada_backend(preset.sampler, master.base_model.model, tokenizer, preset.train)
    timed = TimedBackend(inner, device)
    policy = Policy(model=master, tokenizer=tokenizer, backend=timed, save_model=None, load_model_state=None,
                    use_chat_template=False)  # fmt: skip
    bench_env.sync(device)
    t0 = time.perf_counter()
    trainer = Trainer(preset, policy, RunDir(run_dir), text_reward, rows, progress=False)
    bench_env.sync(device)
    build_s = time.perf_counter() - t0
    sync_fn = trainer._sync_rollout

    def timed_sync() -> None:
        timed._timed("sync_s", sync_fn)

    trainer._sync_rollout = timed_sync
    samples: dict[str, list[float]] = defaultdict(list)
    with bench_env.cuda_memory(device) as memory:
        for i in range(args.warmup + args.rl_steps):
            row, step_s = timed_train_step(trainer, timed, device)
            if i < args.warmup:
                continue
            stages = {s: timed.times.get(s, 0.0) for s in STAGES}
            stages["update_s"] = row[M.time_key("update")] - stages["logp_s"]
            stages["step_s"] = step_s
            stages["other_s"] = step_s - sum(stages[s] for s in STAGES)
            stages["rollout_tokens_per_s"] = args.prompts * args.num_generations * args.gen_length / stages["rollout_s"]
            for key, value in stages.items():
                samples[key].append(value)
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"trainer_build_s": build_s, **{k: statistics.median(v) for k, v in samples.items()}, **memory}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny model on CPU, seconds")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "rl_step.jsonl"), help="JSONL file to append to")
    parser.add_argument("--backends", nargs="+", help="FP8 backends (default auto; smoke torch)")
    parser.add_argument("--prompts", type=int, help="prompts per step (default 4; smoke 2)")
    parser.add_argument("--num-generations", type=int, help="G per prompt (default 8; smoke 2)")
    parser.add_argument("--prompt-len", type=int, help="prompt characters = tokens (default 64; smoke 8)")
    parser.add_argument("--gen-length", type=int, help="completion tokens (default 256; smoke 8)")
    parser.add_argument("--block-length", type=int, help="semi-autoregressive block (default 32; smoke 4)")
    parser.add_argument("--sampler-steps", type=int, help="denoising steps (default 128; smoke 4)")
    parser.add_argument("--grad-accum", type=int, help="micro-batches per update (default 8; smoke 2)")
    parser.add_argument("--lora-r", type=int, help="LoRA rank (default 128; smoke 4)")
    parser.add_argument("--num-iterations", type=int, default=1, help="GRPO inner iterations (d1: 12; default 1)")
    parser.add_argument("--mismatch-draws", type=int, default=4, help="coupled ELBO draws for log w (default 4)")
    parser.add_argument("--rl-steps", type=int, help="timed steps per precision, median (default 2; smoke 1)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 1; smoke 0)")
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "full"
    for key, value in DEFAULTS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    env = bench_env.environment(device, args.smoke, REPO, bench="rl_step", libraries=("torch", "triton", "peft"))
    setting = {k: getattr(args, k) for k in ("prompts", "num_generations", "prompt_len", "gen_length", "block_length",
                                             "sampler_steps", "grad_accum", "lora_r", "num_iterations",
                                             "mismatch_draws", "rl_steps", "warmup")}  # fmt: skip
    with bench_env.jsonl_writer(args.out, env) as emit:
        if device.type != "cuda" and not args.smoke:
            for precision, backend in [("bf16", None)] + [("fp8", b) for b in args.backends]:
                emit(**setting, precision=precision, backend=backend, status="skipped", reason=bench_env.NO_CUDA_REASON)
            return
        master, tokenizer = build_master(size, device, args.lora_r)
        rows = random_rows(64, args.prompt_len, seed=0)
        bf16: dict | None = None
        with tempfile.TemporaryDirectory(prefix="bench_rl_step_") as tmp:
            for i, (precision, backend) in enumerate([("bf16", None)] + [("fp8", b) for b in args.backends]):
                record = dict(**setting, precision=precision, backend=backend)
                reason = None if backend is None else bench_env.backend_reason(backend, device)
                if reason is not None:
                    emit(**record, status="skipped", reason=reason)
                    continue
                try:
                    result = measure(master, tokenizer, args, device, precision, backend, rows, Path(tmp) / str(i))
                except Exception as e:  # e.g. out of memory: record it and go on
                    emit(**record, status="failed", reason=bench_env.error_reason(e))
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    continue
                if backend is None:
                    bf16 = result
                else:
                    result["mismatch_fraction"] = result["mismatch_s"] / result["step_s"]
                    if bf16 is not None:
                        result["step_speedup_vs_bf16"] = bf16["step_s"] / result["step_s"]
                        if "peak_mem_gib" in result and "peak_mem_gib" in bf16:
                            result["peak_mem_ratio_vs_bf16"] = result["peak_mem_gib"] / bf16["peak_mem_gib"]
                emit(**record, **result, status="ok")


if __name__ == "__main__":
    main()
