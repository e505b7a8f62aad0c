"""Fast-dLLM's uncached Dream threshold decoding (models/dream/sampler.py, cache none + threshold) against Fast-dLLM's
own `dream/model/generation_utils.py` (alg "confidence_threshold") on the tiny official checkpoint: T = 0 generations
token for token and NFE for NFE — runs where the last step adds forwards, where every quota fills, and one whose
confidences equal τ exactly — and 20,000 draws at T > 0 (tests/fixtures/dream_threshold.json, recorded by
scripts/record_dream_threshold.py; tests/fixtures/dream_generate.md says how). The bookkeeping (`ThresholdQuota`)
against a hand count of the official loop, and equality at τ (Fast-dLLM drops a token only below τ)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dream_helpers import UniqueRows, completion_counts, g_test_two_sample
from test_dream_sampler import FixedLogits

from dllm_ais.models.dream.checkpoint import load_dream
from dllm_ais.models.dream.sampler import DreamSamplerConfig, dream_sample
from dllm_ais.models.dream.selection import ThresholdQuota, threshold_quotas

FIXTURES = Path(__file__).parent / "fixtures"
RECORD = json.loads((FIXTURES / "dream_threshold.json").read_text())


@pytest.fixture(scope="module")
def model():
    return load_dream(FIXTURES / "dream_tiny", dtype=torch.float32)


def config_of(entry: dict) -> DreamSamplerConfig:
    """Fast-dLLM's alg "confidence_threshold" = maskgit_plus confidences + τ, no cache."""
    return DreamSamplerConfig(alg="maskgit_plus", **entry["settings"])


@pytest.mark.parametrize("entry", RECORD["generate"], ids=lambda e: e["name"])
def test_greedy_generation_equals_fast_dllm(model, entry):
    assert entry["decisive_ties"] == 0, "the fixture must not depend on torch.topk's tie order"
    ids = torch.tensor(entry["prompt_ids"])
    r = dream_sample(model, ids, torch.ones_like(ids, dtype=torch.bool), config_of(entry), model.mask_token_id,
                     [model.config.eos_token_id])
    assert r.completion_ids.tolist() == entry["completion"]
    assert r.nfe == entry["nfe"] == r.num_steps
    per_step = torch.bincount(r.commit_step[0], minlength=r.nfe)
    assert bool((per_step >= 1).all()), "every forward commits the most confident position"


def test_the_fixtures_cover_extended_runs_full_quotas_and_equality():
    """The record holds runs whose last step added forwards (NFE > steps), one where NFE = steps, and the one whose
    every confidence is exactly τ = 1 (top_k 1): everything commits in its one step (with `>` it would take 6)."""
    nfe = {e["name"]: (e["nfe"], e["settings"]["steps"]) for e in RECORD["generate"]}
    assert nfe["last-step-adds-forwards"][0] > nfe["last-step-adds-forwards"][1]
    assert nfe["low-tau-fills-each-quota"][0] == nfe["low-tau-fills-each-quota"][1]
    assert nfe["confidence-equals-tau"] == (1, 1)


def test_quota_bookkeeping_follows_the_official_loop():
    """By hand from generation_utils.py `_sample` (L = 6, steps = 2: quota 3): step 0 commits 1 (2 carried, quota of
    step 1 = 5); step 1, the last, commits 2: one step is added (no fresh quota, 3 carried); step 2 commits 3: done."""
    q = ThresholdQuota(1, 6, 2)
    quotas = []
    for count in (1, 2, 3):
        quotas.append(int(q.quota()))
        q.update(torch.tensor([count]))
    assert quotas == [3, 5, 3] and int(q.end) == 3 and bool(q.done.all()) and int(q.quota()) == 0
    cs = torch.tensor([[0, 1, 1, 2, 2, 2]])  # the same counts as commit steps: the replay's bookkeeping agrees
    got, end = threshold_quotas(cs, 6, 2)
    assert got[0, :3].tolist() == [3, 5, 3] and end.tolist() == [3]
    q = ThresholdQuota(1, 6, 2)  # a last step that fills its quota ends the run at `steps` forwards
    for count in (2, 4):
        q.update(torch.tensor([count]))
    assert bool(q.done.all()) and int(q.end) == 2


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_a_confidence_equal_to_tau_commits(cache):
    """Two tokens tied at probability exactly 0.5 (top_k 2) and τ = 0.5: Fast-dLLM keeps a token unless its
    confidence < τ, so every masked position commits at the first threshold step — uncached: all 4 in one forward
    (with `>` only the most confident would, and three more forwards would follow); cached: the block's 3 masks left
    after the refresh commit at its first window step."""
    V, P, L = 6, 2, 4
    table = torch.zeros(P + L, V)
    table[:, 1] = table[:, 2] = 5.0
    block = None if cache == "none" else L
    cfg = DreamSamplerConfig(gen_length=L, steps=1 if cache == "none" else 2, alg="maskgit_plus", top_k=2,
                             threshold=0.5, cache=cache, block_length=block)
    if cache == "none":
        model = FixedLogits(table)
    else:  # a cached forward needs a real model (its K/V cache): its logits replaced by the table's rows
        from dllm_ais.models.tiny import tiny_dream_model

        model = tiny_dream_model(seed=0, vocab_size=V)
        model.lm_head.register_forward_hook(lambda _m, _i, out: table[:1].expand_as(out).clone())
    r = dream_sample(model, torch.tensor([[3, 4]]), torch.ones(1, 2, dtype=torch.bool), cfg, mask_token_id=5,
                     stop_token_ids=[])
    assert float(r.commit_confidence.min()) == 0.5  # exactly τ
    assert r.commit_step[0].tolist() == ([0] * L if cache == "none" else [0, 1, 1, 1]), r.commit_step
    assert r.nfe == (1 if cache == "none" else 2)


@pytest.mark.slow
@pytest.mark.parametrize("entry", RECORD["draws"], ids=lambda e: e["name"])
def test_draws_match_fast_dllm_frequencies(model, entry):
    """20,000 of our draws (one batch) against 20,000 one-row Fast-dLLM calls: the completions' laws are equal
    (G-test), and so are the NFE distributions."""
    n = entry["draws"]
    assert n >= 20_000
    ids = torch.tensor(entry["prompt_ids"]).expand(n, -1)
    r = dream_sample(UniqueRows(model), ids, torch.ones_like(ids, dtype=torch.bool), config_of(entry),
                     model.mask_token_id, [], generator=torch.Generator().manual_seed(5))
    ours = completion_counts(r.completion_ids)
    keys = sorted(set(ours) | set(entry["counts"]))
    G, df, p = g_test_two_sample(torch.tensor([ours.get(k, 0) for k in keys]),
                                 torch.tensor([entry["counts"].get(k, 0) for k in keys]))
    assert df >= 10 and p > 0.01, f"G={G:.1f} df={df} p={p:.4f}"
    _, end = threshold_quotas(r.commit_step, r.completion_ids.shape[1], entry["settings"]["steps"])
    nfes = sorted(set(map(int, entry["nfe_counts"])) | set(end.tolist()))
    assert len(nfes) >= 2, "the setting must have runs of several lengths"
    G, df, p = g_test_two_sample(torch.tensor([int((end == k).sum()) for k in nfes]),
                                 torch.tensor([entry["nfe_counts"].get(str(k), 0) for k in nfes]))
    assert p > 0.01, f"NFE: G={G:.1f} df={df} p={p:.4f}"
