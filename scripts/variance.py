"""Estimator-variance study (`dllm-ais variance`): std of the FP8/BF16 log-ratio vs forward passes per estimator.

Thin wrapper: the study lives in dllm_ais.analysis.variance_cli (so the installed `dllm-ais variance` has it too).
    python scripts/variance.py --smoke --out /tmp/v
"""

import sys

from dllm_ais.analysis.variance_cli import main

if __name__ == "__main__":
    sys.exit(main())
