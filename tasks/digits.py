"""``digits``: transform a short digit string (shift, reverse, sort) — a large problem space with a shaped reward.

Made for the tiny (~0.4M-parameter, character-level) LLaDA on CPU: a weak SFT warm-up teaches part of the structure
and RL has a dense signal to climb, and with ``length=4`` the 10,000 strings split into about 9,000 train and 1,032
held-out problems (``procedural.split_of`` on the prompt), enough to see 5-point accuracy differences; the model
cannot memorise its way to the test split.

Rows: ``prompt`` like ``"3817>"`` (the digits, then ``>``; no instruction; the policy wraps it in the tokenizer's
chat template as one user turn, so TRL-style rewards get conversational completions), ``answer`` like
``"4928"`` (``op="shift"``: each digit + 1, 9 -> 0), ``"7183"`` (``op="reverse"``) or ``"1378"`` (``op="sort"``),
and ``digits`` (the input string). Leading zeros are part of the string (``"0042>"`` reverses to ``"2400"``).
Data: seeded generator (default) or a local jsonl/parquet file with a ``digits`` column. ``sft_pairs(n, seed)``
gives (prompt, completion) pairs from the train split.

Reward (shaped, partial credit): strip leading whitespace, read the leading run of digits ``d``; the score is the
number of positions ``i < len(answer)`` with ``d[i] == answer[i]``, divided by ``max(len(answer), len(d))`` (extra
digits cost credit: four right digits and a fifth one score 0.8). It is 1.0 exactly when ``d == answer``;
``accuracy`` is that strict 0/1 metric (evaluation's ``full_reward_frac``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Task, check_aligned, completion_text
from .loading import check_limit, read_rows, require
from .procedural import generate_rows, sft_pairs_from

NAME = "digits"
DEFAULT_SIZE = {"train": 5_000, "test": 1_000}
OPS = ("reverse", "sort", "shift")
_LEADING_DIGITS = re.compile(r"\s*(\d*)")


@dataclass(frozen=True)
class DigitsConfig:
    """Which transform and how long the digit strings are."""

    op: str = "reverse"
    """The transform: ``reverse`` (read the string backwards), ``sort`` (digits in ascending order) or ``shift``
    (each digit plus one, 9 -> 0: position i of the answer depends on position i of the prompt only)."""
    length: int = 4
    """Digits per problem (4: 10,000 strings, ~1,030 of them held out; the completion needs ``length`` tokens and
    EOS; the ``study-cpu`` testbed uses 12, ``study-cpu-16`` 16 and ``study-cpu-32`` 32: the sequence-level mismatch
    grows with the length)."""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"DigitsConfig.op={self.op!r}: use one of {', '.join(OPS)}")
        if not 2 <= self.length <= 32:
            raise ValueError(f"DigitsConfig.length must be in 2..32 (short strings for tiny models), got {self.length}")


def transform(digits: str, op: str) -> str:
    """The gold answer for ``digits`` under ``op``."""
    if op == "reverse":
        return digits[::-1]
    if op == "sort":
        return "".join(sorted(digits))
    return "".join(str((int(d) + 1) % 10) for d in digits)


def build_prompt(row: dict[str, Any]) -> str:
    """``"<digits>>"``: the whole prompt."""
    return f"{row['digits']}>"


def random_problem(rng: random.Random, config: DigitsConfig = DigitsConfig()) -> dict[str, Any]:
    """One problem ``{digits, answer}``."""
    digits = "".join(rng.choice("0123456789") for _ in range(config.length))
    return {"digits": digits, "answer": transform(digits, config.op)}


def load(
    split: str = "train",
    data_path: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    config: DigitsConfig = DigitsConfig(),
) -> list[dict]:
    """Distinct generated problems (``limit`` defaults to ``DEFAULT_SIZE[split]``) or rows from a local file."""
    if data_path is None:
        n = check_limit(limit, DEFAULT_SIZE.get(split, 0))
        rows = generate_rows(NAME, lambda rng: random_problem(rng, config), build_prompt, n, split, seed)
    else:
        rows = []
        for i, raw in enumerate(read_rows(split, data_path, data_path, None, limit)):
            digits = str(require(raw, i, "digits", data_path))
            if not digits.isdigit():
                raise ValueError(f"{data_path}: row {i} has digits={digits!r}; expected a string of 0-9")
            rows.append({"digits": digits, "answer": transform(digits, config.op)})
    return [{"prompt": build_prompt(row), **row} for row in rows]


def sft_pairs(n: int, seed: int = 0, config: DigitsConfig = DigitsConfig()) -> list[tuple[str, str]]:
    """``n`` (prompt, completion) pairs from the train split for supervised warm-up (drawn with replacement)."""
    return sft_pairs_from(NAME, n, seed, lambda rng: random_problem(rng, config), build_prompt)


def score(text: str, answer: str) -> float:
    """Share of ``answer``'s positions matched by the leading digits of ``text`` (over the longer of the two)."""
    answer = str(answer).strip()
    got = _LEADING_DIGITS.match(text).group(1)
    if not answer or not got:
        return 0.0
    hits = sum(g == a for g, a in zip(got, answer, strict=False))  # got may be shorter or longer
    return hits / max(len(answer), len(got))


def reward(prompts: Sequence[Any], completions: Sequence[Any], *, answer: Sequence[str], **_: Any) -> list[float]:
    """TRL reward: ``score`` per completion (partial credit per digit)."""
    check_aligned(completions, answer=answer)
    return [score(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]


def accuracy(prompts: Sequence[Any], completions: Sequence[Any], *, answer: Sequence[str], **_: Any) -> list[float]:
    """Strict metric, same signature: 1.0 when the leading digits equal ``answer`` exactly, else 0.0."""
    return [float(r == 1.0) for r in reward(prompts, completions, answer=answer)]


TASK = Task(
    name=NAME,
    load=load,
    reward=reward,
    build_prompt=build_prompt,
    answer_columns=("answer",),
    use_chat_template=True,
    description="Tiny built-in digit-string task (shift: '3817>' -> '4928'; reverse, sort), partial credit per "
    "digit, for CPU models",
)
