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
    assert task.reward is digits.reward and task.use_chat_template  # the tiny tokenizer's chat template wraps it


def test_length_range_reaches_the_study_testbed():
    assert len(digits.load("test", limit=5, config=digits.DigitsConfig(length=32))[0]["digits"]) == 32
    with pytest.raises(ValueError, match="2..32"):
        digits.DigitsConfig(length=33)


def test_default_sft_puts_eos_where_the_reference_does():
    """The default preset's SFT warm-up (its steps, batch, lr, chat-wrapped prompts) teaches the stop token: greedy
    completions of held-out prompts end with EOS exactly after the 4th digit, as the reference completion does
    (before the fix: 20 steps, raw prompts; completions stopped early, and RL then learned a 5th digit)."""
    import torch

    from dllm_ais.analysis.evaluate import eval_sampler
    from dllm_ais.models.llada.backend import build_backend as _llada_backend
    from dllm_ais.models.load import encode_prompts
    from dllm_ais.models.tiny import tiny_model, tiny_tokenizer
    from dllm_ais.presets import get_preset
    from dllm_ais.train.job import _sft_pairs
    from dllm_ais.train.sft import warm_up

    preset = get_preset("tiny-cpu")
    tc = preset.train
    tok = tiny_tokenizer()
    model = tiny_model(seed=tc.seed)
    backend = _llada_backend(preset.sampler, model, tok, tc)
    pairs = _sft_pairs(tc.task, 20_000, tc.seed, tc.task_config)
    warm_up(model, tok, pairs, tc.sft_steps, tc.sft_batch_size, tc.sft_learning_rate, preset.sampler.gen_length,
            backend.sft_loss, tok.eos_token_id, tc.seed, chat=get_task("digits").use_chat_template)
    rows = digits.load("test", limit=64, config=digits.DigitsConfig(**tc.task_config))
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], chat=True)
    greedy = _llada_backend(eval_sampler(preset), model, tok)
    with torch.no_grad():
        out = greedy.sample(model, ids, mask, torch.Generator().manual_seed(0))
    eos = tok.eos_token_id
    reference = [tok(r["answer"], add_special_tokens=False)["input_ids"] + [eos] for r in rows]  # 4 digits, EOS
    first_eos = [row.tolist().index(eos) if eos in row.tolist() else -1 for row in out.completion_ids]
    assert all(len(ref) == 5 and ref.index(eos) == 4 for ref in reference)
    at_reference = sum(k == 4 for k in first_eos) / len(rows)
    assert at_reference >= 0.9, f"EOS at the reference position in only {at_reference:.2f} of completions"
    strict = digits.accuracy(None, [tok.decode(c[k], skip_special_tokens=True)
                                    for c, k in zip(out.completion_ids, out.completion_mask, strict=True)],
                             answer=[r["answer"] for r in rows])
    assert sum(strict) / len(rows) > 0.0  # some completions exactly right (the strict metric is not stuck at 0)
