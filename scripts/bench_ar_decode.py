"""Benchmark autoregressive decoding (samplers/autoregressive.py) with BF16 vs FP8 linears on a Qwen3-8B-shaped model.

  python scripts/bench_ar_decode.py            # GPU: Qwen3-8B shape, random bf16 weights, batch 8 and 32
  python scripts/bench_ar_decode.py --smoke    # CPU, tiny shape, seconds (FP8 via the torch reference backend)

The model is a transformers Qwen3ForCausalLM with random weights (no download): built on the meta device, materialised
on the GPU, weights drawn from an explicit generator. Each measurement runs `ar_sample` at temperature 1 on random
prompts of --prompt-len tokens with a stop id outside the vocabulary, so every row decodes --new-tokens tokens:
  total_s        wall time of the whole call (prefill + all decode steps), median of --repeats
  prefill_s      wall time of the same call with max_new_tokens = 1 (prefill + one sampling step)
  tokens_per_s   batch · new_tokens / total_s;  decode_tokens_per_s  batch · (new_tokens − 1) / (total_s − prefill_s)
  peak_mem_gib   peak allocated GPU memory during the calls, with only the measured model resident (the BF16 master
                 waits on the CPU while its FP8 copy is measured); model_gib  memory allocated before the calls.
FP8 = `quantize_model(master, backend=...)` for each --backends entry; a backend that cannot run here is written as
status "skipped" with the reason, a run that fails as status "failed" with the error. No GPU and no --smoke: every
measurement is written as skipped (nothing is estimated). One JSON line per measurement is appended to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from dllm_ais import bench_env
from dllm_ais.models.qwen import random_qwen
from dllm_ais.samplers.autoregressive import ARSamplerConfig, ar_sample

REPO = Path(__file__).resolve().parent.parent
SHAPES = {  # Qwen3-8B (config.json of Qwen/Qwen3-8B) and a tiny stand-in for --smoke
    "full": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0),
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=128, max_position_embeddings=256, rope_theta=10000.0),
}
DEFAULTS = {  # batch sizes, prompt length, new tokens, FP8 backends, repeats
    "full": dict(batch=[8, 32], prompt_len=128, new_tokens=256, backends=["triton", "scaled_mm", "torchao"], repeats=1),
    "smoke": dict(batch=[2, 4], prompt_len=8, new_tokens=8, backends=["torch"], repeats=1),
}


def qwen3_config(shape: dict):
    from transformers import Qwen3Config

    fields = {k: v for k, v in shape.items() if k != "rope_theta"}
    return Qwen3Config(**fields, rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]},
                       tie_word_embeddings=False, rms_norm_eps=1e-6)


def _timed_sample(model, ids, mask, new_tokens: int, vocab: int, generator) -> float:
    cfg = ARSamplerConfig(max_new_tokens=new_tokens, temperature=1.0)
    bench_env.sync(ids.device)
    t0 = time.perf_counter()
    out = ar_sample(model, ids, mask, cfg, stop_token_ids=(vocab,), generator=generator, pad_token_id=0)
    bench_env.sync(ids.device)
    seconds = time.perf_counter() - t0
    if out.num_steps != new_tokens or not out.completion_mask.all():
        raise RuntimeError(f"expected {new_tokens} decoded tokens per row, got num_steps={out.num_steps}")
    return seconds


def measure(model, batch: int, prompt_len: int, new_tokens: int, repeats: int, device: torch.device) -> dict:
    """Timings and memory of ar_sample for one batch size (see the module docstring)."""
    vocab = model.config.vocab_size
    g = torch.Generator(device=device).manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g, device=device)  # [B, P], no padding
    mask = torch.ones(batch, prompt_len, dtype=torch.bool, device=device)
    _timed_sample(model, ids, mask, min(4, new_tokens), vocab, g)  # warm-up (kernels, allocator)
    with bench_env.cuda_memory(device) as memory:
        prefill = statistics.median(_timed_sample(model, ids, mask, 1, vocab, g) for _ in range(repeats))
        total = statistics.median(_timed_sample(model, ids, mask, new_tokens, vocab, g) for _ in range(repeats))
    return {"total_s": total, "prefill_s": prefill, "tokens_per_s": batch * new_tokens / total,
            "decode_tokens_per_s": batch * (new_tokens - 1) / (total - prefill) if total > prefill else None, **memory}


def run(args, device: torch.device, size: str, emit) -> None:
    shape = SHAPES[size]

    def record(precision: str, backend: str | None, batch: int) -> dict:
        return dict(shape=shape, batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                    precision=precision, backend=backend)

    if device.type != "cuda" and not args.smoke:
        for precision, backend in [("bf16", None)] + [("fp8", b) for b in args.backends]:
            for batch in args.batch:
                emit(**record(precision, backend, batch), status="skipped", reason=bench_env.NO_CUDA_REASON)
        return

    def measure_all(precision: str, backend: str | None, model, info: dict) -> None:
        for batch in args.batch:
            rec = record(precision, backend, batch)
            if model is None:
                emit(**rec, **info)  # skipped or failed, with the reason
                continue
            try:
                row = measure(model, batch, args.prompt_len, args.new_tokens, args.repeats, device)
            except Exception as e:  # e.g. out of memory at batch 32: record it and go on
                emit(**rec, status="failed", reason=bench_env.error_reason(e))
                continue
            emit(**rec, **row, status="ok")

    master = random_qwen(qwen3_config(shape), seed=0, dtype=torch.bfloat16, device=device)
    bench_env.for_each_precision(master, args.backends, device, measure_all)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU, a few seconds")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "ar_decode.jsonl"), help="JSONL file to append to")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 8 32; smoke 2 4)")
    parser.add_argument("--prompt-len", type=int, help="prompt tokens (default 128; smoke 8)")
    parser.add_argument("--new-tokens", type=int, help="tokens decoded per row (default 256; smoke 8)")
    parser.add_argument("--backends", nargs="+", help="FP8 backends (default triton scaled_mm torchao; smoke torch)")
    parser.add_argument("--repeats", type=int, help="timed repeats, median (default 1)")
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "full"
    for key, value in DEFAULTS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    env = bench_env.environment(device, args.smoke, REPO, bench="ar_decode", libraries=("torch", "transformers"))
    with bench_env.jsonl_writer(args.out, env) as emit, torch.no_grad():
        run(args, device, size, emit)


if __name__ == "__main__":
    main()
