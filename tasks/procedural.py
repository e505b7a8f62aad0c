"""Seeded procedural datasets with disjoint train/test splits.

Every generated item has a string key (e.g. the prompt). An item belongs to ``test`` when ``crc32(key) % 1000 <
TEST_PER_MILLE`` and to ``train`` otherwise, so the two splits never share an item whatever the seeds. Each split draws
from its own ``random.Random`` seeded with ``"<task>/<split>/<seed>"`` (string seeds are hashed with SHA-512 by
``random``, stable across processes); the global ``random`` state is never touched. Items are unique within a split.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any

from .base import SPLITS

TEST_PER_MILLE = 100
"""Share of the item space (in 1/1000) held out for the test split."""


def split_of(key: str) -> str:
    """``"test"`` or ``"train"``: the split an item with this key belongs to (a stable hash, not a draw)."""
    return "test" if zlib.crc32(key.encode()) % 1000 < TEST_PER_MILLE else "train"


def split_rng(task: str, split: str, seed: int) -> random.Random:
    """The private generator for one task, split and seed."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for procedural task {task!r}; choose one of {SPLITS}")
    return random.Random(f"{task}/{split}/{seed}")


def generate_rows(
    task: str,
    make_row: Callable[[random.Random], dict[str, Any]],
    key: Callable[[dict[str, Any]], str],
    n: int,
    split: str,
    seed: int,
    unique: bool = True,
) -> list[dict[str, Any]]:
    """``n`` rows from ``make_row(rng)`` that fall in ``split`` (unique by ``key`` unless ``unique=False``).

    Raises ``ValueError`` when the split's item space is too small for ``n`` distinct rows.
    """
    rng = split_rng(task, split, seed)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    max_draws = 50 * n + 1000
    for _ in range(max_draws):
        if len(rows) == n:
            break
        row = make_row(rng)
        k = key(row)
        if split_of(k) != split or (unique and k in seen):
            continue
        seen.add(k)
        rows.append(row)
    if len(rows) < n:
        raise ValueError(
            f"{task}: found only {len(rows)} distinct {split} items in {max_draws} draws for limit={n}; "
            "ask for fewer rows or widen the generator's config"
        )
    return rows


def sft_pairs_from(
    task: str,
    n: int,
    seed: int,
    draw: Callable[[random.Random], dict[str, Any]],
    build_prompt: Callable[[dict[str, Any]], str],
) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pairs of train-split problems for a supervised warm-up, drawn with replacement by
    ``draw(rng)`` (a row with an ``answer``) from the task's own "<task>-sft" stream."""
    rng = split_rng(f"{task}-sft", "train", seed)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n:
        row = draw(rng)
        prompt = build_prompt(row)
        if split_of(prompt) == "train":
            pairs.append((prompt, row["answer"]))
    return pairs
