"""Test setup. TRITON_INTERPRET must be set before any Triton kernel module is imported (DESIGN.md §7).

Tests use tiny models, where torch's intra-op threads only add synchronisation cost (and on a loaded 2-core machine
make each op many times slower), so the suite runs single-threaded.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)
