"""MATH-500 (``HuggingFaceH4/MATH-500``, split ``test`` only): competition problems graded with ``math-verify``.

Rows: ``prompt``, ``problem``, ``answer`` (LaTeX, e.g. ``\\frac{1}{2}``), ``subject``, ``level``, ``unique_id``
(``None`` when the source lacks them).

Reward: the prediction is the last ``\\boxed{}`` inside the ``<answer>`` span (else the span's text, else the last
``\\boxed{}`` anywhere); no final answer -> 0.0. Gold (``$answer$``) and prediction are parsed and compared by
``math_verify`` (symbolic/numeric equivalence: ``\\boxed{0.5}`` matches ``\\frac{1}{2}``), imported lazily. This
module evaluates nothing itself; math-verify's own expression parsing goes through sympy (``parse_expr``) on strings
its extraction regexes have restricted to maths. In the main thread each parse/compare runs under math-verify's own
``signal.alarm`` timeout (``TIMEOUT_S``); in other threads signals are unavailable, so it runs without a timeout
(answers are capped at ``MAX_ANSWER_CHARS`` to bound the work). Any parse failure, timeout or error scores 0.0;
math-verify's log messages are not printed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .base import Task, check_aligned, completion_text
from .extract import answer_span, last_boxed
from .loading import read_rows, require

NAME = "math500"
HUB_NAME = "HuggingFaceH4/MATH-500"
TIMEOUT_S = 5
"""Seconds math-verify may spend on one parse or one comparison (main thread only)."""
MAX_ANSWER_CHARS = 1000
"""Longer final answers score 0 without being parsed."""
OPTIONAL_FIELDS = ("subject", "level", "unique_id")

INSTRUCTION = (
    "You are a math expert. Solve the problem step by step. Respond in the following format:\n"
    "<reasoning>\nYour step-by-step reasoning\n</reasoning>\n"
    "<answer>\n\\boxed{final answer in LaTeX}\n</answer>"
)


def build_prompt(row: dict[str, Any]) -> str:
    """Instruction followed by the problem."""
    return f"{INSTRUCTION}\n\n{row['problem'].strip()}"


def load(split: str = "test", data_path: str | None = None, limit: int | None = None, seed: int = 0) -> list[dict]:
    """MATH-500 rows from ``data_path`` (local jsonl/parquet or hub name) or the hub; ``seed`` is unused."""
    if data_path is None and split != "test":
        raise ValueError(f"{HUB_NAME} has only a 'test' split (asked for {split!r}); pass data_path for other data")
    source = data_path or HUB_NAME
    rows = []
    for i, raw in enumerate(read_rows(split, data_path, HUB_NAME, None, limit)):
        row = {"problem": require(raw, i, "problem", source), "answer": str(require(raw, i, "answer", source))}
        row.update({k: raw.get(k) for k in OPTIONAL_FIELDS})
        rows.append({"prompt": build_prompt(row), **row})
    return rows


def prediction_text(completion: str) -> str | None:
    """What math-verify parses: ``\\boxed{...}`` of the final box, else the ``<answer>`` span, else ``None``."""
    span = answer_span(completion)
    boxed = last_boxed(completion if span is None else span)
    if boxed is not None:
        return f"\\boxed{{{boxed}}}"
    return span or None


def reward(prompts: Sequence[Any], completions: Sequence[Any], *, answer: Sequence[str], **_: Any) -> list[float]:
    """1.0 when math-verify finds the completion's final answer equivalent to the gold ``answer``, else 0.0."""
    check_aligned(completions, answer=answer)
    return [_grade(str(gold), prediction_text(completion_text(c))) for c, gold in zip(completions, answer, strict=True)]


def _grade(gold: str, prediction: str | None) -> float:
    if prediction is None or len(prediction) > MAX_ANSWER_CHARS:
        return 0.0
    math_verify = _math_verify()
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = _parse_gold(gold, timeout)
        predicted = math_verify.parse(prediction, parsing_timeout=timeout)
        if not gold_parsed or not predicted:
            return 0.0
        return 1.0 if math_verify.verify(gold_parsed, predicted, timeout_seconds=timeout) else 0.0
    except Exception:  # math-verify raises on timeouts with raise_on_error and on odd inputs; a reward must not
        return 0.0


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None) -> list:
    """Parsed gold answer (cached: all G completions of a prompt share it)."""
    return _math_verify().parse(f"${gold}$", parsing_timeout=timeout)


@lru_cache(maxsize=1)
def _math_verify():
    """Import math-verify on first use and keep its log messages from reaching stderr via logging's last resort."""
    import logging

    import math_verify

    logging.getLogger("math_verify").addHandler(logging.NullHandler())
    return math_verify


TASK = Task(
    name=NAME,
    load=load,
    reward=reward,
    build_prompt=build_prompt,
    answer_columns=("answer",),
    description="MATH-500 competition problems (HuggingFaceH4/MATH-500), graded with math-verify",
)
