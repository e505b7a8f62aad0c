"""``arith``: the tiny built-in addition task for CPU models."""

from __future__ import annotations

import string

import pytest

from dllm_ais.tasks import arith


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("19", 1.0),
        (" 19", 1.0),
        ("19abc", 1.0),
        ("19 20", 1.0),
        ("19\n", 1.0),
        ("20", 0.0),
        ("019", 0.0),
        ("1 9", 0.0),
        ("190", 0.0),
        ("-19", 0.0),
        ("x19", 0.0),
        ("", 0.0),
    ],
)
def test_reward_cases(completion, expected):
    assert arith.reward(["12+7="], [completion], answer=["19"]) == [expected]


def test_rows_are_short_printable_and_correct():
    rows = arith.load("train", limit=500, seed=1)
    assert rows == arith.load("train", limit=500, seed=1) and rows != arith.load("train", limit=500, seed=2)
    assert len({r["prompt"] for r in rows}) == 500
    printable = set(string.printable)
    for row in rows:
        assert row["prompt"] == f"{row['a']}+{row['b']}=" and int(row["answer"]) == row["a"] + row["b"]
        assert len(row["prompt"]) <= 16 and len(row["answer"]) <= 8 and set(row["prompt"]) <= printable
        assert 0 <= row["a"] <= 99 and 0 <= row["b"] <= 99


def test_splits_are_disjoint():
    train = {r["prompt"] for r in arith.load("train", limit=2000)}
    test = {r["prompt"] for r in arith.load("test", limit=200)}
    assert not train & test


def test_sft_pairs():
    pairs = arith.sft_pairs(300, seed=0)
    assert pairs == arith.sft_pairs(300, seed=0) and len(pairs) == 300
    test = {r["prompt"] for r in arith.load("test", limit=500)}
    for prompt, completion in pairs:
        a, b = prompt[:-1].split("+")
        assert completion == str(int(a) + int(b)) and prompt not in test
        assert arith.reward([prompt], [completion], answer=[completion]) == [1.0]


def test_config_and_too_many_rows():
    assert (
        max(len(r["prompt"]) for r in arith.load("train", limit=50, config=arith.ArithConfig(max_operand=9999))) <= 10
    )
    with pytest.raises(ValueError, match="max_operand"):
        arith.ArithConfig(max_operand=0)
    with pytest.raises(ValueError, match="found only"):
        arith.load("test", limit=50, config=arith.ArithConfig(max_operand=9))  # 100 problems, ~10 in test


def test_default_size_is_capped_by_a_small_problem_space():
    config = arith.ArithConfig(max_operand=9)
    train, test = arith.load("train", config=config), arith.load("test", config=config)
    assert len(train) == arith.split_size("train", config) and len(test) == arith.split_size("test", config)
    assert len(train) + len(test) == 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
