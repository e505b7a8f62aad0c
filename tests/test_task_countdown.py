"""Countdown: safe ``ast`` evaluation (never executes model text), reward cases, seeded solvable generator."""

from __future__ import annotations

import builtins
import time
from fractions import Fraction
from importlib import resources

import pytest

from dllm_ais.tasks import countdown
from dllm_ais.tasks.procedural import split_of
from dllm_ais.tasks.safe_arith import ArithLimits, evaluate_arithmetic

DATA = resources.files("dllm_ais.tasks") / "data"


def _score(answer: str, numbers=(3, 5, 2), target=16) -> float:
    return countdown.reward(["p"], [answer], numbers=[list(numbers)], target=[target])[0]


def test_evaluate_exact_fractions_and_literals():
    result = evaluate_arithmetic("8 / (3 - 8 / 3)")
    assert result.value == 24 and result.literals == (8, 3, 8, 3)
    assert evaluate_arithmetic("-(2 + 3) * +4").value == -20
    assert evaluate_arithmetic("7 / 2").value == Fraction(7, 2)
    assert evaluate_arithmetic("1 / (2 - 2)") is None


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("<answer>(3 + 5) * 2</answer>", 1.0),
        ("<reasoning>8*2</reasoning><answer>\n2*(5+3)\n</answer>", 1.0),
        ("<answer>(3 + 5) * 2 = 16</answer>", 1.0),
        ("<answer>(3 + 5) × 2</answer>", 1.0),
        ("<answer>$(3 + 5) \\times 2$</answer>", 1.0),
        ("so \\boxed{(3+5)*2}", 1.0),
        ("<answer>(3 + 5) * 2 = 17</answer>", 0.0),
        ("<answer>(3 + 5) * 2 == 16</answer>", 0.0),
        ("<answer>3 * 5 + 2</answer>", 0.0),  # 17
        ("<answer>8 * 2</answer>", 0.0),  # numbers not used
        ("<answer>(3 + 5) * 2 * 1</answer>", 0.0),  # extra number
        ("<answer>(3 + 5 + 5 - 5) * 2</answer>", 0.0),  # number reused
        ("<answer>(3.0 + 5) * 2</answer>", 0.0),  # float literal
        ("<answer>(3 + 5) * 2</answer> <answer>3+5+2</answer>", 0.0),  # the last answer counts
        ("(3 + 5) * 2", 0.0),  # no final-answer format
        ("<answer>(3 + 5 * 2</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("", 0.0),
    ],
)
def test_reward_cases(answer, expected):
    assert _score(answer) == expected


def test_exact_arithmetic_and_division_by_zero():
    assert _score("<answer>8 / (3 - 8 / 3)</answer>", (8, 3, 8, 3), 24) == 1.0  # float arithmetic gives 23.999...
    assert _score("<answer>3 / (5 - 5) * 2</answer>", (3, 5, 5, 2), 0) == 0.0


ADVERSARIAL = [
    "9**9**9",
    "(3 + 5) ** 2",
    "2 ** 3 ** 4 ** 5",
    "16 // 1",
    "17 % 3",
    "True + 15",
    "().__class__.__bases__[0].__subclasses__()",
    "__import__('os').system('touch {sentinel}')",
    "open('{sentinel}', 'w').write('x')",
    "exec(\"open('{sentinel}', 'w')\")",
    "(lambda: 16)()",
    "[16][0]",
    "x",
    "abs(-16)",
    "16 if 1 else 2",
    "'16'",
    "f'{{16}}'",
    "(yield 16)",
    "16; 1",
    "1" * 5000,
    "9" * 150,
    "(" * 5000 + "16" + ")" * 5000,
    "(" * 99 + "15" + ")" * 99,
    "+".join(["1"] * 100),
    "-" * 150 + "16",
    "1000001 - 999985",
    "16\x00",
]


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_adversarial_answers_score_zero_without_executing(text, tmp_path, monkeypatch):
    sentinel = tmp_path / "executed"
    text = text.replace("{sentinel}", str(sentinel))

    def forbidden(*args, **kwargs):
        raise AssertionError("model text reached eval/exec")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    start = time.perf_counter()
    assert _score(f"<answer>{text}</answer>", (16,), 16) == 0.0
    assert _score(f"\\boxed{{{text}}}", (16,), 16) == 0.0
    assert time.perf_counter() - start < 5.0  # a hang guard (e.g. 9**9**9 evaluated), not a speed target
    assert not sentinel.exists()


def test_limits_are_configurable():
    assert evaluate_arithmetic("1+1+1", ArithLimits(max_nodes=5)) is None
    assert evaluate_arithmetic("1+1", ArithLimits(max_nodes=5)).value == 2
    assert evaluate_arithmetic("12", ArithLimits(max_literal=10)) is None
    assert evaluate_arithmetic("1 + 1", ArithLimits(max_chars=4)) is None
    assert evaluate_arithmetic("(" * 99 + "16" + ")" * 99).value == 16  # parentheses add no nodes
    assert evaluate_arithmetic("(" * 5000 + "16" + ")" * 5000) is None  # too long: never parsed


def test_generator_is_deterministic_and_solvable():
    rows = countdown.load("train", limit=200, seed=3)
    assert rows == countdown.load("train", limit=200, seed=3)
    assert rows != countdown.load("train", limit=20, seed=4)[:20]
    assert {len(r["numbers"]) for r in rows} == {3, 4}
    for row in rows:
        assert 1 <= row["target"] <= 100 and all(1 <= n <= 100 for n in row["numbers"])
        result = evaluate_arithmetic(row["solution"])  # the stored solution, checked by the safe evaluator
        assert result.value == row["target"] and sorted(result.literals) == sorted(row["numbers"])
        assert countdown.reward([row["prompt"]], [f"<answer>{row['solution']}</answer>"], **_cols(row)) == [1.0]


def test_splits_are_disjoint():
    train = {countdown._key(r) for r in countdown.load("train", limit=300)}
    test = {countdown._key(r) for r in countdown.load("test", limit=60)}
    assert len(train) == 300 and len(test) == 60 and not train & test
    assert all(split_of(k) == "train" for k in train) and all(split_of(k) == "test" for k in test)


def test_config_validation_and_custom_ranges():
    with pytest.raises(ValueError, match="min_count"):
        countdown.CountdownConfig(min_count=4, max_count=3)
    config = countdown.CountdownConfig(min_count=4, max_count=4, max_number=10, min_target=50, max_target=60)
    rows = countdown.load("train", limit=20, seed=1, config=config)
    assert all(len(r["numbers"]) == 4 and 50 <= r["target"] <= 60 for r in rows)
    with pytest.raises(ValueError, match="unknown split"):
        countdown.load("validation", limit=1)


def test_shipped_sample_solutions_are_correct():
    rows = countdown.load("test", data_path=str(DATA / "countdown_sample.jsonl"))
    for row in rows:
        assert countdown.reward(["p"], [f"<answer>{row['solution']}</answer>"], **_cols(row)) == [1.0]


def _cols(row):
    return {"numbers": [row["numbers"]], "target": [row["target"]]}
