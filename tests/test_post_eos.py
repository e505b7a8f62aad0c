"""Post-EOS padding is never scored: for every policy likelihood (d1's one-step, the trajectory replay with and
without selection terms, the AR teacher-forced log-probs) the GRPO loss and its gradient do not change when the
tokens after a row's first EOS are replaced (DARE scores them; DESIGN.md §5 says not to copy that).

The trajectory likelihood's canvases legitimately hold post-EOS tokens committed *before* a counted token (they are
context the sampler conditioned on), so there the replaced tokens are the post-EOS ones committed after the row's
last counted commit: they are in no scored canvas, and only scoring them could move the loss."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.tiny import tiny_model
from dllm_ais.rl.config import GRPOConfig
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.samplers.diffusion import completion_mask_from_stops
from dllm_ais.train.backend import AutoregressiveBackend, DiffusionBackend

STOPS = tuple(range(5, 40))
"""Many stop ids: most rows of the tiny model end early."""


def _loss_and_grad(backend, model, rollout):
    """The GRPO loss (fixed advantages, π_old = a fixed offset of the first call's log-probs) and its gradient."""
    model.zero_grad(set_to_none=True)
    lp = backend.token_logp(model, rollout, seed=3)  # [B, L]
    B, L = lp.shape
    old = torch.where(rollout.completion_mask, lp.detach() - 0.1, 0.0)
    adv = torch.linspace(-1, 1, B)
    out = grpo_loss(lp, old, adv, rollout.completion_mask, GRPOConfig(loss_type="dr_grpo", beta=0.0,
                                                                      max_completion_length=L),
                    token_scale=backend.token_scale(rollout))
    out.loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return out.loss.detach(), grad, lp.detach()


def _replace_after_eos(rollout, pick: torch.Tensor, vocab: int, seed: int = 9):
    """A copy of the rollout whose tokens at `pick` [B, L] (post-EOS positions) are redrawn (never a stop id)."""
    other = copy.copy(rollout)
    g = torch.Generator().manual_seed(seed)
    new = torch.randint(40, vocab, rollout.completion_ids.shape, generator=g)
    other.completion_ids = torch.where(pick, new, rollout.completion_ids)
    assert torch.equal(completion_mask_from_stops(other.completion_ids, STOPS), rollout.completion_mask)
    assert int((other.completion_ids != rollout.completion_ids).sum()) > 0
    return other


def _diffusion_rollout(backend, model):
    ids = torch.randint(40, 100, (8, 7), generator=torch.Generator().manual_seed(0))
    rollout = backend.sample(model, ids, torch.ones_like(ids, dtype=torch.bool), torch.Generator().manual_seed(1))
    backend.prepare(rollout, torch.Generator().manual_seed(2))
    assert not bool(rollout.completion_mask.all())
    return rollout


CFG = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.8)


@pytest.mark.parametrize("policy,selection,threshold", [("one_step", False, None), ("trajectory", False, None),
                                                       ("trajectory", True, None), ("trajectory", True, 0.3)])
def test_diffusion_likelihoods_ignore_post_eos_tokens(policy, selection, threshold):
    model = tiny_model(seed=0, dtype=torch.float64)
    cfg = replace(CFG, threshold=threshold)
    backend = DiffusionBackend(cfg, model.config.mask_token_id, STOPS, policy_logprob=policy,
                               trajectory_selection=selection)
    rollout = _diffusion_rollout(backend, model)
    post = ~rollout.completion_mask
    if policy == "trajectory":  # post-EOS tokens in no scored canvas: committed after the last counted commit
        last = torch.where(rollout.completion_mask, rollout.commit_step, -1).max(-1, keepdim=True).values
        post = post & (rollout.commit_step > last)
    other = _replace_after_eos(rollout, post, model.config.vocab_size)
    loss, grad, lp = _loss_and_grad(backend, model, rollout)
    loss2, grad2, lp2 = _loss_and_grad(backend, model, other)
    counted = rollout.completion_mask
    assert torch.equal(lp[counted], lp2[counted])
    assert torch.equal(loss, loss2) and torch.equal(grad, grad2)
    assert float(grad.abs().max()) > 0


def test_autoregressive_likelihood_ignores_post_eos_tokens():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = 128
    qcfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(qcfg).eval()
    backend = AutoregressiveBackend(SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0), STOPS)
    ids = torch.randint(40, vocab, (4, 5), generator=torch.Generator().manual_seed(0))
    rollout = backend.sample(model, ids, torch.ones_like(ids, dtype=torch.bool), torch.Generator().manual_seed(1))
    comp = torch.randint(40, vocab, rollout.completion_ids.shape, generator=torch.Generator().manual_seed(4))
    comp[:, 3] = 7  # every row ends at position 3: 4 post-EOS tokens each
    rollout.completion_ids = comp
    rollout.completion_mask = completion_mask_from_stops(comp, STOPS)
    other = _replace_after_eos(rollout, ~rollout.completion_mask, vocab)
    loss, grad, lp = _loss_and_grad(backend, model, rollout)
    loss2, grad2, lp2 = _loss_and_grad(backend, model, other)
    assert torch.equal(lp[rollout.completion_mask], lp2[rollout.completion_mask])
    assert torch.allclose(loss, loss2, atol=1e-7, rtol=0) and torch.allclose(grad, grad2, atol=1e-7, rtol=0)
    assert float(grad.abs().max()) > 0
