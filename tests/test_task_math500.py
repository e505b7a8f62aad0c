"""MATH-500 reward graded with math-verify (imported lazily, timeout-guarded, silent)."""

from __future__ import annotations

import threading

import pytest

from dllm_ais.tasks import math500


def _needs_math_verify() -> None:
    pytest.importorskip("math_verify", reason="MATH-500 grading needs math-verify (not on the bare GPU image)")


@pytest.mark.parametrize(
    ("gold", "completion", "expected"),
    [
        ("0.5", "<answer>\\boxed{\\frac{1}{2}}</answer>", 1.0),
        ("\\frac{1}{2}", "<answer>\\boxed{0.5}</answer>", 1.0),
        ("\\frac{1}{2}", "so the answer is \\boxed{1/2}", 1.0),
        ("3\\sqrt{2}", "<answer>\\boxed{\\sqrt{18}}</answer>", 1.0),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "<answer>\\boxed{(3, \\pi/2)}</answer>", 1.0),
        ("7", "<answer>x = 7</answer>", 1.0),
        ("\\frac{1}{2}", "<answer>\\boxed{\\frac{1}{3}}</answer>", 0.0),
        ("3\\sqrt{2}", "<answer>\\boxed{3\\sqrt{3}}</answer>", 0.0),
        ("7", "x = 7", 0.0),  # no final answer format
        ("7", "<answer>\\boxed{7</answer>", 0.0),  # unbalanced box: math-verify extracts nothing
        ("7", "\\boxed{", 0.0),
        ("7", "", 0.0),
    ],
)
def test_reward_cases(gold, completion, expected, capsys):
    _needs_math_verify()
    assert math500.reward(["p"], [completion], answer=[gold]) == [expected]
    assert capsys.readouterr() == ("", "")


def test_prediction_text():
    assert math500.prediction_text("<answer>\\boxed{2}</answer>") == "\\boxed{2}"
    assert math500.prediction_text("<answer> x = 2 </answer>") == "x = 2"
    assert math500.prediction_text("<answer></answer>") is None and math500.prediction_text("2") is None


def test_oversized_answer_is_not_parsed():
    long = "<answer>\\boxed{" + "1+" * 2000 + "1}</answer>"
    assert math500.reward(["p"], [long], answer=["2001"]) == [0.0]


def test_works_outside_the_main_thread(capsys):
    """signal-based timeouts are main-thread only: elsewhere the reward runs without one instead of failing."""
    _needs_math_verify()
    out = []
    thread = threading.Thread(target=lambda: out.append(math500.reward(["p"], ["\\boxed{0.5}"], answer=["\\frac12"])))
    thread.start()
    thread.join()
    assert out == [[1.0]]
    assert capsys.readouterr() == ("", "")
