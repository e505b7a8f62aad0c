"""``digits``: the built-in digit-string task (reverse / sort) with partial-credit reward."""

from __future__ import annotations

import pytest

from dllm_ais.tasks import digits
from dllm_ais.tasks.registry import get_task


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("7183", 1.0),
        (" 7183", 1.0),
        ("7183abc", 1.0),
        ("7180", 0.75),
        ("0000", 0.0),
        ("7", 0.25),
        ("71", 0.5),
        ("71830", 0.8),  # an extra digit costs credit
        ("1837", 0.0),
        ("x7183", 0.0),
        ("", 0.0),
    ],
)
def test_reward_cases(completion, expected):
    assert digits.reward(["3817>"], [completion], answer=["7183"]) == [pytest.approx(expected)]


def test_shift_wraps_nine_to_zero():
    assert digits.transform("0918", "shift") == "1029" and digits.transform("9999", "shift") == "0000"


def test_accuracy_is_strict():
    comps = ["7183", "7180", "71830", ""]
    assert digits.accuracy(["3817>"] * 4, comps, answer=["7183"] * 4) == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("op", digits.OPS)
def test_rows_are_correct_and_seeded(op):
    config = digits.DigitsConfig(op=op)
    rows = digits.load("train", limit=300, seed=1, config=config)
    assert rows == digits.load("train", limit=300, seed=1, config=config)
    assert rows != digits.load("train", limit=300, seed=2, config=config)
    for row in rows:
        d = row["digits"]
        assert row["prompt"] == f"{d}>" and len(d) == 4 and d.isdigit()
        expected = {"reverse": d[::-1], "sort": "".join(sorted(d)),
                    "shift": "".join("1234567890"[int(c)] for c in d)}[op]
        assert row["answer"] == expected
        assert digits.reward([row["prompt"]], [row["answer"]], answer=[row["answer"]]) == [1.0]


def test_held_out_split_is_large_and_disjoint():
    test = digits.load("test")
    assert len(test) == 1000 and len({r["prompt"] for r in test}) == 1000
    train = {r["prompt"] for r in digits.load("train")}
    assert not train & {r["prompt"] for r in test}
    assert not {p for p, _ in digits.sft_pairs(2000)} & {r["prompt"] for r in test}


def test_sft_pairs_and_config_errors():
    pairs = digits.sft_pairs(200, seed=0, config=digits.DigitsConfig(op="sort", length=5))
    assert pairs == digits.sft_pairs(200, seed=0, config=digits.DigitsConfig(op="sort", length=5))
    assert all(c == "".join(sorted(p[:-1])) and len(c) == 5 for p, c in pairs)
    with pytest.raises(ValueError, match="op"):
        digits.DigitsConfig(op="rotate")
    with pytest.raises(ValueError, match="length"):
        digits.DigitsConfig(length=1)


def test_registered():
    task = get_task("digits")
    assert task.reward is digits.reward and not task.use_chat_template
