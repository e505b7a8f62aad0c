"""4x4 Sudoku (2x2 boxes): fill the blanks so every row, column and box holds 1-4 once.

Rows: ``prompt``, ``puzzle`` and ``solution`` as 16-character row-major strings (``0`` = blank). Data: seeded
generator (default) or a local jsonl/parquet file / hub name with ``puzzle`` and ``solution`` (or d1's ``Puzzle`` and
``Solution``); loaded rows are checked (valid solution, puzzle consistent with it, at least one blank).

Generator: a complete grid is a base pattern transformed by random Sudoku symmetries (band and stack swaps, row swaps
within a band, column swaps within a stack, transpose, digit relabelling). One base pattern reaches only 192 of the 288
4x4 grids, so two patterns (one per symmetry class, picked with weights 192:96) are used, making every grid equally
likely. Then ``k`` random cells are blanked; by default the blanks are redrawn until the puzzle has a unique solution.

Reward: the final answer (``<answer>`` span, or ``\\boxed{}``) must contain exactly 16 digits (spaces, newlines, commas
and other separators are ignored); the score is the fraction of the puzzle's blank cells whose digit equals the
stored solution. No parsable grid -> 0.0. Given cells are not scored.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Task, check_aligned, completion_text
from .extract import final_answer
from .loading import check_limit, read_rows, require
from .procedural import generate_rows

NAME = "sudoku"
SIZE, BOX = 4, 2
CELLS = SIZE * SIZE
DEFAULT_SIZE = {"train": 10_000, "test": 500}
MAX_DRAWS = 10_000
"""Grids/blank patterns tried per puzzle before giving up."""
MAX_ANSWER_CHARS = 500
"""Longer final answers are not parsed (score 0)."""
BASE_GRIDS = (("1234", "3412", "2341", "4123"), ("1234", "3412", "2143", "4321"))
"""One representative per symmetry class of 4x4 grids."""
BASE_WEIGHTS = (192, 96)
"""Number of grids in each class: picking a class with these weights makes every one of the 288 grids equally likely."""
_UNITS = (
    [[r * SIZE + c for c in range(SIZE)] for r in range(SIZE)]
    + [[r * SIZE + c for r in range(SIZE)] for c in range(SIZE)]
    + [[(br + r) * SIZE + bc + c for r in range(BOX) for c in range(BOX)] for br in (0, 2) for bc in (0, 2)]
)
"""Cell indices of every row, column and box."""


@dataclass(frozen=True)
class SudokuConfig:
    """Shape of generated puzzles."""

    min_blanks: int = 6
    """Fewest blank cells."""
    max_blanks: int = 10
    """Most blank cells."""
    unique: bool = True
    """Redraw the blanks until the puzzle has exactly one solution."""

    def __post_init__(self) -> None:
        top = 12 if self.unique else CELLS  # a 4x4 Sudoku needs >= 4 givens to have a unique solution
        if not 1 <= self.min_blanks <= self.max_blanks <= top:
            raise ValueError(f"need 1 <= min_blanks <= max_blanks <= {top} (unique={self.unique}), got {self}")


def build_prompt(row: dict[str, Any]) -> str:
    """Instruction with the puzzle shown as four rows."""
    puzzle = row["puzzle"]
    grid = "\n".join(" ".join(puzzle[r * SIZE : (r + 1) * SIZE]) for r in range(SIZE))
    return (
        "Solve this 4x4 Sudoku. Replace every 0 with a digit from 1 to 4 so that each row, each column and each "
        f"2x2 box contains 1, 2, 3 and 4 exactly once.\n{grid}\n"
        "Think step by step inside <reasoning></reasoning>, then give the completed grid as 16 digits, row by row, "
        "inside <answer></answer>, for example <answer>1234341221434321</answer>."
    )


def is_valid_solution(grid: str) -> bool:
    """True when ``grid`` is 16 digits 1-4 with every row, column and box a permutation of 1-4."""
    return len(grid) == CELLS and all(sorted(grid[i] for i in unit) == list("1234") for unit in _UNITS)


def count_solutions(puzzle: str, stop_at: int = 2) -> int:
    """Number of completions of ``puzzle`` (backtracking; stops counting at ``stop_at``)."""
    cells = list(puzzle)
    blank = cells.index("0") if "0" in cells else -1
    if blank < 0:
        return int(is_valid_solution(puzzle))
    used = {cells[i] for unit in _UNITS if blank in unit for i in unit}
    total = 0
    for digit in "1234":
        if digit not in used:
            cells[blank] = digit
            total += count_solutions("".join(cells), stop_at - total)
            if total >= stop_at:
                break
    return total


def random_grid(rng: random.Random) -> str:
    """A uniformly random complete 4x4 grid: a base pattern under random symmetries."""
    base = rng.choices(BASE_GRIDS, weights=BASE_WEIGHTS)[0]
    rows, cols = _line_order(rng), _line_order(rng)
    grid = [[base[r][c] for c in cols] for r in rows]
    if rng.random() < 0.5:
        grid = [list(col) for col in zip(*grid, strict=True)]
    relabel = dict(zip("1234", rng.sample("1234", 4), strict=True))
    return "".join(relabel[d] for row in grid for d in row)


def _line_order(rng: random.Random) -> list[int]:
    """A random order of the 4 rows (or columns) that keeps each band (stack) together."""
    bands = rng.sample(range(SIZE // BOX), SIZE // BOX)
    return [band * BOX + offset for band in bands for offset in rng.sample(range(BOX), BOX)]


def random_puzzle(rng: random.Random, config: SudokuConfig = SudokuConfig()) -> dict[str, str]:
    """``{puzzle, solution}``: a random grid with min_blanks..max_blanks blank cells (unique solution by default)."""
    blanks = rng.randint(config.min_blanks, config.max_blanks)
    for _ in range(MAX_DRAWS):
        solution = random_grid(rng)
        hidden = set(rng.sample(range(CELLS), blanks))
        puzzle = "".join("0" if i in hidden else d for i, d in enumerate(solution))
        if not config.unique or count_solutions(puzzle) == 1:
            return {"puzzle": puzzle, "solution": solution}
    raise ValueError(f"no uniquely solvable puzzle with {blanks} blanks in {MAX_DRAWS} draws")


def load(
    split: str = "train",
    data_path: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    config: SudokuConfig = SudokuConfig(),
) -> list[dict]:
    """Generated puzzles (``data_path=None``; ``limit`` defaults to ``DEFAULT_SIZE[split]``) or rows from a file/hub."""
    if data_path is None:
        n = check_limit(limit, DEFAULT_SIZE.get(split, 0))
        rows = generate_rows(NAME, lambda rng: random_puzzle(rng, config), lambda r: r["puzzle"], n, split, seed)
    else:
        raws = read_rows(split, data_path, data_path, None, limit)
        rows = [_validate(raw, i, data_path) for i, raw in enumerate(raws)]
    return [{"prompt": build_prompt(row), **row} for row in rows]


def _validate(raw: dict[str, Any], index: int, source: str) -> dict[str, str]:
    puzzle = str(require(raw, index, "puzzle", source, aliases=("Puzzle",)))
    solution = str(require(raw, index, "solution", source, aliases=("Solution",)))
    problem = None
    if not is_valid_solution(solution):
        problem = f"'solution' {solution!r} is not a valid 16-digit 4x4 grid"
    elif len(puzzle) != CELLS or any(p not in ("0", s) for p, s in zip(puzzle, solution, strict=True)):
        problem = f"'puzzle' {puzzle!r} is not 16 digits consistent with its solution (0 = blank)"
    elif "0" not in puzzle:
        problem = f"'puzzle' {puzzle!r} has no blank cell"
    if problem:
        raise ValueError(f"{source}: row {index}: {problem}")
    return {"puzzle": puzzle, "solution": solution}


def parse_grid(text: str) -> str | None:
    """The 16 digits of the final answer, or ``None`` unless it holds exactly 16 digits."""
    answer = final_answer(text)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    digits = re.findall(r"\d", answer)
    return "".join(digits) if len(digits) == CELLS else None


def score(text: str, puzzle: str, solution: str) -> float:
    """Fraction of ``puzzle``'s blank cells that ``text``'s answer fills with the ``solution`` digit."""
    grid = parse_grid(text)
    blanks = [i for i, p in enumerate(puzzle) if p == "0"]
    if grid is None or not blanks:
        return 0.0
    return sum(grid[i] == solution[i] for i in blanks) / len(blanks)


def reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    puzzle: Sequence[str],
    solution: Sequence[str],
    **_: Any,
) -> list[float]:
    """TRL reward: ``score`` per completion (fraction of blanks filled correctly)."""
    check_aligned(completions, puzzle=puzzle, solution=solution)
    return [score(completion_text(c), p, s) for c, p, s in zip(completions, puzzle, solution, strict=True)]


TASK = Task(
    name=NAME,
    load=load,
    reward=reward,
    build_prompt=build_prompt,
    answer_columns=("puzzle", "solution"),
    description="4x4 Sudoku (procedural or file); reward = fraction of blank cells filled correctly",
)
