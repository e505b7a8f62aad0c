"""Benchmark autoregressive decoding on a Qwen3-8B-shaped model against the HBM floor: BF16 vs FP8, eager vs CUDA graph.

  python scripts/bench_ar_decode.py --json OUT/ar_decode.json   # GPU: Qwen3-8B shape, random bf16 weights, batch 8, 32
  python scripts/bench_ar_decode.py --smoke                     # CPU, tiny shape, seconds (FP8: torch reference)

The master is a transformers Qwen3ForCausalLM with random weights (no download), built on the meta device and drawn
from an explicit generator on the target device; it stays resident during every measurement. Engines (--engines):
  static  the compact rollout copy (models/qwen/rollout.py: fused wqkv/gate-up, static KV cache) sampled by
          samplers/ar_static.py, BF16 (`rollout_copy(master)`) and FP8 (`rollout_copy(master, fp8_backend=b)` for each
          --backends entry), each in mode "eager" and, on CUDA, "graph" (the decode step replayed as a CUDA graph).
  hf      the transformers model with a DynamicCache (the pre-issue-14 path; `quantize_model` for FP8), mode "eager".
Each measurement samples at temperature 1 from random prompts of --prompt-len tokens with a stop id outside the
vocabulary, so every row decodes --new-tokens tokens:
  total_s       wall time of the whole call (prefill + all decode steps), median of --repeats (after one warm-up call
                that also captures the graph)
  prefill_s     the same call with max_new_tokens = 1 (prefill + one sampling step)
  tokens_per_s  batch · new_tokens / total_s;  step_s  (total_s − prefill_s) / (new_tokens − 1): one decode step
  floor_s       the HBM floor of one decode step: (weight bytes + KV bytes) / copy bandwidth (as in issue 14: 16.4 GB
                at 3.0 TB/s ≈ 5.5 ms for Qwen3-8B BF16), where weight bytes =
                every parameter and buffer of the measured model except the input-embedding table (only B rows of it
                are read; counted in full when tied to the head), KV bytes = K and V of the live context at the middle
                of the decode (prompt_len + new_tokens / 2 slots per row), and the copy bandwidth is measured here
                (copy_gbps: bytes read + written per second by `dst.copy_(src)` of a 1 GiB buffer; 64 MiB on CPU)
  step_vs_floor step_s / floor_s (1 = at the floor);  peak_mem_gib / model_gib  CUDA memory during / before the calls.
A backend that cannot run here is written as status "skipped" with the reason, a run that fails as status "failed"
with the error. No GPU and no --smoke: every measurement is written as skipped (nothing is estimated). One JSON line
per measurement is appended to --out; --json PATH also writes one summary object:
  ar_decode_bf16_vs_floor  step_s / floor_s of the static BF16 row at the key batch (8; else the largest measured)
  ar_decode_fp8_vs_bf16    tokens_per_s of the static FP8 row (first --backends entry that ran) / the BF16 row's
  (both from mode "graph" on CUDA, "eager" elsewhere; null with a reason when not measured), plus key_batch,
  ar_decode_mode, ar_decode_fp8_backend, device, git_sha, smoke and every row under "rows".
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from dllm_ais.analysis import bench_env
from dllm_ais.atomic import atomic_write_text
from dllm_ais.models.qwen.model import random_qwen
from dllm_ais.samplers.ar_common import ARSamplerConfig
from dllm_ais.samplers.autoregressive import ar_sample

REPO = Path(__file__).resolve().parent.parent
SHAPES = {  # Qwen3-8B (config.json of Qwen/Qwen3-8B) and a tiny stand-in for --smoke
    "full": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0),
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=128, max_position_embeddings=256, rope_theta=10000.0),
}
DEFAULTS = {  # batch sizes, prompt length, new tokens, FP8 backends, repeats, engines
    "full": dict(batch=[8, 32], prompt_len=128, new_tokens=256, backends=["triton", "scaled_mm"], repeats=3,
                 engines=["static"]),
    "smoke": dict(batch=[2, 4], prompt_len=8, new_tokens=8, backends=["torch"], repeats=1, engines=["static", "hf"]),
}
KEY_BATCH = 8
NO_GRAPH_REASON = "CUDA graphs need a CUDA device"


def qwen3_config(shape: dict):
    from transformers import Qwen3Config

    fields = {k: v for k, v in shape.items() if k != "rope_theta"}
    return Qwen3Config(**fields, rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]},
                       tie_word_embeddings=False, rms_norm_eps=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# the floor


def copy_bandwidth(device: torch.device, repeats: int = 10) -> float:
    """Bytes per second moved (read + written) by dst.copy_(src) on `device`."""
    n = 2**30 if device.type == "cuda" else 2**26
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    bench_env.sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    bench_env.sync(device)
    return 2 * n * repeats / (time.perf_counter() - t0)


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def step_weight_bytes(model, batch: int) -> int:
    """Bytes of weights one decode step reads: all parameters and buffers (each once), except that only `batch` rows
    of an untied input-embedding table are read."""
    embed = model.embed.weight if hasattr(model, "embed") else model.get_input_embeddings().weight
    head = getattr(model, "lm_head", None)
    tied = head is None or getattr(head, "weight", None) is embed
    seen: dict[int, torch.Tensor] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        seen.setdefault(id(t), t)
    total = sum(_bytes(t) for t in seen.values())
    if not tied:
        total -= _bytes(embed) - batch * embed.shape[1] * embed.element_size()
    return total


def step_kv_bytes(shape: dict, batch: int, context: float, dtype: torch.dtype) -> float:
    """K and V of `context` slots per row, all layers."""
    per_slot = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"]
    return batch * context * per_slot * torch.tensor([], dtype=dtype).element_size()


# ----------------------------------------------------------------------------------------------------------------------
# one measurement


def _sampler(engine: str, mode: str):
    """(model, ids, mask, config, stops, generator) -> Rollout for an engine and mode."""
    if engine == "hf":
        return lambda *a: ar_sample(*a, pad_token_id=0)
    from dllm_ais.samplers.ar_static import StaticDecodeConfig, static_ar_sample

    decode = StaticDecodeConfig(cuda_graph=mode == "graph", check_every=64)
    return lambda *a: static_ar_sample(*a, pad_token_id=0, engine=decode)


def _timed(sample, model, ids, mask, new_tokens: int, vocab: int, generator) -> float:
    cfg = ARSamplerConfig(max_new_tokens=new_tokens, temperature=1.0)
    bench_env.sync(ids.device)
    t0 = time.perf_counter()
    out = sample(model, ids, mask, cfg, (vocab,), generator)
    bench_env.sync(ids.device)
    seconds = time.perf_counter() - t0
    if out.num_steps != new_tokens or not out.completion_mask.all():
        raise RuntimeError(f"expected {new_tokens} decoded tokens per row, got num_steps={out.num_steps}")
    return seconds


def measure(sample, model, batch: int, args, shape: dict, bandwidth: float, device: torch.device) -> dict:
    """Timings, memory and the floor of one (model, engine, mode, batch); see the module docstring."""
    vocab, P, N = shape["vocab_size"], args.prompt_len, args.new_tokens
    g = torch.Generator(device=device).manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, P), generator=g, device=device)  # [B, P], no padding
    mask = torch.ones(batch, P, dtype=torch.bool, device=device)
    with bench_env.cuda_memory(device) as memory:
        _timed(sample, model, ids, mask, 1, vocab, g)  # warm-up (kernels, allocator)
        prefill = statistics.median(_timed(sample, model, ids, mask, 1, vocab, g) for _ in range(args.repeats))
        _timed(sample, model, ids, mask, N, vocab, g)  # warm-up; captures the graph
        total = statistics.median(_timed(sample, model, ids, mask, N, vocab, g) for _ in range(args.repeats))
    kv_dtype = model.dtype if hasattr(model, "dtype") else torch.bfloat16
    weight_bytes = step_weight_bytes(model, batch)
    kv_bytes = step_kv_bytes(shape, batch, P + N / 2, kv_dtype)
    floor = (weight_bytes + kv_bytes) / bandwidth  # issue 14's convention: bytes / the card's copy rate
    step = (total - prefill) / (N - 1) if N > 1 and total > prefill else None
    return {"total_s": total, "prefill_s": prefill, "tokens_per_s": batch * N / total, "step_s": step,
            "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "floor_s": floor,
            "step_vs_floor": step / floor if step else None, **memory}


# ----------------------------------------------------------------------------------------------------------------------
# the run


def _models(master, engines, backends, device):
    """Yield (engine, precision, backend, model or None, info) one at a time (each freed before the next is built)."""
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.qwen.rollout import rollout_copy

    builders = {"static": lambda b: rollout_copy(master, fp8_backend=b),
                "hf": lambda b: master if b is None else quantize_model(master, backend=b)}
    for engine in engines:
        for precision, backend in [("bf16", None)] + [("fp8", b) for b in backends]:
            reason = None if backend is None else bench_env.backend_reason(backend, device)
            if reason is not None:
                yield engine, precision, backend, None, {"status": "skipped", "reason": reason}
                continue
            try:
                bench_env.sync(device)
                t0 = time.perf_counter()
                model = builders[engine](backend)
                bench_env.sync(device)
                info = {"build_s": time.perf_counter() - t0}
            except Exception as e:  # a backend that fails to build is reported, not fatal
                reason = f"building the copy failed: {bench_env.error_reason(e)}"
                model, info = None, {"status": "failed", "reason": reason}
            yield engine, precision, backend, model, info
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()


def run(args, device: torch.device, size: str, emit) -> list[dict]:
    shape = SHAPES[size]
    rows: list[dict] = []

    def record(**fields) -> None:
        row = dict(shape=shape, prompt_len=args.prompt_len, new_tokens=args.new_tokens, **fields)
        rows.append(row)
        emit(**row)

    modes = {"static": ["eager", "graph"], "hf": ["eager"]}
    if device.type != "cuda" and not args.smoke:
        for engine in args.engines:
            for precision, backend in [("bf16", None)] + [("fp8", b) for b in args.backends]:
                for mode, batch in itertools.product(modes[engine], args.batch):
                    record(engine=engine, precision=precision, backend=backend, mode=mode, batch=batch,
                           status="skipped", reason=bench_env.NO_CUDA_REASON)
        return rows

    bandwidth = copy_bandwidth(device)
    master = random_qwen(qwen3_config(shape), seed=0, dtype=torch.bfloat16, device=device)
    for engine, precision, backend, model, info in _models(master, args.engines, args.backends, device):
        for mode, batch in itertools.product(modes[engine], args.batch):
            rec = dict(engine=engine, precision=precision, backend=backend, mode=mode, batch=batch,
                       copy_gbps=bandwidth / 1e9)
            if model is None:
                record(**rec, **info)
                continue
            if mode == "graph" and device.type != "cuda":
                record(**rec, status="skipped", reason=NO_GRAPH_REASON)
                continue
            try:
                row = measure(_sampler(engine, mode), model, batch, args, shape, bandwidth, device)
            except Exception as e:  # e.g. out of memory at batch 32: record it and go on
                record(**rec, status="failed", reason=bench_env.error_reason(e))
                continue
            record(**rec, **info, **row, status="ok")
        if model is not None and hasattr(model, "_static_decoder"):
            model._static_decoder = None  # drop the captured graph and its memory pool with the copy
    return rows


def summary(rows: list[dict], device: torch.device, backends: list[str]) -> dict:
    """The two headline ratios (see the module docstring), null with a reason when a needed row did not run."""
    mode = "graph" if device.type == "cuda" else "eager"
    ok = [r for r in rows if r.get("status") == "ok" and r["engine"] == "static" and r["mode"] == mode]
    batches = sorted({r["batch"] for r in ok})
    key_batch = KEY_BATCH if KEY_BATCH in batches else (batches[-1] if batches else KEY_BATCH)
    at = {(r["precision"], r["backend"]): r for r in ok if r["batch"] == key_batch}
    bf16 = at.get(("bf16", None))
    fp8_backend = next((b for b in backends if ("fp8", b) in at), None)
    out = {"key_batch": key_batch, "ar_decode_mode": mode, "ar_decode_fp8_backend": fp8_backend,
           "ar_decode_bf16_vs_floor": bf16["step_vs_floor"] if bf16 else None,
           "ar_decode_fp8_vs_bf16": at[("fp8", fp8_backend)]["tokens_per_s"] / bf16["tokens_per_s"]
           if bf16 and fp8_backend else None}
    if bf16 is None or fp8_backend is None:
        reasons = {r.get("reason") for r in rows if r.get("status") != "ok" and r.get("reason")}
        out["reason"] = "; ".join(sorted(reasons)) or f"no static {mode} rows at batch {key_batch}"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU, a few seconds")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "ar_decode.jsonl"), help="JSONL file to append to")
    parser.add_argument("--json", help="also write the summary object (headline ratios + rows) to this path")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 8 32; smoke 2 4)")
    parser.add_argument("--prompt-len", type=int, help="prompt tokens (default 128; smoke 8)")
    parser.add_argument("--new-tokens", type=int, help="tokens decoded per row (default 256; smoke 8)")
    parser.add_argument("--backends", nargs="+", help="FP8 backends (default triton scaled_mm; smoke torch)")
    parser.add_argument("--engines", nargs="+", choices=["static", "hf"],
                        help="static (compact copy, static cache) and/or hf (transformers DynamicCache); default "
                             "static; smoke both")
    parser.add_argument("--repeats", type=int, help="timed repeats, median (default 3; smoke 1)")
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "full"
    for key, value in DEFAULTS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2 (a decode step is timed as the difference to the 1-token call)")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    env = bench_env.environment(device, args.smoke, REPO, bench="ar_decode", libraries=("torch", "transformers"))
    with bench_env.jsonl_writer(args.out, env) as emit, torch.no_grad():
        rows = run(args, device, size, emit)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**summary(rows, device, args.backends), **env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
