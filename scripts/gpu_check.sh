#!/usr/bin/env bash
# GPU session entry point: install the project into the device image's Python (DESIGN.md §7: the image already has
# torch, triton, transformers, accelerate, peft, …; --no-deps so pip never replaces its CUDA torch), then run
# scripts/gpu_check.py with the given arguments (tests on CUDA + every GPU benchmark + summary; see its --help).
# One call, every headline figure in under 7 minutes (scripts/gpu_quick.py; its --help lists the parts):
#   bash scripts/gpu_check.sh --quick
#   bash scripts/gpu_check.sh --quick --device cpu --tiny   # CPU dry run of the same path (CI runs it)
# For longer budgets, the staged check:
# One stage per 10-minute device call (each stage < 9 minutes; summary.json is updated when each stage ends):
#   bash scripts/gpu_check.sh --stage tests
#   bash scripts/gpu_check.sh --stage gemm sync          # (both fit one call)
#   bash scripts/gpu_check.sh --stage rollout-eager
#   bash scripts/gpu_check.sh --stage rollout-compiled
#   bash scripts/gpu_check.sh --stage rl_step
#   bash scripts/gpu_check.sh --stage ar_decode
#   GPU_CHECK_SKIP_INSTALL=1 bash scripts/gpu_check.sh --stage summary
#   bash scripts/gpu_check.sh --dry-run                  # CPU: prints every stage's commands, writes a null summary
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [ -z "${GPU_CHECK_SKIP_INSTALL:-}" ]; then
  "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e .
fi
if [ "${1:-}" = "--quick" ]; then
  shift
  exec "$PYTHON" scripts/gpu_quick.py "$@"
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
