"""``arith``: tiny addition problems a ~0.4M-parameter character-level diffusion model learns on CPU in minutes.

Rows: ``prompt`` like ``"12+7="`` (no instruction, no chat template; at most 6 characters with the default
``max_operand=99``), ``answer`` like ``"19"`` (at most 3 characters), and the operands ``a``, ``b``. Data: seeded
generator (default; train/test are disjoint sets of problems) or a local jsonl/parquet file with ``a`` and ``b``.
``sft_pairs(n, seed)`` gives (prompt, completion) pairs from the train split for a supervised warm-up.

Reward: strip leading whitespace, read the leading run of digits (optionally signed) and stop at the first other
character; 1.0 when that text equals the gold ``answer`` exactly (``"019"`` does not match ``"19"``), else 0.0
(no leading digits, e.g. an empty or ``"abc"`` completion, scores 0.0). No partial credit: the reward is accuracy.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Task, check_aligned, completion_text
from .loading import check_limit, read_rows, require
from .procedural import generate_rows, sft_pairs_from, split_of

NAME = "arith"
DEFAULT_SIZE = {"train": 2_000, "test": 200}
_LEADING_INTEGER = re.compile(r"\s*([+-]?\d+)")


@dataclass(frozen=True)
class ArithConfig:
    """Operand range of the generated problems."""

    max_operand: int = 99
    """Operands are drawn uniformly from ``0..max_operand`` (99: single- and double-digit addition)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_operand <= 9_999:
            raise ValueError(f"max_operand must be in 1..9999 (prompts stay <= 10 chars), got {self.max_operand}")


def build_prompt(row: dict[str, Any]) -> str:
    """``"a+b="``: the whole prompt."""
    return f"{row['a']}+{row['b']}="


def random_problem(rng: random.Random, config: ArithConfig = ArithConfig()) -> dict[str, Any]:
    """One problem ``{a, b, answer}``."""
    a, b = rng.randint(0, config.max_operand), rng.randint(0, config.max_operand)
    return {"a": a, "b": b, "answer": str(a + b)}


def load(
    split: str = "train",
    data_path: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    config: ArithConfig = ArithConfig(),
) -> list[dict]:
    """Distinct generated problems (``limit`` defaults to ``DEFAULT_SIZE[split]``) or rows from a local file."""
    if data_path is None:
        default = DEFAULT_SIZE.get(split, 0)
        if (config.max_operand + 1) ** 2 < 10 * default:  # a small problem space may hold fewer distinct problems
            default = min(default, split_size(split, config))
        n = check_limit(limit, default)
        rows = generate_rows(NAME, lambda rng: random_problem(rng, config), build_prompt, n, split, seed)
    else:
        rows = []
        for i, raw in enumerate(read_rows(split, data_path, data_path, None, limit)):
            a, b = int(require(raw, i, "a", data_path)), int(require(raw, i, "b", data_path))
            rows.append({"a": a, "b": b, "answer": str(a + b)})
    return [{"prompt": build_prompt(row), **row} for row in rows]


def split_size(split: str, config: ArithConfig = ArithConfig()) -> int:
    """Number of distinct problems in `split` (small operand ranges hold fewer than DEFAULT_SIZE)."""
    m = config.max_operand
    return sum(split_of(f"{a}+{b}=") == split for a in range(m + 1) for b in range(m + 1))


def sft_pairs(n: int, seed: int = 0, config: ArithConfig = ArithConfig()) -> list[tuple[str, str]]:
    """``n`` (prompt, completion) pairs from the train split for supervised warm-up (drawn with replacement)."""
    return sft_pairs_from(NAME, n, seed, lambda rng: random_problem(rng, config), build_prompt)


def score(text: str, answer: str) -> float:
    """1.0 when the leading integer of ``text`` is exactly ``answer``, else 0.0."""
    match = _LEADING_INTEGER.match(text)
    return 1.0 if match is not None and match.group(1) == str(answer).strip() else 0.0


def reward(prompts: Sequence[Any], completions: Sequence[Any], *, answer: Sequence[str], **_: Any) -> list[float]:
    """TRL reward: ``score`` per completion (exact match of the leading integer)."""
    check_aligned(completions, answer=answer)
    return [score(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]


TASK = Task(
    name=NAME,
    load=load,
    reward=reward,
    build_prompt=build_prompt,
    answer_columns=("answer",),
    use_chat_template=False,
    description="Tiny built-in addition task ('12+7=' -> '19') for CPU models and tests",
)
