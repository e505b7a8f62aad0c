"""The ``Task`` record every task module exports, and the TRL reward-function conventions shared by all of them.

A task is data + prompt + reward:
- ``load(split, data_path=None, limit=None, seed=0) -> list[dict]``: rows with at least ``prompt`` (str) and the
  task's answer columns (``Task.answer_columns``); all rows of one call have the same keys (``None`` for a value a
  source lacks), so a trainer can turn them into aligned reward columns.
- ``reward(prompts, completions, **columns) -> list[float]``: TRL's reward-function signature. ``columns`` are the
  dataset columns, each a list aligned with ``completions``; unknown columns (and TRL extras such as
  ``completion_ids`` or ``trainer_state``) are ignored. Completions may be strings or TRL conversational completions
  (a list of ``{"role", "content"}`` messages). Rewards never print and never raise on model text.
- ``build_prompt(row) -> str``: the instruction + question text (the user turn) from a row's input fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

SPLITS = ("train", "test")
"""Split names understood by every task (hub datasets may offer others, e.g. MATH-500 has only ``test``)."""


class Loader(Protocol):
    """``load(split, data_path=None, limit=None, seed=0) -> rows``; see the module docstring."""

    def __call__(
        self, split: str = "train", data_path: str | None = None, limit: int | None = None, seed: int = 0
    ) -> list[dict[str, Any]]: ...


RewardFn = Callable[..., list[float]]
"""``reward(prompts, completions, **columns) -> list[float]`` (TRL's signature)."""


def reward_columns(rows: Sequence[dict[str, Any]], exclude: Sequence[str] = ("prompt",)) -> dict[str, list]:
    """Rows with the same keys -> the reward function's ``columns``: {key: [value of each row]} for every key not in
    ``exclude`` (TRL passes every dataset column but the prompt and completion ones)."""
    return {k: [row[k] for row in rows] for k in rows[0] if k not in exclude}


@dataclass(frozen=True)
class Task:
    """One task: how to load it, how to prompt for it, how to score a completion."""

    name: str
    """Registry key; metrics log its mean reward as ``reward/<name>``."""
    load: Loader
    """Rows from a local jsonl/parquet file, the hub, or a seeded procedural generator (``Loader``)."""
    reward: RewardFn
    """TRL-style reward function; reads the columns named in ``answer_columns``."""
    build_prompt: Callable[[dict[str, Any]], str]
    """Instruction + question text for one row (what ``load`` stores under ``prompt``)."""
    answer_columns: tuple[str, ...]
    """Row columns the reward needs besides ``prompt`` and ``completions``."""
    use_chat_template: bool = True
    """Wrap ``prompt`` as a single user turn in the model's chat template (False: feed the raw text, e.g. ``arith``)."""
    description: str = ""
    """One line for ``--help`` / listings."""


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """The prompt as a one-turn conversation, for ``tokenizer.apply_chat_template``."""
    return [{"role": "user", "content": prompt}]


def completion_text(completion: Any) -> str:
    """Plain text of a completion: a string, a TRL conversational completion (list of messages), or one message.

    For a list of messages the contents of all messages are joined (TRL passes the assistant turn as one message).
    Anything else reads as the empty string, which every reward scores 0.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content")
        return content if isinstance(content, str) else ""
    if isinstance(completion, (list, tuple)):
        return "".join(completion_text(m) for m in completion if isinstance(m, dict))
    return ""


def check_aligned(completions: Sequence[Any], **columns: Sequence[Any]) -> None:
    """Raise ``ValueError`` unless every column has one entry per completion (TRL passes them aligned)."""
    n = len(completions)
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(f"reward column {name!r} has {len(values)} entries for {n} completions")
