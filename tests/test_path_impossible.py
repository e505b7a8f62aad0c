"""Paths the sampler cannot take: the exact law (`path_logprob`) gives them log P = −inf — a step of the fixed
schedule that commits another number of tokens than the schedule's k, a threshold step committing a token below τ
beside one above it — while the training likelihoods floor such a step at LOG_ZERO, and nothing downstream (ratios,
ω, the GRPO loss) turns either into NaN."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_path_likelihood import MASK_ID, VOCAB, confident_model, rollout_of
from test_path_ties import _logits, blind_model

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.selection import LOG_ZERO
from dllm_ais.likelihood.trajectory import path_logprob
from dllm_ais.rl.config import CorrectionConfig, GRPOConfig
from dllm_ais.rl.correction import correct
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.train.backend import DiffusionBackend

TOPK = SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0)
"""One commit per step: any step committing two tokens breaks the schedule."""


def _every_assignment(L: int) -> torch.Tensor:
    """Every order in which L positions can be committed over steps 0..L−1 with every step up to the last used:
    [A, L] (schedule-breaking ones included)."""
    out = [a for a in itertools.product(range(L), repeat=L) if sorted(set(a)) == list(range(max(a) + 1))]
    return torch.tensor(out)


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_schedule_breaking_paths_are_impossible(remasking):
    """All 13 commit orders of 3 positions × every token: the 7 that commit two or three tokens at a step get −inf
    (before: a finite log P, the top-k term taking k from the step's own count, and the total exceeded 1); the 6
    one-per-step orders keep a total of 1."""
    cfg = SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, remasking=remasking)
    model = confident_model()
    orders = _every_assignment(3)
    tokens = torch.tensor(list(itertools.product([t for t in range(VOCAB) if t != MASK_ID], repeat=3)))
    completion = tokens.repeat(len(orders), 1)
    commit = orders.repeat_interleave(len(tokens), 0)
    with torch.no_grad():
        lp = path_logprob(model, rollout_of(completion, commit), cfg).log_prob
    follows = (commit.sort(-1).values == torch.arange(3)).all(-1)  # one token per step
    assert bool((lp[~follows] == -torch.inf).all())
    assert float(torch.isfinite(lp[follows]).double().mean()) > 0.5  # (committing the least probable token first
    # while another position must propose one less confident is impossible too: −inf, no longer e^−30)
    assert abs(float(lp.exp().sum()) - 1) < 1e-4, float(lp.exp().sum())


def _threshold_case():
    """A blind model and τ between its two most probable tokens a, b: committing a and b at one step is
    impossible (b is below τ beside a above it); committing a, then b, then b is possible."""
    model = blind_model(mask_logit=None)
    p = torch.softmax(_logits(model), -1)
    p[MASK_ID] = 0
    top = p.topk(2)
    a, b = top.indices.tolist()
    tau = float(top.values.mean())
    cfg = SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=tau)
    completion = torch.tensor([[a, b, b], [a, b, b]])
    commit = torch.tensor([[0, 0, 1], [0, 1, 2]])
    return model, cfg, rollout_of(completion, commit)


def test_threshold_rule_breaking_path_is_impossible():
    model, cfg, rollout = _threshold_case()
    with torch.no_grad():
        lp = path_logprob(model, rollout, cfg).log_prob
    assert float(lp[0]) == -torch.inf and bool(torch.isfinite(lp[1])), lp


def test_training_likelihood_floors_impossible_steps_and_stays_finite():
    """The trajectory policy likelihood (selection on) of the same impossible paths: each impossible step's term is
    LOG_ZERO, shared over its counted tokens; θ's and π_old's ratio is 1, the GRPO loss and its gradient finite."""
    cases = [(confident_model(), TOPK, rollout_of(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 0, 1]]))),
             _threshold_case()]
    for model, cfg, rollout in cases:
        backend = DiffusionBackend(cfg, MASK_ID, [MASK_ID], policy_logprob="trajectory", trajectory_selection=True)
        lp = backend.token_logp(model, rollout, seed=0)  # [B, L] with gradients
        assert bool(torch.isfinite(lp).all())
        assert float(lp[0].detach().sum()) < LOG_ZERO / 2  # the floor is in it
        L = rollout.completion_ids.shape[1]
        out = grpo_loss(lp, lp.detach(), torch.tensor([1.0] * lp.shape[0]), rollout.completion_mask,
                        GRPOConfig(loss_type="dr_grpo", beta=0.0, max_completion_length=L),
                        token_scale=backend.token_scale(rollout))
        out.loss.backward()
        assert torch.isfinite(out.loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("level", ["sequence", "token", "geometric"])
def test_infinite_log_weights_give_finite_weights(level):
    """ℓ = ±inf (an exact −inf path term against a finite one) is clamped to ±log_w_clamp before ω: every ω and
    every diagnostic finite, a −inf sample weighs e^−20 under IS."""
    B, L = 4, 3
    mask = torch.ones(B, L, dtype=torch.bool)
    tok = torch.tensor([[-torch.inf, 0.1, 0.0], [0.2, torch.inf, -0.1], [0.05, 0.0, 0.0], [0.0, -0.02, 0.01]])
    log_w = tok if level != "sequence" else tok.sum(-1)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    for correction in ("is", "tis", "ais"):
        out = correct(log_w, adv, mask, CorrectionConfig(correction=correction, correction_level=level))
        assert bool(torch.isfinite(out.omega).all()), (correction, out.omega)
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in out.metrics().values()), correction
    out = correct(log_w, adv, mask, CorrectionConfig(correction="is", correction_level=level))
    first = out.omega[0, 0] if level == "token" else out.omega[0]
    assert torch.isclose(first, torch.tensor(-20.0).exp(), rtol=1e-6), first  # clamped after the geometric mean
