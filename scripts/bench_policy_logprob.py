"""Forward rows of a whole RL step by phase for the one-step and the trajectory policy likelihood, counted on the tiny
CPU run, and the same arithmetic for LLaDA-8B at gen 256 (μ = 12 inner iterations, K = 8 replayed steps).

    python scripts/bench_policy_logprob.py [--out benchmarks/trajectory/forward_rows.json] [--steps 6]

Counting: every LLaDAModelLM / FusedLLaDA (the FP8 rollout copy) forward is charged to the phase the trainer is in
(rollout, π_old, mismatch, reference, update) as calls, canvas rows, and tokens fed (rows × window length: a cached
window forward feeds the block only); forwards that autograd runs during backward (activation-checkpoint
recomputation) are counted apart, and tokens fed under autograd outside backward are the ones backpropagated. Cost
in "token-forwards" = tokens fed + recomputed + 2 × backpropagated (a backward ≈ 2 forwards; GEMM-bound: the 8B
regime, not the tiny model's wall time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from dllm_ais.atomic import atomic_write_text

PHASES = ("rollout", "pi_old", "mismatch", "reference", "update")


class Counter:
    """Per-phase forward counts (the phase is set by the wrapped trainer methods)."""

    def __init__(self):
        self.phase = "other"
        self.rows: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def at(self, phase: str):
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def record(self, input_ids: torch.Tensor) -> None:
        in_backward = torch._C._current_graph_task_id() != -1
        row = self.rows.setdefault(self.phase, dict(calls=0, rows=0, tokens=0, recomputed=0, backpropagated=0))
        n = int(input_ids.numel())
        row["calls"] += 1
        row["rows"] += int(input_ids.shape[0])
        if in_backward:
            row["recomputed"] += n
        else:
            row["tokens"] += n
            if torch.is_grad_enabled():
                row["backpropagated"] += n


def count_run(preset, work: Path, steps: int) -> dict:
    """Train `preset` (SFT + `steps` RL steps) with every forward counted; per-phase counts per RL step."""
    from dllm_ais.models.llada.fused_fp8 import FusedLLaDA
    from dllm_ais.models.llada.model import LLaDAModelLM
    from dllm_ais.train import trainer as trainer_module
    from dllm_ais.train.backend import DiffusionBackend
    from dllm_ais.train.job import run_training

    counter = Counter()
    patches = []

    def wrap(owner, name, phase):
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            with counter.at(phase):
                return real(*args, **kwargs)

        patches.append((owner, name, real))
        setattr(owner, name, wrapped)

    for cls in (LLaDAModelLM, FusedLLaDA):  # the BF16 master and the fused FP8 rollout copy
        def forward(self, input_ids, *args, _real=cls.forward, **kwargs):
            counter.record(input_ids)
            return _real(self, input_ids, *args, **kwargs)

        patches.append((cls, "forward", cls.forward))
        cls.forward = forward
    wrap(DiffusionBackend, "sample", "rollout")
    for name, phase in (("_old_logp", "pi_old"), ("_correction", "mismatch"), ("_ref_logp", "reference"),
                        ("_update", "update")):
        wrap(trainer_module.Trainer, name, phase)
    try:
        run_training(replace(preset, train=replace(preset.train, steps=steps)), work, progress=False)
    finally:
        for owner, name, real in reversed(patches):
            setattr(owner, name, real)
    out = {}
    for phase in PHASES:
        r = counter.rows.get(phase, dict(calls=0, rows=0, tokens=0, recomputed=0, backpropagated=0))
        per = {k: v / steps for k, v in r.items()}
        per["cost"] = per["tokens"] + per["recomputed"] + 2 * per["backpropagated"]
        out[phase] = per
    out["total_cost"] = sum(out[p]["cost"] for p in PHASES)
    return out


def llada_8b(prompt: int, nfe_fast: int, gen: int = 256, block: int = 32, steps: int = 128, iterations: int = 12,
             K: int = 8, elbo_draws: int = 2) -> dict:
    """Token-forwards per sequence of one RL step of LLaDA-8B (arithmetic, GEMM-bound; attention over the canvas and
    the LM head's share ignored). nfe_fast: forwards of the fast rollout (dual cache, threshold); its gen/block blocks
    each open with a full refresh forward, the rest feed one block."""
    T, blocks = prompt + gen, gen // block
    exact_rollout = steps * T
    fast_rollout = blocks * T + (nfe_fast - blocks) * block
    hit = blocks * (1 - (1 - 1 / blocks) ** K)  # expected distinct blocks among K steps (one refresh each)
    replay_k = hit * T + K * block  # π_old of K replayed steps with the dual cache (refreshes + windows)
    replay_1 = T + block

    def one_step(rollout, mismatch):
        return {"rollout": rollout, "pi_old": iterations * T, "mismatch": mismatch, "update": iterations * 3 * T}

    def trajectory(rollout, replay, per_iteration):
        return {"rollout": rollout, "pi_old": replay, "mismatch": 0.0, "update": iterations * 4 * per_iteration}

    rows = {
        "one_step, exact sampler (d1: 128 steps, ELBO mismatch K=2)": one_step(exact_rollout, 2 * elbo_draws * T),
        "one_step, fast sampler (trajectory mismatch, K=8 uncached π_old replays)": one_step(fast_rollout, K * T),
        f"trajectory K={K}, fast sampler (each iteration replays the K steps)": trajectory(fast_rollout, replay_k,
                                                                                          replay_k),
        "trajectory K=1, fast sampler (--trajectory-steps 1)": trajectory(fast_rollout, replay_1, replay_1),
    }
    for r in rows.values():
        r["total"] = sum(r.values())
    base = rows["one_step, exact sampler (d1: 128 steps, ELBO mismatch K=2)"]["total"]
    for r in rows.values():
        r["vs_exact_one_step"] = r["total"] / base
    return {"prompt": prompt, "gen": gen, "nfe_fast": nfe_fast, "iterations": iterations, "K": K, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/trajectory/forward_rows.json")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)
    import tempfile

    from dllm_ais.presets import get_preset

    torch.set_num_threads(1)
    p = get_preset("tiny-cpu")
    fast = replace(p, sampler=replace(p.sampler, cache="dual", threshold=0.9),
                   train=replace(p.train, mismatch_estimator="trajectory"))
    variants = {"one_step": fast,
                "trajectory": replace(fast, train=replace(fast.train, policy_logprob="trajectory")),
                "trajectory K=1": replace(fast, train=replace(fast.train, policy_logprob="trajectory",
                                                              trajectory_steps=1))}
    load = os.getloadavg()
    tiny = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, preset in variants.items():
            tiny[name] = count_run(preset, Path(tmp) / name.replace(" ", "_").replace("=", ""), args.steps)
            print(name, json.dumps({k: (round(v["cost"]) if isinstance(v, dict) else round(v))
                                    for k, v in tiny[name].items()}))
    estimates = [llada_8b(prompt, nfe) for prompt in (200,) for nfe in (32, 64)]
    for e in estimates:
        print(f"LLaDA-8B, prompt {e['prompt']}, fast NFE {e['nfe_fast']}:")
        for name, r in e["rows"].items():
            print(f"  {name}: total {r['total'] / 1e3:.1f}k token-forwards ({r['vs_exact_one_step']:.2f}x)")
    doc = {"tiny_cpu": {"setting": "tiny-cpu preset (SFT 35), --cache dual --threshold 0.9 --rollout-precision fp8 "
                                   "--mismatch-estimator trajectory; per RL step, mean over the first "
                                   f"{args.steps} steps", "load_average": load, "per_step": tiny},
           "llada_8b": estimates}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(doc, indent=2) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
