"""Does the selection term belong in the trajectory likelihood? std ℓ and ESS of the mismatch log-ratio with and
without it, in the fast regime (Fast-dLLM dual cache, threshold 0.9), FP8 and MXFP4 rollouts.

    python scripts/bench_trajectory_selection.py [--out benchmarks/trajectory/selection.json]

For each testbed the seed-0 SFT model of the preset (its own warm-up, made here in a temporary run), and with
--trained a trained run's final model, samples 64 prompts × G = 8 with the rollout copy; ℓ = log π_old(path) −
log μ(path) over every step, μ from the sampler's record, π_old replayed two ways: uncached (the mismatch estimator
beside the one-step policy, `--policy-logprob one_step`) and with the sampler's cache (the trajectory policy's π_old,
`--policy-logprob trajectory`). ESS is AIS's R of the truncated weights min(e^ℓ, 2). `infeasible` is the fraction of
sequences whose path π_old could not have taken (a selection term at the floor: a committed token below the
threshold under π_old, above it under μ).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from dllm_ais.atomic import atomic_write_text
from dllm_ais.likelihood.selection import LOG_ZERO
from dllm_ais.likelihood.trajectory import policy_token_logp, replay_plan, rollout_token_logp
from dllm_ais.models.load import encode_prompts
from dllm_ais.presets import get_preset
from dllm_ais.rl.correction import ess_fraction, safe_log_weights
from dllm_ais.samplers.diffusion import diffusion_sample


def _ess(ell: torch.Tensor, cap: float = 2.0) -> float:
    valid = torch.ones_like(ell, dtype=torch.bool)
    return float(ess_fraction(safe_log_weights(ell.double(), valid, 20.0).exp().clamp(max=cap), valid))


def _sft_model(preset, work: Path):
    """The preset's seed-0 SFT model (its warm-up, run as a 1-step training run) and the run's tokenizer/chat flag."""
    from dllm_ais.train.job import run_training

    trainer = run_training(replace(preset, train=replace(preset.train, steps=1, rollout_precision="bf16")), work,
                           progress=False)
    from dllm_ais.families import get_family as family

    model = family("llada").load_dir(work / "sft", dtype=torch.float32, device="cpu").eval()
    return model, trainer.policy.tokenizer, trainer.policy.use_chat_template


def _trained_model(run: Path):
    """The latest checkpoint of a training run directory (model, tokenizer, chat template on)."""
    from dllm_ais.families import get_family as family
    from dllm_ais.models.load import load_tokenizer
    from dllm_ais.train.run_dir import RunDir

    ckpt = RunDir(run).latest() / "model"
    model = family("llada").load_dir(ckpt, dtype=torch.float32, device="cpu").eval()
    tok = load_tokenizer(ckpt, model.config)
    tok.padding_side = "left"
    return model, tok, True


def _copies(model):
    from dllm_ais.fp4.linear import quantize_model as fp4
    from dllm_ais.fp8.quantize import quantize_model as fp8

    return {"fp8": fp8(model, backend="torch"), "mxfp4": fp4(model, fmt="mxfp4")}


@torch.no_grad()
def measure(model, mu, ids, mask, cfg, stops, seed: int, group: int) -> dict:
    from dllm_ais.rl.rollout_stats import commit_stats

    mask_id = model.config.mask_token_id
    rollout = diffusion_sample(mu, ids, mask, cfg, mask_id, stops, generator=torch.Generator().manual_seed(seed),
                               record_selection=True)
    plan = replay_plan(rollout.commit_step, rollout.completion_mask)
    out = {"nfe": rollout.nfe, **commit_stats(rollout.commit_step, rollout.completion_mask, rollout.completion_ids,
                                              group, rollout.commit_confidence)}
    for replay in ("uncached", "cached"):
        old_cfg = replace(cfg, cache="none") if replay == "uncached" else cfg
        ells = {}
        for selection in (False, True):
            old = policy_token_logp(model, rollout, plan, old_cfg, mask_token_id=mask_id, selection=selection)
            ell = (old.double() - rollout_token_logp(rollout, plan, selection).double()).sum(-1)  # [B]
            ells[selection] = ell
            res = {"std_ell": float(ell.std()), "mean_ell": float(ell.mean()), "ess": _ess(ell),
                   "max_abs_ell": float(ell.abs().max())}
            if selection:  # a path π_old could not have taken: a selection term at the floor
                res["infeasible"] = float((old.double() <= LOG_ZERO / 2).any(-1).float().mean())
                res["std_selection_part"] = float((ell - ells[False]).std())
            out[f"{replay} pi_old, selection {'on' if selection else 'off'}"] = res
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/trajectory/selection.json")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--presets", default="tiny-cpu,study-cpu-16")
    ap.add_argument("--trained", default=None, metavar="PRESET=RUN_DIR",
                    help="also measure a trained model: a run directory of PRESET (its latest checkpoint)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    load = os.getloadavg()
    from dllm_ais.tasks.registry import get_task
    from dllm_ais.train.job import task_config_kwargs

    results = {}
    models = [(name, None) for name in args.presets.split(",") if name]
    if args.trained:
        models.append(tuple(args.trained.split("=", 1)))
    for name, run in models:
        preset = get_preset(name)
        fast = replace(preset.sampler, cache="dual", threshold=0.9)
        if run is None:
            with tempfile.TemporaryDirectory() as tmp:
                model, tok, chat = _sft_model(preset, Path(tmp) / "run")
        else:
            model, tok, chat = _trained_model(Path(run))
            name = f"{name} trained ({run})"
        task = get_task(preset.train.task)
        rows = task.load("test", seed=0, limit=args.prompts, **task_config_kwargs(task.load, preset.train.task_config))
        prompts = [r["prompt"] for r in rows for _ in range(preset.grpo.num_generations)]
        ids, mask = encode_prompts(tok, prompts, chat=chat, device="cpu")
        stops = [tok.eos_token_id]
        for prec, mu in _copies(model).items():
            res = measure(model, mu, ids, mask, fast, stops, seed=0, group=preset.grpo.num_generations)
            results[f"{name} | {prec}-fast"] = res
            print(name, prec, json.dumps(res))
    doc = {"machine": f"CPU, 1 torch thread, load average at start {load}, end {os.getloadavg()}",
           "wall_s": time.time() - t0, "prompts": args.prompts,
           "setup": "seed-0 SFT model of each preset; rollouts: dual cache, threshold 0.9, preset temperature; "
                    "prompts: the task's test split × G", "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(doc, indent=2) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
