"""SPG's block choice against its own code path (tests/fixtures/anchors/spg_blocks.json: SPG's block_random
forward_process *drew* the masks of 3,000 seeds; docs/anchors.md): the law of the K draws' blocks (`spg_block_rule`
permutation, the default: the first K of a random permutation of all N blocks, modulo the row's block count) is the
anchor's — both histograms fit the enumerated law and each other (G-tests) — the anchor's drawn masks have the
structure ours have, and on the anchor's masks (rows with EOS tails) our ELBO / EUBO / mixture equal SPG's
_get_per_seq_logps to 1e-5 (rtol 0)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from dream_helpers import g_test, g_test_two_sample
from test_anchor_fixtures import assert_within, load, model_of, tensors

from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.mask_draws import PolicyDraw
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.likelihood.spg import draw_spg, spg_sequence_logp


def _law(nb: int, N: int, K: int) -> dict[str, float]:
    """The anchor's rule enumerated: P(c_1..c_K) with c_k = perm[k] % n_b over the permutations of N blocks."""
    perms = list(itertools.permutations(range(N), K))
    return {",".join(map(str, cs)): n / len(perms)
            for cs, n in Counter(tuple(j % nb for j in p) for p in perms).items()}


def _setting(rec):
    s = rec["anchor"]["settings"]
    completion_mask = torch.tensor(rec["inputs"]["completion_mask"], dtype=torch.bool)
    L = completion_mask.shape[1]
    return s["num_t"], s["block_length"], -(-L // s["block_length"]), completion_mask


def _our_histogram(completion_mask, K, block, seeds, rule="permutation"):
    """Our draws' blocks, one generator for `seeds` replicates of the rows: with p_mask_prompt 0 the chosen block is
    the first block with a masked counted token (p does not change the block law: the same random numbers)."""
    B, L = completion_mask.shape
    reps = completion_mask.repeat(seeds, 1)  # [seeds·B, L]
    d = draw_spg(reps, K, torch.Generator().manual_seed(0), block, None, 0.0, rule)
    first = torch.where(d.mask, torch.arange(L), L).min(-1).values // block  # [seeds·B, K]
    out = [Counter() for _ in range(B)]
    for r, cs in enumerate(first.tolist()):
        out[r % B][",".join(map(str, cs))] += 1
    return out


def test_spg_block_law_is_the_anchors():
    rec = load("spg_blocks.json")
    K, block, N, cm = _setting(rec)
    seeds = rec["anchor"]["settings"]["seeds"]
    ours = _our_histogram(cm, K, block, seeds)
    for i, anchor in enumerate(rec["outputs"]["block_histogram"]):
        nb = -(-int(cm[i].sum()) // block)
        law = _law(nb, N, K)
        keys = sorted(law)
        assert set(anchor) <= set(law) and set(ours[i]) <= set(law)  # no tuple the rule cannot make
        expected = torch.tensor([law[k] * seeds for k in keys])
        a = torch.tensor([anchor.get(k, 0) for k in keys])
        o = torch.tensor([ours[i].get(k, 0) for k in keys])
        if len(keys) > 1:
            assert g_test(a, expected)[2] > 1e-3  # the enumeration is the anchor's law
            assert g_test(o, expected)[2] > 1e-3
            assert g_test_two_sample(a, o)[2] > 1e-3
        if nb == N:  # a full-length row: K distinct blocks in every draw (SPG's intent)
            for hist in (anchor, ours[i]):
                assert all(len(set(k.split(","))) == K for k in hist)


def test_the_independent_rule_is_not_spgs():
    """The previous default (a uniform block per draw, independently) repeats blocks of a full-length row: the G-test
    against SPG's law rejects it."""
    rec = load("spg_blocks.json")
    K, block, N, cm = _setting(rec)
    ind = _our_histogram(cm[:1], K, block, 3000, "independent")[0]
    law = _law(N, N, K)
    keys = sorted(set(law) | set(ind))
    expected = torch.tensor([law.get(k, 0.0) * 3000 + 1e-9 for k in keys])
    assert any(len(set(k.split(","))) < K for k in ind)
    assert g_test(torch.tensor([ind.get(k, 0) for k in keys]), expected)[2] < 1e-6


def _check_structure(mask, blocks, cm, block):
    """mask [B, K, L] of counted positions, blocks [B, K]: counted tokens after the chosen block all masked and 1..m
    of its m counted tokens masked."""
    pos = torch.arange(cm.shape[1])
    for i in range(cm.shape[0]):
        for k in range(mask.shape[1]):
            c = int(blocks[i, k])
            later, inb = cm[i] & (pos // block > c), cm[i] & (pos // block == c)
            assert bool(mask[i, k][later].all()) and 1 <= int(mask[i, k][inb].sum()) <= int(inb.sum())


def test_the_anchors_drawn_masks_have_our_structure():
    """The anchor's drawn masks: the block structure above, post-EOS positions masked on the canvas (ours: mask_tail);
    ours (p_mask_prompt 0, so the chosen block is the first with a masked token) have the same structure and no
    earlier-block token masked."""
    rec = load("spg_blocks.json")
    K, block, N, cm = _setting(rec)
    P = len(rec["inputs"]["prompt_ids"][0])
    for masks, blocks in zip(rec["outputs"]["masks"], rec["outputs"]["blocks"], strict=True):
        m = torch.tensor(masks)[:, :, P:]  # [B, K, L]
        assert bool(m[~cm[:, None, :].expand_as(m)].all())  # the tail is masked
        _check_structure(m & cm[:, None, :], torch.tensor(blocks), cm, block)
    ours = draw_spg(cm, K, torch.Generator().manual_seed(1), block, None, 0.0)
    first = torch.where(ours.mask, torch.arange(cm.shape[1]), cm.shape[1]).min(-1).values // block
    _check_structure(ours.mask, first, cm, block)
    assert not bool((ours.mask & ~cm[:, None, :]).any())  # ours never scores (nor lists) the tail


@pytest.mark.parametrize("estimator", ["elbo", "eubo", "mix"])
def test_spg_bounds_on_the_anchors_masks_with_tails(estimator):
    """SPG's _get_per_seq_logps on seed 0's masks (rows of 8, 5, 4 and 1 counted tokens: EOS tails masked, never
    scored) = our spg_sequence_logp fed the same masks."""
    rec = load("spg_blocks.json")
    m = model_of(rec)
    K, block, N, cm = _setting(rec)
    prompt, completion = tensors(rec, "prompt_ids", "completion_ids")
    P = prompt.shape[1]
    masked = torch.tensor(rec["outputs"]["masks"][0])  # [B, K, P + L]
    mask = masked[:, :, P:] & cm[:, None, :]
    count = mask.sum(-1).double()
    draw = PolicyDraw(mask=mask, weight=torch.where(mask, (1.0 / count / K)[..., None], 0.0),
                      prompt_masked=masked[:, :, :P], level=count / cm.sum(-1, keepdim=True))
    like = policy_likelihood("spg", PolicyLikelihoodConfig(elbo_draws=K), block_length=block)
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    with torch.no_grad():
        lp = like.draw_logp(m, prompt, pmask, completion, cm, draw, mask_token_id=m.config.mask_token_id)
    adv = torch.where(torch.tensor(rec["inputs"]["reward_mask"]), 1.0, -1.0)
    mix = {"elbo": None, "eubo": None, "mix": 0.5}[estimator]
    got = spg_sequence_logp(draw, lp, adv if estimator != "elbo" else torch.ones_like(adv), 1.5, mix)
    assert_within(got, rec["outputs"]["per_seq_logps_seed0"][estimator])
