"""Dream's sampler (models/dream/sampler.py) against Dream's official code: T = 0 generations of `diffusion_generate`
and of Fast-dLLM's cached Dream generate (token for token, NFE for NFE) and ≥ 20,000 draws at T > 0 (two-sample G-test
of the completions against the official code's frequencies), all recorded by the official code on the tiny official
checkpoint tests/fixtures/dream_tiny/ (tests/fixtures/dream_generate.md says how); the schedule, the tie
rule, the record and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dream_helpers import UniqueRows, completion_counts, g_test_two_sample

from dllm_ais.models.dream.checkpoint import load_dream
from dllm_ais.models.dream.sampler import DreamSamplerConfig, dream_sample
from dllm_ais.models.dream.selection import DreamRule, proposal_logprob, scheduled_count
from dllm_ais.models.kv_cache import KVCache

FIXTURES = Path(__file__).parent / "fixtures"
CKPT = FIXTURES / "dream_tiny"
RECORD = json.loads((FIXTURES / "dream_generate.json").read_text())


@pytest.fixture(scope="module")
def model():
    return load_dream(CKPT, dtype=torch.float32)


def config_of(entry: dict) -> DreamSamplerConfig:
    """The official call's kwargs as our config (Fast-dLLM's alg 'confidence_threshold' = maskgit_plus + τ)."""
    s = dict(entry["settings"])
    threshold = s.pop("threshold", None) if s.get("alg") == "confidence_threshold" else None
    if s.get("alg") == "confidence_threshold":
        s["alg"] = "maskgit_plus"
    s.pop("threshold", None)
    return DreamSamplerConfig(cache=entry["cache"], threshold=threshold, **s)


@pytest.mark.parametrize("entry", RECORD["generate"], ids=lambda e: e["name"])
def test_greedy_generation_equals_official(model, entry):
    assert entry["ties"] == 0, "the fixture must be tie-free (torch.topk breaks ties arbitrarily)"
    ids, mask = torch.tensor(entry["prompt_ids"]), torch.tensor(entry["prompt_mask"]).bool()
    r = dream_sample(model, ids, mask, config_of(entry), model.mask_token_id, [model.config.eos_token_id])
    assert r.completion_ids.tolist() == entry["completion"]
    assert r.nfe == entry["nfe"] == r.num_steps
    assert bool((r.commit_step >= 0).all()) and int(r.commit_step.max()) < r.nfe


@pytest.mark.slow
@pytest.mark.parametrize("entry", RECORD["draws"], ids=lambda e: e["name"])
def test_draws_match_official_frequencies(model, entry):
    """20,000 of our draws against the official code's 20,000: the completions' laws are equal (G-test)."""
    n = entry["draws"]
    assert n >= 20_000
    ids = torch.tensor(entry["prompt_ids"]).expand(n, -1)
    sampler_model = model if entry["cache"] != "none" else UniqueRows(model)
    r = dream_sample(sampler_model, ids, torch.ones_like(ids, dtype=torch.bool), config_of(entry), model.mask_token_id,
                     [model.config.eos_token_id], generator=torch.Generator().manual_seed(123))
    ours = completion_counts(r.completion_ids)
    keys = sorted(set(ours) | set(entry["counts"]))
    a = torch.tensor([ours.get(k, 0) for k in keys])
    b = torch.tensor([entry["counts"].get(k, 0) for k in keys])
    G, df, p = g_test_two_sample(a, b)
    assert df >= 3, "the setting must have several outcomes"
    assert p > 0.01, f"G={G:.1f} df={df} p={p:.4f}"


def test_g_test_detects_a_wrong_law(model):
    """The same test rejects a sampler with another temperature against the official maskgit_plus draws."""
    entry = next(e for e in RECORD["draws"] if e["name"].startswith("maskgit_plus"))
    wrong = dict(entry, settings=dict(entry["settings"], temperature=0.7))
    n = 5_000
    ids = torch.tensor(entry["prompt_ids"]).expand(n, -1)
    r = dream_sample(UniqueRows(model), ids, torch.ones_like(ids, dtype=torch.bool), config_of(wrong),
                     model.mask_token_id, [], generator=torch.Generator().manual_seed(0))
    ours = completion_counts(r.completion_ids)
    keys = sorted(set(ours) | set(entry["counts"]))
    a = torch.tensor([ours.get(k, 0) for k in keys]) * (entry["draws"] // n)
    b = torch.tensor([entry["counts"].get(k, 0) for k in keys])
    assert g_test_two_sample(a, b)[2] < 1e-6


def test_schedule_counts(model):
    """steps = L: the first step commits nothing; step i commits int(L_masked · (1 − s/t)); the last the rest."""
    L = 8
    cfg = DreamSamplerConfig(gen_length=L, steps=L, alg="maskgit_plus")
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    r = dream_sample(model, ids, torch.ones_like(ids, dtype=torch.bool), cfg, model.mask_token_id, [])
    per_step = torch.stack([(r.commit_step == t).sum(-1) for t in range(L)], dim=1)  # [B, L]
    left, expected = L, []
    for i in range(L):
        k = scheduled_count(torch.ones(1, left, dtype=torch.bool), i, L, cfg.eps)
        expected.append(k)
        left -= k
    assert expected[0] == 0 and sum(expected) == L
    assert per_step.tolist() == [expected, expected]


class FixedLogits(torch.nn.Module):
    """A 'model' whose raw logits are a fixed table [T, V] (the same for every row and canvas)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask=None, positions=None, **_):
        out = self.table.expand(input_ids.shape[0], -1, -1)
        return type("Out", (), {"logits": out[:, positions] if positions is not None else out})()


