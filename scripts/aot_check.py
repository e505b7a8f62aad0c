"""Compile every FP8 Triton kernel and GEMM autotune config ahead of time for sm_90 (no GPU needed) and print
registers / spill / shared memory (from the cubin) and pipelining / TMA / wgmma / vector width (from the PTX).

    python scripts/aot_check.py [--json]

Exit status 1 if a config spills or exceeds shared memory (the same facts tests/test_aot_sm90.py asserts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dllm_ais.fp8 import aot


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args()
    why = aot.unavailable()
    if why:
        print(f"cannot compile ahead of time: {why}", file=sys.stderr)
        return 2
    rows = aot.compile_table()
    print(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) if args.json else aot.format_table(rows))
    bad = [r for r in rows if r.spill or r.smem > aot.SMEM_LIMIT]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
