"""Reading the final answer out of model text: ``<answer>...</answer>`` spans, ``\\boxed{...}``, numbers.

Prompts ask for reasoning followed by the final answer in ``<answer>...</answer>`` (d1's format), optionally as
``\\boxed{...}`` inside it. All functions here are pure string scans (regular expressions with no nested
quantifiers, linear brace matching) and never raise on model text.
"""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
BOXED_OPENERS = ("\\boxed{", "\\fbox{")

NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
"""A decimal number, optionally negative, with optional thousands commas (``1,234.5``); not part of a word."""


def answer_span(text: str) -> str | None:
    """Stripped content after the last ``<answer>`` up to the next ``</answer>`` (or to the end when unclosed)."""
    start = text.rfind(ANSWER_OPEN)
    if start < 0:
        return None
    rest = text[start + len(ANSWER_OPEN) :]
    end = rest.find(ANSWER_CLOSE)
    return (rest if end < 0 else rest[:end]).strip()


def last_boxed(text: str) -> str | None:
    """Stripped content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else ``None``."""
    start, opener = max((text.rfind(o), o) for o in BOXED_OPENERS)
    if start < 0:
        return None
    depth, begin = 1, start + len(opener)
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i].strip()
    return None  # unbalanced: the model ran out of tokens inside the box


def final_answer(text: str) -> str | None:
    """The final answer: the last ``\\boxed{}`` inside the ``<answer>`` span, else the span, else the last
    ``\\boxed{}`` anywhere; ``None`` when the completion gives no final answer in either format."""
    span = answer_span(text)
    if span is None:
        return last_boxed(text)
    boxed = last_boxed(span)
    return span if boxed is None else boxed


def parse_number(text: str) -> Fraction | None:
    """Exact value of a string that is one number (``"1,000"``, ``"-3.50"``, ``"$18"``), else ``None``."""
    cleaned = text.strip().replace("\\$", "").replace("$", "").strip()
    if not NUMBER_RE.fullmatch(cleaned):
        return None
    return Fraction(cleaned.replace(",", ""))


def last_number(text: str) -> Fraction | None:
    """Exact value of the last number in ``text`` (commas as thousands separators stripped), else ``None``."""
    matches = NUMBER_RE.findall(text)
    return Fraction(matches[-1].replace(",", "")) if matches else None
