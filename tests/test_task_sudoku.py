"""4x4 Sudoku: generator (deterministic, valid, unique, uniform over grids), loader checks, partial-credit reward."""

from __future__ import annotations

import collections
import json
import random

import pytest

from dllm_ais.tasks import sudoku

PUZZLE = "0024240010404230"
SOLUTION = "3124241313424231"  # blanks at 0, 1, 6, 7, 9, 11, 15 (7 cells)


def _score(text: str) -> float:
    return sudoku.reward(["p"], [text], puzzle=[PUZZLE], solution=[SOLUTION])[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"<answer>{SOLUTION}</answer>", 1.0),
        ("<reasoning>...</reasoning><answer>\n3 1 2 4\n2 4 1 3\n1 3 4 2\n4 2 3 1\n</answer>", 1.0),
        ("<answer>3124|2413|1342|4231</answer>", 1.0),
        (f"\\boxed{{{SOLUTION}}}", 1.0),
        ("<answer>1324241313424231</answer>", 5 / 7),  # cells 0 and 1 swapped
        ("<answer>3124241313424232</answer>", 6 / 7),  # last cell wrong
        ("<answer>1111111111111111</answer>", 3 / 7),  # right at blanks 1, 6 and 15 only
        ("<answer>3199241313424231</answer>", 1.0),  # given cells 2 and 3 are not scored
        ("<answer>312424131342423</answer>", 0.0),  # 15 digits
        ("<answer>31242413134242311</answer>", 0.0),  # 17 digits
        ("<answer>Row 1: 3124 ...</answer>", 0.0),
        (SOLUTION, 0.0),  # no final-answer format
        ("", 0.0),
    ],
)
def test_reward_cases(text, expected):
    assert _score(text) == pytest.approx(expected)


def test_generator_is_deterministic_valid_and_unique():
    rows = sudoku.load("train", limit=200, seed=5)
    assert rows == sudoku.load("train", limit=200, seed=5) and rows != sudoku.load("train", limit=200, seed=6)
    for row in rows:
        puzzle, solution = row["puzzle"], row["solution"]
        assert sudoku.is_valid_solution(solution)
        assert all(p in ("0", s) for p, s in zip(puzzle, solution, strict=True))
        assert 6 <= puzzle.count("0") <= 10 and sudoku.count_solutions(puzzle) == 1
        assert sudoku.reward([row["prompt"]], [f"<answer>{solution}</answer>"], puzzle=[puzzle], solution=[solution])
        assert "\n".join(" ".join(puzzle[r * 4 : r * 4 + 4]) for r in range(4)) in row["prompt"]


def test_random_grid_covers_all_288_grids_evenly():
    rng = random.Random(0)
    counts = collections.Counter(sudoku.random_grid(rng) for _ in range(288 * 25))
    assert len(counts) == 288 and all(sudoku.is_valid_solution(g) for g in counts)
    assert min(counts.values()) > 5 and max(counts.values()) < 50  # mean 25; one class alone would miss 96 grids


def test_count_solutions():
    assert sudoku.count_solutions(SOLUTION) == 1
    assert sudoku.count_solutions("0" * 16) == 2  # stops counting at 2
    assert sudoku.count_solutions("0" * 16, stop_at=300) == 288
    assert sudoku.count_solutions("1100" + "0" * 12) == 0


def test_splits_are_disjoint_and_config_is_checked():
    train = {r["puzzle"] for r in sudoku.load("train", limit=300)}
    test = {r["puzzle"] for r in sudoku.load("test", limit=50)}
    assert not train & test
    hard = sudoku.load("train", limit=5, config=sudoku.SudokuConfig(min_blanks=12, max_blanks=12))
    assert all(r["puzzle"].count("0") == 12 and sudoku.count_solutions(r["puzzle"]) == 1 for r in hard)
    with pytest.raises(ValueError, match="max_blanks <= 12"):
        sudoku.SudokuConfig(min_blanks=6, max_blanks=13)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"puzzle": PUZZLE, "solution": "1234123412341234"}, "row 1: 'solution' .* is not a valid"),
        ({"puzzle": "1" + PUZZLE[1:], "solution": SOLUTION}, "row 1: 'puzzle' .* consistent"),
        ({"puzzle": SOLUTION, "solution": SOLUTION}, "row 1: 'puzzle' .* no blank"),
        ({"puzzle": PUZZLE}, "row 1 has no field 'solution' \\(or 'Solution'\\)"),
    ],
)
def test_loader_rejects_bad_rows(tmp_path, row, message):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"puzzle": PUZZLE, "solution": SOLUTION}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message):
        sudoku.load("test", data_path=str(path))


def test_d1_column_names(tmp_path):
    path = tmp_path / "d1.jsonl"
    path.write_text(json.dumps({"Puzzle": PUZZLE, "Solution": SOLUTION}) + "\n")
    assert sudoku.load("test", data_path=str(path))[0]["puzzle"] == PUZZLE
