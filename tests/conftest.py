"""Test setup. TRITON_INTERPRET must be set before any Triton kernel module is imported (DESIGN.md §7)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
