"""GSM8K (``openai/gsm8k``, config ``main``): grade-school word problems with an integer final answer.

Rows: ``prompt``, ``question``, ``answer`` (the gold final number as a plain string, e.g. ``"1000"``) and ``solution``
(the dataset's worked solution ending in ``#### N``). A local file may give ``answer`` either in the hub's
``... #### N`` form or as the bare number.

Reward: 1.0 when the last number of the completion's final answer (``\\boxed{}`` inside ``<answer>``, else the
``<answer>`` span, else the last ``\\boxed{}``) equals the gold number exactly (``18``, ``18.00`` and ``$18`` all
read as 18, ``1,800`` as 1800); 0.0 otherwise, including completions with no final answer in either format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Task, check_aligned, completion_text
from .extract import final_answer, last_number, parse_number
from .loading import read_rows, require

NAME = "gsm8k"
HUB_NAME, HUB_CONFIG = "openai/gsm8k", "main"

INSTRUCTION = (
    "You are a math expert. Solve the problem step by step. Respond in the following format:\n"
    "<reasoning>\nYour step-by-step reasoning\n</reasoning>\n"
    "<answer>\n\\boxed{final number}\n</answer>"
)


def build_prompt(row: dict[str, Any]) -> str:
    """Instruction followed by the question (d1's GSM8K prompt layout)."""
    return f"{INSTRUCTION}\n\n{row['question'].strip()}"


def gold_answer(answer: str) -> str | None:
    """The gold final number as a plain string (``"#### 1,000"`` -> ``"1000"``), or ``None`` if there is none."""
    final = answer.rsplit("####", 1)[-1]
    value = parse_number(final)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else final.strip().replace(",", "")


def load(split: str = "train", data_path: str | None = None, limit: int | None = None, seed: int = 0) -> list[dict]:
    """GSM8K rows from ``data_path`` (local jsonl/parquet or hub name) or ``openai/gsm8k``; ``seed`` is unused."""
    source = data_path or HUB_NAME
    rows = []
    for i, raw in enumerate(read_rows(split, data_path, HUB_NAME, HUB_CONFIG, limit)):
        question = require(raw, i, "question", source)
        solution = str(require(raw, i, "answer", source))
        gold = gold_answer(solution)
        if gold is None:
            raise ValueError(
                f"{source}: row {i} field 'answer' has no final number (expected '... #### N'): {solution!r}"
            )
        row = {"question": question, "answer": gold, "solution": solution}
        rows.append({"prompt": build_prompt(row), **row})
    return rows


def reward(prompts: Sequence[Any], completions: Sequence[Any], *, answer: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the completion's final number equals the gold ``answer`` (exact numeric comparison), else 0.0."""
    check_aligned(completions, answer=answer)
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        final = final_answer(completion_text(completion))
        predicted = None if final is None else last_number(final)
        expected = parse_number(str(gold))
        scores.append(1.0 if predicted is not None and predicted == expected else 0.0)
    return scores


TASK = Task(
    name=NAME,
    load=load,
    reward=reward,
    build_prompt=build_prompt,
    answer_columns=("answer",),
    description="GSM8K word problems (openai/gsm8k), exact numeric match of the final answer",
)
