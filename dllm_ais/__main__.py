"""`python -m dllm_ais ...` is the `dllm-ais` command (the same parser and exit codes)."""

import sys

from dllm_ais.cli import main

if __name__ == "__main__":
    sys.exit(main())
