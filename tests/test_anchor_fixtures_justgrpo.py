"""JustGRPO's left-to-right likelihood against its own code (tests/fixtures/anchors/justgrpo.json: LeapLabTHU/JustGRPO
generate with block_length 1 and logprob_loss; docs/anchors.md): in the package it is `--policy-logprob trajectory`
with a sampler of block_length 1 — step t commits position t, so the replayed canvas of y_t is [prompt | y_<t | MASK
...] and the path's log-probability is exactly the autoregressive factorisation (the selection term is log 1). The
log-probs agree to 1e-5 (rtol 0) once the mask token leaves the normaliser (the sampler never proposes it: ours =
JustGRPO's − log(1 − p(mask)), as for TraceRL)."""

from __future__ import annotations

import torch
from test_anchor_fixtures import assert_within, load, model_of, tensors

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.replay import canvases
from dllm_ais.samplers.diffusion import diffusion_sample
from dllm_ais.train.backend import DiffusionBackend
from dllm_ais.types import Rollout


def _rollout(rec) -> Rollout:
    (prompt,) = tensors(rec, "prompt_ids")
    completion = torch.tensor(rec["outputs"]["completion_ids"])
    B, L = completion.shape
    return Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt, dtype=torch.bool),
                   completion_ids=completion, completion_mask=torch.ones_like(completion, dtype=torch.bool),
                   commit_step=torch.arange(L).expand(B, L).clone(), num_steps=L)


def test_justgrpo_is_the_trajectory_likelihood_of_a_one_token_block_sampler():
    rec = load("justgrpo.json")
    m = model_of(rec)
    mask_id = m.config.mask_token_id
    s = rec["anchor"]["settings"]
    ro = _rollout(rec)
    B, L = ro.completion_ids.shape
    P = ro.prompt_ids.shape[1]
    rows, steps = torch.arange(B).repeat_interleave(L), torch.arange(L).repeat(B)
    ids, _ = canvases(ro, rows, steps, mask_id)
    future = torch.arange(L)[None, :] >= steps[:, None]  # JustGRPO's canvas: the future masked
    assert torch.equal(ids[:, P:], torch.where(future, mask_id, ro.completion_ids[rows]))
    config = SamplerConfig(gen_length=L, block_length=1, steps=L, temperature=s["temperature"])
    backend = DiffusionBackend(config, mask_id, [1], policy_logprob="trajectory")
    with torch.no_grad():
        got = backend.token_logp(m, ro, 0)  # [B, L]
    lp, lp_mask = torch.tensor(rec["outputs"]["token_logp"]), torch.tensor(rec["outputs"]["mask_token_logp"])
    assert_within(got, lp - torch.log1p(-lp_mask.exp()))
    assert float((lp - got).abs().max()) > 1e-4  # the mask token's share is visible at this scale


def test_our_one_token_block_sampler_decodes_left_to_right():
    rec = load("justgrpo.json")
    m = model_of(rec)
    (prompt,) = tensors(rec, "prompt_ids")
    L = len(rec["outputs"]["completion_ids"][0])
    config = SamplerConfig(gen_length=L, block_length=1, steps=L, temperature=1.0)
    with torch.no_grad():
        ro = diffusion_sample(m, prompt, torch.ones_like(prompt, dtype=torch.bool), config, m.config.mask_token_id,
                              [1], generator=torch.Generator().manual_seed(0))
    assert torch.equal(ro.commit_step, torch.arange(L).expand_as(ro.commit_step))
