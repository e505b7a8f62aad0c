"""Task names -> ``Task`` records, and user reward functions by import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from . import arith, countdown, digits, gsm8k, math500, sudoku
from .base import RewardFn, Task

TASKS: dict[str, Task] = {t.name: t for t in (gsm8k.TASK, math500.TASK, countdown.TASK, sudoku.TASK, arith.TASK,
                                            digits.TASK)}
"""Every built-in task by name."""


def get_task(name: str) -> Task:
    """The task called ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None


def load_reward_function(path: str) -> RewardFn:
    """A TRL-style reward function ``reward(prompts, completions, **columns) -> list[float]`` from ``"pkg.mod:func"``.

    ``func`` may be a dotted attribute path (``"pkg.mod:Class.method"``). Raises ``ValueError`` for a malformed path,
    ``ImportError`` when the module cannot be imported or lacks the attribute, ``TypeError`` when it is not callable.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"reward function path must look like 'package.module:function', got {path!r}")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import module {module_name!r} for reward function {path!r}: {err}") from err
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ImportError(f"{path!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise TypeError(f"{path!r} is a {type(obj).__name__}, not a callable reward function")
    fn: Callable[..., list[float]] = obj
    return fn