def test_exact_ties_go_to_the_lower_position():
    """With top_p keeping one token everywhere every confidence is exactly 1: the lowest positions commit first."""
    V, P, L = 6, 2, 6
    table = torch.zeros(P + L, V)
    table[:, 3] = 9.0  # one dominant token: top_p = 0.5 keeps it alone, p = 1 exactly
    for alg in ("maskgit_plus", "topk_margin", "entropy"):
        cfg = DreamSamplerConfig(gen_length=L, steps=3, alg=alg, top_p=0.5)
        r = dream_sample(FixedLogits(table), torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.bool), cfg,
                         mask_token_id=5, stop_token_ids=[])
        steps = r.commit_step[0].tolist()
        assert steps == sorted(steps), (alg, steps)  # position order = commit order
        assert r.completion_ids.eq(3).all()


def test_record_matches_replay(model):
    """logp_rollout = log q of the filtered proposal on the canvas each token was committed from; the mask id is
    never proposed; commit_confidence is q of the drawn token."""
    cfg = DreamSamplerConfig(gen_length=6, steps=3, alg="maskgit_plus", temperature=1.0, top_p=0.9, top_k=10)
    ids = torch.tensor([[3, 7, 9, 11], [91, 91, 12, 13]])
    mask = ids != 91
    r = dream_sample(model, ids, mask, cfg, model.mask_token_id, [], generator=torch.Generator().manual_seed(0))
    assert not bool((r.completion_ids == model.mask_token_id).any())
    rule = DreamRule.of(cfg, model.mask_token_id)
    P = ids.shape[1]
    for t in range(cfg.steps):
        done = (r.commit_step < t) & (r.commit_step >= 0)
        canvas = torch.cat([ids, torch.where(done, r.completion_ids, model.mask_token_id)], 1)
        attn = torch.cat([mask, torch.ones_like(done)], 1)
        logits = model(canvas, attn, positions=slice(P - 1, P + cfg.gen_length - 1)).logits
        lp = proposal_logprob(logits, r.completion_ids, rule).float()
        hit = r.commit_step == t
        torch.testing.assert_close(r.logp_rollout[hit], lp[hit], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r.commit_confidence[hit], lp[hit].exp(), rtol=1e-5, atol=1e-6)


def _one_line(err) -> None:
    assert "\n" not in str(err.value) and str(err.value)


