"""Bytes moved by the non-GEMM, non-attention ops of ONE eager rollout layer, per rollout copy (fp8/traffic.py):
the fused BF16 copy and the FP8 copy on every backend as it runs on CUDA (Triton producers), counted on meta tensors
— no GPU needed. At ~3 TB/s (H100 HBM) 1 GB ≈ 0.33 ms per layer, × 32 layers per LLaDA-8B forward.

  python scripts/fp8_traffic.py [--json] [--batch 32 --seq 320] [--producers triton|torch]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # meta tensors only: the producer ops' interpreter registration

from dllm_ais.fp8 import traffic  # noqa: E402

BACKENDS = ["torch", "triton", "cublas", "torchao", "scaled_mm"]


def table(batch: int, seq: int, producers: str) -> dict:
    bf16 = traffic.layer_traffic(None, batch=batch, seq=seq)
    rows = {"bf16_fused": {"bytes": bf16.total, "vs_bf16": 1.0, "top_ops": dict(bf16.by_op.most_common(4))}}
    for backend in BACKENDS:
        c = traffic.layer_traffic(backend, producers=producers, batch=batch, seq=seq)
        rows[f"fp8_{backend}"] = {"bytes": c.total, "vs_bf16": round(c.total / bf16.total, 4),
                                  "top_ops": dict(c.by_op.most_common(4))}
    return {"shape": {"batch": batch, "seq": seq, **traffic.LLADA_8B}, "producers": producers, "layers": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=320)
    p.add_argument("--producers", default="triton", choices=["triton", "torch"],
                   help="triton: as on CUDA (default); torch: the CPU twins")
    args = p.parse_args()
    result = table(args.batch, args.seq, args.producers)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"one eager layer at [{args.batch}, {args.seq}], producers={args.producers}: non-GEMM, non-attention bytes")
    print(f"{'copy':<14}{'GB':>8}{'vs bf16':>9}  largest ops")
    for name, row in result["layers"].items():
        ops = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in row["top_ops"].items())
        print(f"{name:<14}{row['bytes'] / 1e9:>8.2f}{row['vs_bf16']:>9.2f}  {ops}")


if __name__ == "__main__":
    main()
