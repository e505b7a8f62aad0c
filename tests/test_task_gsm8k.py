"""GSM8K reward: exact numeric match of the final answer."""

from __future__ import annotations

import pytest

from dllm_ais.tasks import gsm8k


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<reasoning>3*12=36, 36-9=27</reasoning>\n<answer>\n\\boxed{27}\n</answer>", 1.0),
        ("<answer>27</answer>", 1.0),
        ("<answer>The answer is 27 pencils.</answer>", 1.0),
        ("<answer>$27.00</answer>", 1.0),
        ("36 - 9 = 27, so \\boxed{27}", 1.0),
        ("<answer>\\boxed{26}</answer>", 0.0),
        ("<answer>\\boxed{27}</answer> wait <answer>28</answer>", 0.0),  # the last answer counts
        ("36 - 9 = 27", 0.0),  # no <answer> or \boxed: no final answer
        ("<answer>", 0.0),
        ("", 0.0),
    ],
)
def test_reward_cases(completion, expected):
    assert gsm8k.reward(["p"], [completion], answer=["27"]) == [expected]


def test_commas_and_thousands():
    assert gsm8k.reward(
        ["p"] * 3, ["<answer>1,200</answer>", "<answer>1200</answer>", "<answer>12,00</answer>"], answer=["1200"] * 3
    ) == [1.0, 1.0, 0.0]


def test_gold_answer_parsing():
    assert gsm8k.gold_answer("work\n#### 1,200") == "1200"
    assert gsm8k.gold_answer("#### -5") == "-5" and gsm8k.gold_answer("7") == "7"
    assert gsm8k.gold_answer("#### 2.5") == "2.5"
    assert gsm8k.gold_answer("#### seven") is None


def test_prompt_asks_for_the_answer_format():
    prompt = gsm8k.build_prompt({"question": "  What is 2+2? "})
    assert "<answer>" in prompt and "\\boxed{" in prompt and prompt.endswith("What is 2+2?")
