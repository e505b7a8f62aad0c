"""Helper for tests/test_preemption.py: the real `dllm-ais train` (dllm_ais.cli.main: its signal handlers, its
checkpoints and its exit status) on tiny-cpu shrunk to seconds (tests/dist_train_script.py's small_preset: 2 prompts
x 2 generations per process, a hash-of-the-text reward so that every step moves the weights).

Run as `python tests/preempt_train_script.py --out RUN [train flags]`, or under `accelerate launch` for several
processes. A new run gets `--preset tiny-preempt` (registered here); `--resume` reads the run's own config.json.
Each process writes its exit status to RUN/exit-rank{RANK}.txt (the launcher reports only that one failed) and, when
PREEMPT_PID_DIR is set, its pid to PREEMPT_PID_DIR/rank{RANK}.pid (so a test can signal one process of a launch).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PRESET = "tiny-preempt"


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from dist_train_script import small_preset

    from dllm_ais import cli
    from dllm_ais.presets import PRESETS

    rank = os.environ.get("RANK", "0")
    if os.environ.get("PREEMPT_PID_DIR"):
        (Path(os.environ["PREEMPT_PID_DIR"]) / f"rank{rank}.pid").write_text(str(os.getpid()))
    argv = sys.argv[1:]
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 4
    PRESETS[PRESET] = small_preset(steps=steps, sft_steps=2)
    preset_flag = [] if "--resume" in argv else ["--preset", PRESET]
    code = cli.main(["train", *preset_flag, "--threads", "1", "--no-progress", *argv])
    out = Path(argv[argv.index("--out") + 1])
    (out / f"exit-rank{rank}.txt").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