def test_bad_input_refused_in_one_line(model):
    with pytest.raises(ValueError) as e:
        DreamSamplerConfig(alg="low_confidence")
    _one_line(e)
    assert "alg" in str(e.value)
    with pytest.raises(ValueError) as e:
        DreamSamplerConfig(alg_temp=-0.1)
    _one_line(e)
    with pytest.raises(ValueError) as e:
        DreamSamplerConfig(threshold=0.9)  # the default alg, entropy: threshold decoding reads maskgit_plus
    _one_line(e)
    assert "--dream-alg maskgit_plus" in str(e.value)
    with pytest.raises(ValueError) as e:
        DreamSamplerConfig(gen_length=6, steps=4, alg="maskgit_plus", threshold=0.9)  # Fast-dLLM asserts L % steps
    _one_line(e)
    assert "divisible by steps" in str(e.value)
    with pytest.raises(ValueError) as e:
        DreamSamplerConfig(gen_length=8, steps=4, cache="dual", block_length=4, alg="origin")
    _one_line(e)
    with pytest.raises(ValueError) as e:
        DreamSamplerConfig(gen_length=8, steps=2, cache="prefix", block_length=4)  # one step per block
    _one_line(e)
    cfg = DreamSamplerConfig(gen_length=8, steps=4, cache="dual", block_length=4)
    ids = torch.tensor([[5, 6], [7, 8], [9, 10]])
    small = KVCache.for_model(model, 2, ids.shape[1] + 8)  # a cache for 2 rows, 3 asked
    with pytest.raises(ValueError) as e:
        dream_sample(model, ids, torch.ones_like(ids, dtype=torch.bool), cfg, model.mask_token_id, [],
                     kv_cache=small)
    _one_line(e)
    assert "cache" in str(e.value)


@pytest.mark.parametrize("cache,threshold", [("none", None), ("prefix", None), ("dual", None), ("dual", 0.4),
                                             ("none", 0.4)])
def test_left_padding_changes_nothing(model, cache, threshold):
    """A left-padded batch generates what each row generates alone, unpadded, cached windows included (Fast-dLLM's
    cached windows mis-slice the 4-D mask under padding; ours attend over the padded canvas correctly)."""
    alg = "maskgit_plus" if threshold is not None else "entropy"
    block = 4 if cache != "none" else None
    cfg = DreamSamplerConfig(gen_length=8, steps=4, alg=alg, cache=cache, block_length=block, threshold=threshold,
                             top_k=3)
    rows = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33]]
    P = max(map(len, rows))
    pad = model.config.pad_token_id
    ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows])
    mask = ids != pad
    batch = dream_sample(model, ids, mask, cfg, model.mask_token_id, [])
    for b, r in enumerate(rows):
        alone = dream_sample(model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.bool), cfg,
                             model.mask_token_id, [])
        assert batch.completion_ids[b].tolist() == alone.completion_ids[0].tolist()
        if threshold is None or cache == "none":  # the same steps too (cached threshold rows wait for each other)
            assert batch.commit_step[b].tolist() == alone.commit_step[0].tolist()


def test_the_default_schedule_is_the_official_one():
    """DreamSamplerConfig's defaults give Dream's own schedule, pinned to numbers recorded from the official code
    (tests/fixtures/dream_threshold.json "defaults": DreamGenerationConfig's eps 1e-3, its timesteps and origin's move
    probabilities for 8 steps). The top-k counts hardly see eps (none differ between 1e-3 and 1e-2 up to L = 40):
    the timesteps and the move probabilities do, so a changed default fails here."""
    from dllm_ais.models.dream.selection import move_probability, timesteps

    official = json.loads((FIXTURES / "dream_threshold.json").read_text())["defaults"]
    ours = DreamSamplerConfig()
    assert ours.eps == official["eps"]
    assert timesteps(8, ours.eps).tolist() == official["timesteps_8"]
    assert [move_probability(i, 8, ours.eps) for i in range(8)] == official["p_transfer_8"]


