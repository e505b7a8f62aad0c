"""Final-answer extraction shared by the math tasks."""

from __future__ import annotations

from fractions import Fraction

from dllm_ais.tasks.extract import answer_span, final_answer, last_boxed, last_number, parse_number


def test_answer_span_takes_the_last_and_tolerates_a_missing_close():
    assert answer_span("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert answer_span("reasoning <answer> 42") == "42"
    assert answer_span("no tags") is None


def test_last_boxed_balances_braces():
    assert last_boxed(r"\boxed{1} and \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\fbox{3}") == "3"
    assert last_boxed(r"\boxed{\frac{1}{2}") is None  # ran out of tokens
    assert last_boxed("none") is None


def test_final_answer_prefers_box_inside_answer():
    assert final_answer(r"<answer>so \boxed{7}</answer>") == "7"
    assert final_answer("<answer>the answer is 7</answer>") == "the answer is 7"
    assert final_answer(r"work... \boxed{8}") == "8"
    assert final_answer("just 9") is None


def test_numbers():
    assert parse_number("1,000") == 1000 and parse_number(" -3.50 ") == Fraction(-7, 2) and parse_number("$18") == 18
    assert parse_number("12 apples") is None and parse_number("") is None
    assert last_number("5 - 3 = 2, so 1,250.5 dollars.") == Fraction(2501, 2)
    assert last_number("x = -4") == -4 and last_number("9-4") == 4
    assert last_number("no digits") is None
