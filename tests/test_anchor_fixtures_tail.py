"""DiffuCoder's coupled-GRPO on rows with an EOS tail (tests/fixtures/anchors/diffucoder_tail.json; docs/anchors.md,
docs/likelihoods.md "Post-EOS tails"): DiffuCoder's partial masks cover the whole completion, the tail included, so
its second and third canvases show the tail masked at random; ours show it masked on every canvas (`mask_tail`).
Fed DiffuCoder's own canvases (tail included, through `PolicyDraw.hidden`), our scoring equals its per-token
log-probs on the counted tokens to 1e-5 (rtol 0); with our tail rule the full-length row still equals it and the
rows with a tail differ (the stated choice)."""

from __future__ import annotations

import torch
from test_anchor_fixtures import assert_within, load, model_of, tensors

from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.mask_draws import PolicyDraw, policy_draw
from dllm_ais.likelihood.policy import policy_likelihood


def _setup():
    rec = load("diffucoder_tail.json")
    m = model_of(rec)
    prompt, completion = tensors(rec, "prompt_ids", "completion_ids")
    (partial,) = tensors(rec, "partial_mask", dtype=torch.bool)  # [B, L] over every completion position
    L = completion.shape[1]
    counted = torch.arange(L)[None, :] < torch.tensor(rec["inputs"]["lengths"])[:, None]
    t = rec["inputs"]["t"]
    weight = torch.tensor([0.5, 0.5 / t, 0.5 / (1 - t)], dtype=torch.float64).expand(len(counted), -1)
    want = torch.tensor(rec["outputs"]["per_token_logps"])
    return rec, m, prompt, completion, partial, counted, weight, want


def _terms(m, prompt, completion, counted, draw):
    like = policy_likelihood("coupled", PolicyLikelihoodConfig())
    with torch.no_grad():
        return like.token_logp(m, prompt, torch.ones_like(prompt, dtype=torch.bool), completion, counted, draw,
                               mask_token_id=m.config.mask_token_id)


def test_diffucoder_canvases_with_their_tail_reproduce_its_log_probs():
    rec, m, prompt, completion, partial, counted, weight, want = _setup()
    every = torch.ones_like(partial)
    hidden = torch.stack([every, partial, ~partial], dim=1)  # [B, 3, L] DiffuCoder's canvases, the tail included
    mask = hidden & counted[:, None, :]
    draw = PolicyDraw(mask, torch.where(mask, weight[..., None], 0.0), hidden=hidden)
    got = _terms(m, prompt, completion, counted, draw)
    assert bool((~counted).any()) and bool((partial & ~counted).any()) and bool((~partial & ~counted).any())
    assert_within(got[counted], want[counted])
    assert (got[~counted] == 0).all()  # the tail is shown, never scored


def test_our_tail_rule_differs_only_on_rows_with_a_tail():
    """Ours: the same t and partial mask on the counted tokens, the tail masked on all three canvases."""
    rec, m, prompt, completion, partial, counted, weight, want = _setup()
    mask = torch.stack([counted, partial & counted, ~partial & counted], dim=1)
    got = _terms(m, prompt, completion, counted, policy_draw(mask, weight, counted))
    full = counted.all(-1)  # row 0: no tail
    assert bool(full.any()) and bool((~full).any())
    assert_within(got[full], want[full])
    gap = (got - want).abs().where(counted, 0.0).amax(-1)  # [B] per row
    assert bool((gap[~full] > 1e-3).all()), gap  # the tail's visibility changes the counted tokens' log-probs
