"""Countdown: combine 3-4 numbers with ``+ - * /`` (each used exactly once) to reach a target.

Rows: ``prompt``, ``numbers`` (list of int), ``target`` (int), ``solution`` (an expression reaching the target; always
present for generated rows, ``None`` when a file has none). Data: seeded generator (default) or a local jsonl/parquet
file / hub name with ``target`` and ``numbers`` (or ``nums``, as in ``Jiayi-Pan/Countdown-Tasks-3to4``).

Generator: draw 3-4 numbers, combine random pairs with random operators until one value is left (a random expression
tree over all numbers, exact rational arithmetic, division by zero avoided); keep it when the value is an integer in
``[min_target, max_target]``. So every puzzle is solvable by construction, and ``solution`` records how.

Reward: the final answer (``<answer>`` span, or ``\\boxed{}``) is read as an expression, optionally followed by
``= target``; ``×``/``÷``/``−``/``\\times``/``\\div``/``\\cdot`` are read as operators. It scores 1.0 when
``safe_arith.evaluate_arithmetic`` accepts it (no ``eval``; whitelisted ``ast`` nodes; size limits), its integer
literals are exactly the given numbers (as a multiset) and its exact value equals the target; 0.0 otherwise (including
division by zero, unparsable or oversized text, any name/call/attribute/power).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Task, check_aligned, completion_text
from .extract import final_answer
from .loading import check_limit, read_rows, require
from .procedural import generate_rows
from .safe_arith import ArithLimits, evaluate_arithmetic

NAME = "countdown"
DEFAULT_SIZE = {"train": 10_000, "test": 500}
MAX_DRAWS = 100_000
"""Random expressions tried per puzzle before the config is declared unsatisfiable."""
LIMITS = ArithLimits(max_chars=200, max_nodes=64, max_literal=10**6)
_OPERATOR_SPELLINGS = {"×": "*", "÷": "/", "−": "-", "\\times": "*", "\\div": "/", "\\cdot": "*"}


@dataclass(frozen=True)
class CountdownConfig:
    """Shape of generated puzzles."""

    min_count: int = 3
    """Fewest numbers per puzzle."""
    max_count: int = 4
    """Most numbers per puzzle."""
    max_number: int = 100
    """Numbers are drawn uniformly from ``1..max_number``."""
    min_target: int = 1
    """Smallest accepted target."""
    max_target: int = 100
    """Largest accepted target."""

    def __post_init__(self) -> None:
        if not 2 <= self.min_count <= self.max_count <= 6:
            raise ValueError(f"need 2 <= min_count <= max_count <= 6, got {self.min_count}, {self.max_count}")
        if self.max_number < 1 or self.max_number > LIMITS.max_literal:
            raise ValueError(f"max_number must be in 1..{LIMITS.max_literal}, got {self.max_number}")
        if self.min_target > self.max_target:
            raise ValueError(f"min_target {self.min_target} > max_target {self.max_target}")


def build_prompt(row: dict[str, Any]) -> str:
    """Instruction with the numbers and target."""
    numbers = ", ".join(str(n) for n in row["numbers"])
    return (
        f"Using the numbers [{numbers}], create an arithmetic expression that equals {row['target']}. "
        "You may use +, -, * and / with parentheses, and each number must be used exactly once. "
        "Think step by step inside <reasoning></reasoning>, then give only the expression inside "
        "<answer></answer>, for example <answer>(3 + 5) * 2</answer>."
    )


def random_puzzle(rng: random.Random, config: CountdownConfig = CountdownConfig()) -> dict[str, Any]:
    """One solvable puzzle ``{numbers, target, solution}`` drawn from ``rng`` (rejection sampling on the target)."""
    count = rng.randint(config.min_count, config.max_count)
    for _ in range(MAX_DRAWS):
        numbers = [rng.randint(1, config.max_number) for _ in range(count)]
        tree, (num, den) = _random_tree(rng, numbers)
        if num % den == 0 and config.min_target <= num // den <= config.max_target:
            return {"numbers": numbers, "target": num // den, "solution": _render(tree, outer=True)}
    raise ValueError(f"no target in [{config.min_target}, {config.max_target}] after {MAX_DRAWS} draws: widen {config}")


def _random_tree(rng: random.Random, numbers: list[int]) -> tuple[Any, tuple[int, int]]:
    """Combine random pairs with random operators until one (tree, exact value) is left.

    A tree is an int leaf or ``(op, left, right)``. Values are exact rationals kept as unreduced ``(num, den)`` int
    pairs (``Fraction`` is several times slower and this loop runs ~10 times per accepted puzzle); ``den`` may be
    negative but never 0, because division by an exact zero is never drawn.
    """
    items: list[tuple[Any, tuple[int, int]]] = [(n, (n, 1)) for n in numbers]
    while len(items) > 1:
        i = rng.randrange(len(items))
        j = rng.randrange(len(items) - 1)
        j += j >= i
        (left, (p, q)), (right, (r, s)) = items[i], items[j]
        op = rng.choice("+-*/" if r else "+-*")
        if op == "+":
            value = (p * s + r * q, q * s)
        elif op == "-":
            value = (p * s - r * q, q * s)
        elif op == "*":
            value = (p * r, q * s)
        else:
            value = (p * s, q * r)
        items = [item for k, item in enumerate(items) if k != i and k != j] + [((op, left, right), value)]
    return items[0]


def _render(tree: Any, outer: bool = False) -> str:
    """Fully parenthesised text of a tree (no parentheses around the whole expression)."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    text = f"{_render(left)} {op} {_render(right)}"
    return text if outer else f"({text})"


