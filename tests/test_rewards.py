"""Reward functions are called as TRL's GRPOTrainer calls them: keywords, conversational messages, None, weights."""

import math
import re

import pytest
import torch

from dllm_ais.train.rewards import RewardFailure, RewardSet, StepSkipped, TrainerState, compute_rewards

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


# ------------------------------------------------------------------ TRL's conversational rule on the CPU default
def test_is_conversational_follows_trls_rule():
    from dllm_ais.train.rewards import conversational_form, is_conversational

    assert is_conversational({"prompt": [{"role": "user", "content": "hi"}]})
    assert is_conversational({"messages": [{"role": "user", "content": "hi"}], "prompt": None})
    assert not is_conversational({"prompt": "hi"}) and not is_conversational({"prompt": []})
    assert not is_conversational({"prompt": [{"content": "no role"}]})
    assert conversational_form([{"prompt": "hi"}], chat_template_applied=True)  # the model saw a conversation
    assert not conversational_form([{"prompt": "hi"}], chat_template_applied=False)
    assert conversational_form([{"prompt": [{"role": "user", "content": "hi"}]}], chat_template_applied=False)


def test_tiny_tokenizer_has_lladas_chat_template():
    from transformers import AutoTokenizer

    from dllm_ais.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": " 3817> "}], add_generation_prompt=True,
                                   tokenize=False)
    expected = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n3817><|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")  # LLaDA-8B-Instruct's format, content trimmed
    assert text == expected
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [tok.bos_token_id, tok.convert_tokens_to_ids("<|start_header_id|>")] and max(ids) < 128
    assert tok.convert_tokens_to_ids("3") == 8  # the character ids of earlier checkpoints are unchanged
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d)
        again = AutoTokenizer.from_pretrained(d)
        assert again.apply_chat_template([{"role": "user", "content": "3817>"}], add_generation_prompt=True,
                                         tokenize=False) == expected


THINK_MODULE = '''
import re

def think_format_reward(completions: list[list[dict[str, str]]], **kwargs) -> list[float]:
    # the signature and message access of TRL 1.16's think_format_reward, with our own body
    return [1.0 if re.match(r"^<think>(?!.*<think>)(.*?)</think>.*$", c[0]["content"], re.DOTALL) else 0.0
            for c in completions]
'''


def _train_default_with(reward_fn: str, out) -> list[dict]:
    from dllm_ais import metrics as M
    from dllm_ais.cli import main

    assert main(["train", "--out", str(out), "--reward-fn", reward_fn, "--steps", "2", "--sft-steps", "0",
                 "--no-progress", "--threads", "1"]) == 0
    return M.read_metrics(out)


def test_trl_style_think_format_reward_runs_on_the_default(tmp_path, monkeypatch):
    """The default preset (tiny LLaDA, digits, chat template) passes TRL's conversational completions: a function
    that indexes completion[0]["content"] works (before: 'string indices must be integers', every step skipped)."""
    from dllm_ais import metrics as M

    name = f"think_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(THINK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = _train_default_with(f"{name}:think_format_reward", tmp_path / "run")
    assert len(rows) == 2 and all(r[M.REWARD_ERRORS] == 0.0 for r in rows)
    assert all(r[M.REWARD_MEAN] == 0.0 for r in rows)  # digit strings never open with <think>: scored 0, not skipped


def test_trls_own_think_format_reward_on_the_default(tmp_path):
    pytest.importorskip("trl.rewards", reason="optional extra: pip install -e '.[trl]'")
    from dllm_ais import metrics as M

    rows = _train_default_with("trl.rewards:think_format_reward", tmp_path / "run")
    assert len(rows) == 2 and all(r[M.REWARD_ERRORS] == 0.0 for r in rows)
