"""Trajectory vs ELBO mismatch ratio on the tiny LLaDA (CPU): replay cost vs rollout, std ℓ and ESS, FP8 and FP4.

    python scripts/trajectory_vs_elbo.py [--out benchmarks/fast_rollouts/trajectory_vs_elbo.json]

The tiny model gets the tiny-cpu preset's SFT warm-up (digits, shift, 20 steps) so its confidences are those of the
CPU testbed; rollouts are digits prompts. Wall times are medians of 3 repeats, with the machine's load recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from dllm_ais.atomic import atomic_write_text
from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.ratio import coupled_log_ratio
from dllm_ais.likelihood.trajectory import replay_logprobs, replay_plan, trajectory_log_ratio
from dllm_ais.models.load import encode_prompts
from dllm_ais.models.tiny import tiny_model, tiny_tokenizer
from dllm_ais.presets import get_preset
from dllm_ais.rl.correction import ess_fraction, safe_log_weights
from dllm_ais.samplers.diffusion import diffusion_sample
from dllm_ais.tasks.digits import DigitsConfig, sft_pairs
from dllm_ais.train.sft import sft_loss, warm_up


def _median_s(fn, repeats: int = 3):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _ess(ell: torch.Tensor, cap: float = 2.0) -> float:
    """Normalised ESS of the truncated weights min(e^ℓ, C) (AIS's R, C = 2)."""
    valid = torch.ones_like(ell, dtype=torch.bool)
    return float(ess_fraction(safe_log_weights(ell.double(), valid, 20.0).exp().clamp(max=cap), valid))


def _copies(model):
    from dllm_ais.fp4.linear import quantize_model as fp4
    from dllm_ais.fp8.quantize import quantize_model as fp8

    return {"fp8": fp8(model, backend="torch"), "nvfp4": fp4(model, fmt="nvfp4"), "mxfp4": fp4(model, fmt="mxfp4")}


@torch.no_grad()
def measure(model, mu, ids, mask, cfg: SamplerConfig, stops, trajectory_steps: int | None, seed: int) -> dict:
    mask_id = model.config.mask_token_id
    t_roll, rollout = _median_s(lambda: diffusion_sample(mu, ids, mask, cfg, mask_id, stops,
                                                         generator=torch.Generator().manual_seed(seed)))
    plan = replay_plan(rollout.commit_step, rollout.completion_mask)
    kw = dict(temperature=cfg.temperature, mask_token_id=mask_id)
    t_old, _ = _median_s(lambda: replay_logprobs(model, rollout, plan, **kw))  # π_old only: what a recorded μ costs
    t_both, est = _median_s(lambda: trajectory_log_ratio(model, mu, rollout, **kw))
    out = {"rollout_s": t_roll, "replay_pi_old_s": t_old, "replay_both_s": t_both,
           "replay_pi_old_over_rollout": t_old / t_roll, "replay_both_over_rollout": t_both / t_roll,
           "canvases": est.num_canvases, "rollout_forward_rows": rollout.num_steps * ids.shape[0]}
    t_elbo, elbo = _median_s(lambda: coupled_log_ratio(model, mu, ids, mask, rollout.completion_ids,
                                                       rollout.completion_mask, num_draws=2, mask_token_id=mask_id,
                                                       generator=torch.Generator().manual_seed(seed + 1)))
    out["elbo_k2_s"] = t_elbo
    traj, el = est.log_ratio.double(), elbo.log_ratio.double()
    out.update({"std_ell_trajectory": float(traj.std()), "std_ell_elbo_k2": float(el.std()),
                "mean_ell_trajectory": float(traj.mean()), "mean_ell_elbo_k2": float(el.mean()),
                "ess_trajectory": _ess(traj), "ess_elbo_k2": _ess(el),
                "corr_trajectory_elbo": float(torch.corrcoef(torch.stack([traj, el]))[0, 1])})
    if trajectory_steps is not None:
        g = torch.Generator().manual_seed(seed + 2)
        rollout.logp_rollout = replay_logprobs(mu, rollout, plan, **kw)  # μ recorded once, as the sampler will
        t_sub, sub = _median_s(lambda: trajectory_log_ratio(model, None, rollout, num_steps=trajectory_steps,
                                                            generator=g, **kw))
        out.update({f"trajectory_steps_{trajectory_steps}": {
            "replay_s": t_sub, "replay_over_rollout": t_sub / t_roll, "canvases": sub.num_canvases,
            "std_ell": float(sub.log_ratio.double().std()), "ess": _ess(sub.log_ratio.double())}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/fast_rollouts/trajectory_vs_elbo.json")
    ap.add_argument("--prompts", type=int, default=64)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    preset = get_preset("tiny-cpu")
    tc = preset.train
    model, tok = tiny_model(seed=0), tiny_tokenizer()
    mask_id = model.config.mask_token_id
    options = DigitsConfig(**tc.task_config)
    pairs = sft_pairs(20_000, seed=tc.seed, config=options)
    warm_up(model, tok, pairs, tc.sft_steps, tc.sft_batch_size, tc.sft_learning_rate, preset.sampler.gen_length,
            lambda m, p, pm, c, g: sft_loss(m, p, pm, c, mask_id, g), tok.eos_token_id, tc.seed)
    model.eval()
    ids, mask = encode_prompts(tok, [p for p, _ in pairs[: args.prompts]], chat=False, device="cpu")
    stops = [tok.eos_token_id]
    long = SamplerConfig(gen_length=32, block_length=8, steps=32, temperature=1.0)
    settings = {"tiny-cpu (gen 5, 1 block, 5 steps, T 1)": (preset.sampler, None, stops),
                "gen 32, block 8, 32 steps, T 1": (long, 4, stops),
                # no stop token counts: every committed token is scored (the replay's worst case)
                "gen 32, block 8, 32 steps, T 1, all 32 tokens counted": (long, 4, [mask_id])}
    results = {}
    for name, (cfg, k, row_stops) in settings.items():
        for prec, mu in _copies(model).items():
            results[f"{name} | {prec}"] = measure(model, mu, ids, mask, cfg, row_stops, k, seed=0)
            print(name, prec, json.dumps({k2: v for k2, v in results[f'{name} | {prec}'].items()
                                          if not isinstance(v, dict)}))
    doc = {"machine": f"CPU, torch threads {torch.get_num_threads()}, load average {os.getloadavg()}",
           "model": "tiny LLaDA (d 128, 2 layers), tiny-cpu SFT warm-up (digits shift, 20 steps)",
           "prompts": args.prompts, "rollout": "samplers/diffusion.py, cache none, threshold None (sampler branch "
           "not merged: no recorded log mu, so replay_both replays the rollout copy too)",
           "elbo": "coupled MC-ELBO ratio, K = 2 (tiny-cpu's mismatch_num_draws)", "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(doc, indent=2) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