def _key(row: dict[str, Any]) -> str:
    return f"{sorted(row['numbers'])}->{row['target']}"


def load(
    split: str = "train",
    data_path: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    config: CountdownConfig = CountdownConfig(),
) -> list[dict]:
    """Generated puzzles (``data_path=None``; ``limit`` defaults to ``DEFAULT_SIZE[split]``) or rows from a file/hub."""
    if data_path is None:
        n = check_limit(limit, DEFAULT_SIZE.get(split, 0))
        rows = generate_rows(NAME, lambda rng: random_puzzle(rng, config), _key, n, split, seed)
    else:
        raws = read_rows(split, data_path, data_path, None, limit)
        rows = [_validate(raw, i, data_path) for i, raw in enumerate(raws)]
    return [{"prompt": build_prompt(row), **row} for row in rows]


def _validate(raw: dict[str, Any], index: int, source: str) -> dict[str, Any]:
    numbers = require(raw, index, "numbers", source, aliases=("nums",))
    target = require(raw, index, "target", source)
    if not (isinstance(numbers, list) and len(numbers) >= 2 and all(_is_int(n) for n in numbers) and _is_int(target)):
        raise ValueError(f"{source}: row {index} needs a list of >= 2 integer 'numbers' and an integer 'target'")
    return {"numbers": [int(n) for n in numbers], "target": int(target), "solution": raw.get("solution")}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def score(text: str, numbers: Sequence[int], target: int) -> float:
    """1.0 when ``text``'s final answer uses each of ``numbers`` once and evaluates exactly to ``target``, else 0.0."""
    expression = final_answer(text)
    if expression is None or len(expression) > LIMITS.max_chars:
        return 0.0
    for spelling, op in _OPERATOR_SPELLINGS.items():
        expression = expression.replace(spelling, op)
    expression = expression.strip().strip("$").strip()
    if "=" in expression:  # allow "expr = target", nothing else
        expression, _, rhs = expression.partition("=")
        if rhs.strip() != str(target):
            return 0.0
    result = evaluate_arithmetic(expression, LIMITS)
    if result is None or sorted(result.literals) != sorted(numbers):
        return 0.0
    return 1.0 if result.value == target else 0.0


def reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    numbers: Sequence[Sequence[int]],
    target: Sequence[int],
    **_: Any,
) -> list[float]:
    """TRL reward: ``score`` per completion (1.0 correct equation, else 0.0)."""
    check_aligned(completions, numbers=numbers, target=target)
    return [score(completion_text(c), n, int(t)) for c, n, t in zip(completions, numbers, target, strict=True)]


TASK = Task(
    name=NAME,
    load=load,
    reward=reward,
    build_prompt=build_prompt,
    answer_columns=("numbers", "target"),
    description="Countdown: reach the target with + - * / using each number once (procedural or file)",
)
