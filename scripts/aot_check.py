"""Compile every FP8 Triton kernel and GEMM autotune config for sm_90 ahead of time and print what each costs.

    python scripts/aot_check.py            # table: registers, spill bytes, shared memory, pipelining, wgmma
    python scripts/aot_check.py --json F   # also write the rows as JSON

Needs no GPU: triton's bundled ptxas and cuobjdump do the work (dllm_ais/fp8/aot.py). tests/test_aot_sm90.py asserts
the same facts in CI.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON to FILE")
    args = parser.parse_args(argv)
    import triton

    from dllm_ais.fp8 import aot

    reason = aot.nvidia_unavailable()
    if reason is not None:
        print(f"aot_check: cannot compile for sm_90 here: {reason}", file=sys.stderr)
        return 2
    reports = aot.reports("producers") + aot.reports("gemm")
    print(f"triton {triton.__version__}, target sm_90, LLaDA-8B shapes {aot.LLADA_8B}")
    print(aot.report_table(reports))
    if args.json:
        from pathlib import Path

        from dllm_ais.atomic import atomic_write_text

        atomic_write_text(Path(args.json), json.dumps({"triton": triton.__version__, "target": "sm_90",
                                                       "shapes": aot.LLADA_8B, "kernels": aot.as_json(reports)},
                                                      indent=1))
    spills = [r.kernel for r in reports if r.spill_bytes]
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