def test_top_p_is_applied_before_top_k():
    """Dream's order (generation_utils.py `sample_tokens`): logits / T, then top_p, then top_k. With probabilities
    0.30, 0.25, 0.20, 0.15, 0.10, top_p 0.45 then top_k 2 keeps tokens {0, 1} (0.30 < 0.45, the crossing token kept);
    top_k 2 first would renormalise to 0.545, 0.455 and top_p 0.45 would keep {0} alone."""
    from dllm_ais.models.dream.selection import filter_logits

    logits = torch.log(torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10, 0.0]]))  # the mask token (id 5) last
    rule = DreamRule("maskgit_plus", 1.0, mask_token_id=5, top_p=0.45, top_k=2)
    kept = filter_logits(logits, rule) > torch.finfo(torch.float32).min
    assert kept[0].tolist() == [True, True, False, False, False, False]
    assert float(torch.softmax(logits[:, :2], -1)[0, 0]) > 0.45  # (so the other order would differ)


@pytest.mark.parametrize("alg", ["entropy", "topk_margin"])
def test_alg_temp_draws_the_positions(alg):
    """alg_temp > 0 draws the committed positions from softmax(confidence / alg_temp) (generation_utils.py: multinomial)
    instead of taking the most confident: on fixed logits whose confidences rank the positions 0 > 1 > 2 > 3, one
    position per step, alg_temp 0 always commits position 0 first; alg_temp 1 commits another first in many rows, at
    the frequency softmax(confidence) gives the first draw."""
    from dllm_ais.models.dream.selection import filter_logits, token_confidence

    V, P, L, n = 6, 2, 4, 2000
    table = torch.zeros(P + L, V)
    for j, sharp in enumerate((4.0, 3.0, 2.0, 1.0)):  # raw row P - 1 + j predicts position j (Dream's shift)
        table[P - 1 + j, 3] = sharp
    ids, mask = torch.tensor([[1, 2]]).expand(n, -1), torch.ones(n, 2, dtype=torch.bool)
    firsts = {}
    for alg_temp in (0.0, 1.0):
        cfg = DreamSamplerConfig(gen_length=L, steps=4, alg=alg, alg_temp=alg_temp, temperature=1.0)
        r = dream_sample(FixedLogits(table), ids, mask, cfg, mask_token_id=5, stop_token_ids=[],
                         generator=torch.Generator().manual_seed(0))
        firsts[alg_temp] = (r.commit_step == r.commit_step.min(-1, keepdim=True).values).float()[:, :].mean(0)
    assert firsts[0.0].tolist() == [1.0, 0.0, 0.0, 0.0]
    rule = DreamRule(alg, 1.0, 5)
    probs = torch.softmax(filter_logits(table[P - 1:P + L - 1][None], rule), -1)[0]
    conf = token_confidence(probs, probs.argmax(-1), alg)  # independent of the drawn tokens for these algs
    expected = torch.softmax(conf / 1.0, -1)
    assert torch.allclose(firsts[1.0], expected, atol=0.04), (firsts[1.0], expected)
    assert float(firsts[1.0][0]) < 0.9


def test_the_two_sample_g_test_takes_unequal_totals():
    """Homogeneous samples of different sizes are not rejected; a shifted one is; equal totals give the classic
    statistic (expected = half the pooled count)."""
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    a = torch.bincount(torch.multinomial(probs, 10_000, True, generator=g), minlength=4)
    b = torch.bincount(torch.multinomial(probs, 20_000, True, generator=g), minlength=4)
    shifted = torch.bincount(torch.multinomial(torch.tensor([0.45, 0.35, 0.15, 0.05]), 20_000, True, generator=g),
                             minlength=4)
    assert g_test_two_sample(a, b)[2] > 0.01 and g_test_two_sample(a, shifted)[2] < 1e-6
    c, d = torch.tensor([30, 70]), torch.tensor([50, 50])
    e = (c + d).double() / 2
    classic = 2 * float((c * (c / e).log()).sum() + (d * (d / e).log()).sum())
    assert abs(g_test_two_sample(c, d)[0] - classic) < 1e-9
