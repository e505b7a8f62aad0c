"""Reward functions are called as TRL's GRPOTrainer calls them: keywords, conversational messages, None, weights."""

import math
import re

import pytest
import torch

from dllm_ais.rewards import RewardFailure, RewardSet, StepSkipped, TrainerState, compute_rewards

PROMPTS = ["What is 1/3 as a fraction?", "Say 2."]
COMPLETIONS = ["<think>\nhm\n</think>\nMy answer is \\boxed{\\frac{1}{3}}", "<think>\nno close tag. \\boxed{3}"]
ROWS = [{"prompt": PROMPTS[0], "solution": "\\frac{1}{3}"}, {"prompt": PROMPTS[1], "solution": "2"}]


# Copies of the SIGNATURES of TRL 1.16's built-ins (trl/rewards/{accuracy,format}_rewards.py), with bodies of our
# own: they fail exactly where ours would have called them wrongly (positionally, or with plain strings).
def accuracy_reward_copy(completions: list[list[dict[str, str]]], solution: list[str], log_extra=None,
                         **kwargs) -> list[float | None]:
    out = []
    for completion, gold in zip(completions, solution, strict=True):
        content = completion[0]["content"]  # a message list, as TRL passes conversational completions
        if not gold:
            out.append(None)  # gold not parseable: not applicable
            continue
        boxed = re.findall(r"\\boxed\{(.*)\}", content)
        out.append(1.0 if boxed and boxed[-1] == gold else 0.0)
    return out


def think_format_reward_copy(completions: list[list[dict[str, str]]], **kwargs) -> list[float]:
    return [1.0 if re.match(r"^<think>(?!.*<think>)(.*?)</think>.*$", c[0]["content"], re.DOTALL) else 0.0
            for c in completions]


def test_trl_signature_copies_get_conversational_keyword_calls():
    rewards = RewardSet([accuracy_reward_copy, think_format_reward_copy])
    out = rewards(PROMPTS, COMPLETIONS, ROWS, conversational=True)
    assert out.total.tolist() == [2.0, 0.0]
    assert out.per_function == {"accuracy_reward_copy": 0.5, "think_format_reward_copy": 0.5}


def test_keyword_only_function_receives_everything_trl_passes():
    seen = {}

    def fn(*, prompts, completions, completion_ids, trainer_state, solution, log_extra, log_metric, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, state=trainer_state,
                    solution=solution, extra=kwargs)
        return [0.5] * len(completions)

    state = TrainerState(global_step=3, max_steps=10)
    out = RewardSet([fn])(PROMPTS, COMPLETIONS, ROWS, completion_ids=[[5, 6], [7]], trainer_state=state)
    assert out.total.tolist() == [0.5, 0.5]
    assert seen["prompts"] == PROMPTS and seen["completions"] == COMPLETIONS  # plain strings when not conversational
    assert seen["completion_ids"] == [[5, 6], [7]] and seen["state"].global_step == 3
    assert seen["solution"] == ["\\frac{1}{3}", "2"] and seen["extra"] == {}  # "prompt" is not passed as a column


def test_conversational_messages_have_trl_roles():
    seen = {}

    def fn(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [0.0, 0.0]

    RewardSet([fn])(PROMPTS, COMPLETIONS, ROWS, conversational=True)
    assert seen["prompts"][1] == [{"role": "user", "content": "Say 2."}]
    assert seen["completions"][0] == [{"role": "assistant", "content": COMPLETIONS[0]}]


def test_none_means_not_applicable_and_weights_combine_like_trl():
    def a(completions, **kw):
        return [None, 1.0]

    def b(completions, **kw):
        return [0.25, float("nan")]

    out = RewardSet([a, b], weights=[2.0, 4.0])(PROMPTS, COMPLETIONS, ROWS)
    assert out.total.tolist() == [1.0, 2.0]  # nansum: None/NaN entries are ignored, the step is kept
    assert out.per_function == {"a": 1.0, "b": 0.25}  # means over the samples each function scored

    def none(completions, **kw):
        return [None, None]

    out = RewardSet([none])(PROMPTS, COMPLETIONS, ROWS)
    assert out.total.tolist() == [0.0, 0.0] and math.isnan(out.per_function["none"])


@pytest.mark.parametrize("fn,match", [
    (lambda completions, **kw: 1 / 0, "reward function <lambda> raised ZeroDivisionError"),
    (lambda completions, **kw: [1.0], "returned 1 values for 2 completions"),
    (lambda completions, **kw: [1.0, float("inf")], "returned inf"),
])
def test_failures_skip_the_step_naming_the_function(fn, match):
    with pytest.raises(StepSkipped, match=match):
        compute_rewards(fn, PROMPTS, COMPLETIONS, ROWS)


def test_consecutive_failures_stop_training():
    rewards = RewardSet([think_format_reward_copy], max_consecutive_failures=3)
    rewards.record(True, ValueError("x"))
    rewards.record(True, ValueError("x"))
    rewards.record(False)  # a good step resets the count
    rewards.record(True, ValueError("x"))
    rewards.record(True, ValueError("x"))
    with pytest.raises(RewardFailure, match="3 consecutive steps.*Last error: boom"):
        rewards.record(True, ValueError("boom"))


def test_weights_must_match_functions():
    with pytest.raises(ValueError, match="--reward-weights has 1 value"):
        RewardSet([think_format_reward_copy, accuracy_reward_copy], weights=[1.0])


def test_trl_builtins_work_when_trl_is_installed():
    trl_rewards = pytest.importorskip("trl.rewards", reason="optional extra: pip install -e '.[trl]'")
    pytest.importorskip("math_verify", reason="TRL's accuracy_reward needs math-verify")
    rewards = RewardSet([trl_rewards.accuracy_reward, trl_rewards.think_format_reward])
    out = rewards(PROMPTS, COMPLETIONS, ROWS, conversational=True, completion_ids=[[1], [2]],
                  trainer_state=TrainerState(0, 1))
    assert out.total.tolist() == [2.0, 0.0]
    assert out.per_function == {"accuracy_reward": 0.5, "think_format_reward": 0.5}


def test_plain_callable_is_a_set_of_one():
    out = compute_rewards(lambda completions, **kw: [1.0, 3.0], PROMPTS, COMPLETIONS, ROWS)
    assert torch.equal(out, torch.tensor([1.0, 3.0]))
