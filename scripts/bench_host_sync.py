"""Host time of one weight sync (BF16 master -> fused FP8 rollout copy) at LLaDA-8B shapes, device work stubbed, old
per-tensor sync vs the one-pass sync (fp8/fused_sync.py), interleaved; plus the sync's fair device floor in bytes.

Stubs: master and rollout live on the `meta` device (no memory, no math); Triton launches return at once (the caller,
scripts/bench_host_dispatch.py, replaces triton's JITFunction.run). The old path is timed as it runs on a GPU: each
master weight through kernels.quantize_weight(w, out=...) (its checks + one launch), each other tensor by copy_, and
both name maps rebuilt per call. The new path: SyncPlan.run — one torch._foreach_copy_ and one grouped launch.

    python scripts/bench_host_dispatch.py --sync ...   (this module is its --sync part)
"""

from __future__ import annotations

import statistics
import time

import torch

from dllm_ais.fp8 import fused_sync, linear
from dllm_ais.models.llada.fused_fp8 import FusedLLaDA, sync_fused_llada, sync_per_tensor
from dllm_ais.models.llada.model import LLaDAConfig, LLaDAModelLM


def fair_floor_bytes(config: LLaDAConfig) -> dict:
    """Bytes a sync must move at least: every block weight read in bf16 (2 B) and written as e4m3 (1 B) + its fp32
    scale per 128×128 block; the embedding and LM head read and written in bf16 (4 B per element); norms ignored."""
    d, h, n_layers, vocab = config.d_model, config.mlp_hidden_size, config.n_layers, config.embedding_size
    block_params = n_layers * (4 * d * d + 3 * d * h)
    weights = block_params * 3 + block_params // (128 * 128) * 4
    table = 2 * vocab * d * 4  # embedding + LM head
    return {"block_params": block_params, "weight_bytes": weights, "embedding_head_bytes": table,
            "total_bytes": weights + table}  # fmt: skip


def _old_quantize_into(w, q, s):
    """The per-tensor sync's GPU path (linear._quantize_block_into on CUDA): the Triton kernel, one launch."""
    from dllm_ais.fp8 import kernels

    kernels.quantize_weight(w, out=(q, s))


def sync_bench(rounds: int, calls: int = 3, n_layers: int = 32) -> dict:
    config = LLaDAConfig(d_model=4096, n_heads=32, n_layers=n_layers, mlp_hidden_size=12288, vocab_size=126464,
                         embedding_size=126464)  # fmt: skip
    with torch.device("meta"):
        master = LLaDAModelLM(config).to(torch.bfloat16)
    rollout = FusedLLaDA(config, "triton", torch.device("meta"), torch.bfloat16)
    linear.QUANTIZE_INTO["block"] = _old_quantize_into  # meta tensors are not CUDA: force the GPU path's calls
    fused_sync.GROUPED_DEVICES.add("meta")
    fused_sync._PLANS.pop(rollout, None)
    variants = {"per_tensor (old)": lambda: sync_per_tensor(master, rollout),
                "one_pass (new)": lambda: sync_fused_llada(master, rollout)}  # fmt: skip
    t0 = time.perf_counter()
    variants["one_pass (new)"]()  # the first call builds the plan
    plan_build_us = (time.perf_counter() - t0) * 1e6
    groups = fused_sync._PLANS[rollout].groups
    launches = sum(1 for g, _ in groups if g is not None)
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        variants["per_tensor (old)"]()
        for r in range(rounds):
            for name in variants if r % 2 == 0 else reversed(list(variants)):
                t0 = time.perf_counter()
                for _ in range(calls):
                    variants[name]()
                per_round[name].append((time.perf_counter() - t0) / calls * 1e6)
    old = per_round["per_tensor (old)"]
    floor = fair_floor_bytes(config)
    return {
        "n_layers": n_layers,
        "us_per_sync": {name: {"median_us": statistics.median(v), "min_us": min(v)} for name, v in per_round.items()},
        "new_over_old_median_of_rounds": statistics.median(n / o for n, o in zip(per_round["one_pass (new)"], old,
                                                                                   strict=True)),  # fmt: skip
        "first_sync_with_plan_build_us": plan_build_us,
        "launches_new": {"grouped_quant": launches, "foreach_copy_lists": 1},
        "launches_old": {"quantize_weight": 7 * n_layers, "copy_": 3 + 2 * n_layers},
        "fair_floor": floor | {f"ms_at_{k}": floor["total_bytes"] / (bw * 1e12) * 1e3
                               for k, bw in {"2.97TB/s (H100 copy, DESIGN §7)": 2.97,
                                             "4.18TB/s (H200 copy, issue 33)": 4.18}.items()},  # fmt: skip
    }
