"""SDAR's exact path law (models/sdar/trajectory.py, selection.py): on a 6-token vocabulary every path of a small
canvas is enumerated — the probabilities sum to 1 for each strategy, and equal the sampler's frequencies (G-test);
the sampler's own record (logp_rollout + logp_select) equals the replay."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from dream_helpers import g_test

from dllm_ais.models.sdar.sampler import SDARSamplerConfig, sdar_sample
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.models.sdar.trajectory import path_logprob, path_terms, recorded_path_logprob
from dllm_ais.types import Rollout

MASK = 5
TOKENS = (0, 1, 2, 3, 4)  # every id but the mask (never proposed)


@pytest.fixture(scope="module")
def model():
    return tiny_sdar_model(seed=4, std=0.7, vocab_size=6, mask_token_id=MASK, eos_token_id=1, pad_token_id=1,
                           bos_token_id=2)


def _orders(slots: list[int], steps: int):
    """Every assignment of `slots` to step ranks 0..r (each rank used, r < steps): ordered set partitions."""
    for ranks in itertools.product(range(steps), repeat=len(slots)):
        used = sorted(set(ranks))
        if used == list(range(len(used))):
            yield dict(zip(slots, ranks, strict=True))


def _enumerate(prompt: list[int], cfg: SDARSamplerConfig) -> Rollout:
    """Every (tokens, commit order) of the canvas as rows of one Rollout (commit steps numbered block after block)."""
    Lb, S = cfg.block_length, cfg.denoising_steps
    P = len(prompt)
    tail = P % Lb
    L = cfg.gen_length + (Lb - tail) % Lb
    blocks = [list(range(0, Lb - tail))] + [list(range(b, b + Lb)) for b in range(Lb - tail, L, Lb)]
    per_block = [list(_orders(slots, S)) for slots in blocks]
    rows_ids, rows_cs = [], []
    for orders in itertools.product(*per_block):
        cs, base = [0] * L, 0
        for order in orders:
            for slot, rank in order.items():
                cs[slot] = base + rank
            base += max(order.values()) + 1
        for toks in itertools.product(TOKENS, repeat=L):
            rows_ids.append(toks)
            rows_cs.append(cs)
    n = len(rows_ids)
    ids = torch.tensor(prompt)[None].expand(n, -1)
    return Rollout(prompt_ids=ids, prompt_mask=torch.ones_like(ids, dtype=torch.bool),
                   completion_ids=torch.tensor(rows_ids), completion_mask=torch.ones(n, L, dtype=torch.bool),
                   commit_step=torch.tensor(rows_cs), num_steps=0)


SETTINGS = [  # (prompt, config): a full-block prompt (one block of 3 masks, quotas [2, 1]) ...
    ([2, 3, 2], dict(strategy="low_confidence_static", temperature=1.0)),
    ([0, 3, 2], dict(strategy="low_confidence_dynamic", threshold=0.4, temperature=0.8)),
    ([0, 3, 2], dict(strategy="sequential", temperature=1.0, top_k=3)),
    # ... and a prompt tail in blocks of 2 with one step each: the first block's quota 2 exceeds its one mask
    ([0, 3, 2], dict(strategy="low_confidence_dynamic", threshold=0.5, temperature=1.0, top_p=0.8, block_length=2,
                     gen_length=2, denoising_steps=1)),
]


def _cfg(kw: dict) -> SDARSamplerConfig:
    return SDARSamplerConfig(**{"gen_length": 3, "block_length": 3, "denoising_steps": 2, "cuda_graphs": "off", **kw})


@pytest.mark.parametrize("prompt,kw", SETTINGS)
def test_path_probabilities_sum_to_one(model, prompt, kw):
    cfg = _cfg(kw)
    paths = _enumerate(prompt, cfg)
    with torch.no_grad():
        lp = path_logprob(model, paths, cfg, MASK)
    assert abs(float(torch.logsumexp(lp, 0))) < 1e-9
    if cfg.denoising_steps > 1:
        assert bool((lp == -math.inf).any())  # the enumeration holds paths the rule cannot produce


@pytest.mark.slow
@pytest.mark.parametrize("prompt,kw", [SETTINGS[1], SETTINGS[3]])
def test_sampler_frequencies_equal_the_path_law(model, prompt, kw):
    """20,000 batched draws, each mapped to its path (tokens, commit order within each block): a G-test against the
    exact probabilities; and the sampler's record of each drawn path equals the replay."""
    cfg = _cfg(kw)
    paths = _enumerate(prompt, cfg)
    with torch.no_grad():
        lp = path_logprob(model, paths, cfg, MASK)
    n = 20_000
    ids = torch.tensor(prompt)[None].expand(n, -1)
    r = sdar_sample(model, ids, torch.ones_like(ids, dtype=torch.bool), cfg, MASK, [],
                    generator=torch.Generator().manual_seed(11), record_selection=True)
    index = {(tuple(t), tuple(c)): i for i, (t, c) in enumerate(zip(paths.completion_ids.tolist(),
                                                                     paths.commit_step.tolist(), strict=True))}
    counts = torch.zeros(len(index))
    dense = torch.stack([torch.unique(c, return_inverse=True)[1] for c in r.commit_step])  # batch-1 numbering
    for t, c in zip(r.completion_ids.tolist(), dense.tolist(), strict=True):
        counts[index[(tuple(t), tuple(c))]] += 1
    G, df, p = g_test(counts, n * lp.exp())
    assert p > 0.01, (G, df, p)
    first = slice(0, 200)
    sub = Rollout(r.prompt_ids[first], r.prompt_mask[first], r.completion_ids[first], r.completion_mask[first],
                  r.commit_step[first], r.num_steps, r.logp_rollout[first], r.logp_select[first])
    with torch.no_grad():
        replay = path_logprob(model, sub, cfg, MASK)
    torch.testing.assert_close(recorded_path_logprob(sub), replay, rtol=0, atol=1e-4)  # logp_rollout: float32


def test_per_token_terms_sum_to_the_path_and_carry_gradients(model):
    cfg = SDARSamplerConfig(gen_length=6, block_length=3, denoising_steps=2, strategy="low_confidence_static",
                            temperature=1.0, cuda_graphs="off")
    ids = torch.tensor([[1, 0, 3, 2], [0, 3, 2, 4]])
    ids, mask = ids, torch.tensor([[False, True, True, True], [True] * 4])
    r = sdar_sample(model, ids, mask, cfg, MASK, [], generator=torch.Generator().manual_seed(0))
    per_token, total = path_terms(model, r, cfg, MASK)
    counted = r.completion_mask & (r.commit_step >= 0)
    torch.testing.assert_close(per_token.sum(-1), total, rtol=0, atol=1e-9)  # no stop: every slot is counted
    assert counted.sum(-1).tolist() == [6, 8]  # row 1's prompt tail: two more slots fill its last block
    with torch.enable_grad():
        per_token, total = path_terms(model, r, cfg, MASK)
        total.sum().backward()
    assert model.lm_head.weight.grad is not None and float(model.lm_head.weight.grad.abs().sum()) > 0
    model.zero_grad()
