"""The path likelihood where confidences tie, and where the mask token takes real probability: a position- and
canvas-blind model (every position sees the same logits), so every path's probability is computable by hand, and
two positions proposing the same token tie exactly; and a model whose mask-token probability is large and differs
between positions (0–0.7), so a confidence read without the mask token reorders the positions.

Tie rule (DESIGN.md §5, samplers/diffusion.py): the sampler sorts confidences descending with a *stable* sort and
threshold decoding's forced commit is the *first* argmax, so of two tied positions the lower one is committed. The
selection term therefore allows an uncommitted proposal to tie the least confident committed token only at a position
after the last committed position holding that confidence; before it, the tie would have been committed instead.
"""

from __future__ import annotations

import pytest
import torch
from test_path_likelihood import (
    CASES,
    DRAWS,
    MASK_ID,
    PROMPT,
    confident_model,
    enumerate_paths,
    g_test,
    path_keys,
    rollout_of,
    sampler_counts,
)

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.trajectory import path_logprob


def _ff_input(model) -> torch.Tensor:
    """The LM head's input at the first position of PROMPT (the same at every position of a blind model)."""
    seen = []
    hook = model.model.transformer.ff_out.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT, dtype=torch.bool))
    hook.remove()
    return seen[0][0, 0].double()


def blind_model(mask_logit: float | None = 0.0, seed: int = 2):
    """confident_model with every block's output projections zeroed (each block is the identity) and one embedding
    row for every token: the logits are one vector z [V] at every position of every canvas. mask_logit: shift the
    mask token's logit to (the largest other logit + mask_logit), so its full-softmax probability is substantial
    (the confidence's normaliser then differs from the proposal's); None keeps it as drawn."""
    model = confident_model(seed=seed)
    t = model.model.transformer
    with torch.no_grad():
        for block in t.blocks:
            block.attn_out.weight.zero_()
            block.ff_out.weight.zero_()
        t.wte.weight.copy_(t.wte.weight[5].expand_as(t.wte.weight))
        if mask_logit is not None:
            h = _ff_input(model)
            z = t.ff_out.weight.double() @ h
            others = torch.cat([z[:MASK_ID], z[MASK_ID + 1:]])
            shift = float(others.max()) + mask_logit - float(z[MASK_ID])
            t.ff_out.weight[MASK_ID] += (shift * h / (h @ h)).to(t.ff_out.weight.dtype)
    return model


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT, dtype=torch.bool)).logits[0]
    assert torch.equal(out[0], out[-1])  # blind: every position has the same logits, bit for bit
    return out[0].double()


def test_blind_model_ties_and_gives_the_mask_real_probability():
    p = torch.softmax(_logits(blind_model()), -1)
    assert 0.2 < float(p[MASK_ID]) < 0.8, float(p[MASK_ID])


def test_two_token_paths_match_the_hand_computed_tie_rule():
    """Top-k, 2 positions, 2 steps (one commit each), T = 0.8: P(path) = q(y_a) · S_a · q(y_b), S the selection
    term of the first step: position 0 committed first lets position 1 tie it (Σ_x q(x) 1[p(x) <= p(y_0)]), position
    1 committed first needs position 0 strictly below (Σ_x q(x) 1[p(x) < p(y_1)]). p is the full softmax, mask
    token included; q = softmax(z / T) without the mask token."""
    T = 0.8
    model = blind_model()
    z = _logits(model)
    p = torch.softmax(z, -1)
    q = torch.softmax((z / T).index_fill(0, torch.tensor([MASK_ID]), -torch.inf), -1)
    cfg = SamplerConfig(gen_length=2, block_length=2, steps=2, temperature=T)
    completion, commit = enumerate_paths(cfg)
    with torch.no_grad():
        got = path_logprob(model, rollout_of(completion, commit), cfg).log_prob.exp()
    expected = []
    for y, s in zip(completion.tolist(), commit.tolist(), strict=True):
        first = s.index(0)
        c = p[y[first]]
        below = (p < c) | ((p == c) & (first == 0))  # ties allowed only after the committed position
        expected.append(float(q[y[0]] * q[y[1]] * (q * below).sum()))
    expected = torch.tensor(expected, dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-12, rtol=1e-5), float((got - expected).abs().max())
    ties = (completion[:, 0] == completion[:, 1])
    assert float(got[ties & (commit[:, 1] == 0)].sum()) < float(got[ties & (commit[:, 0] == 0)].sum())
    assert abs(float(got.sum()) - 1) < 1e-6  # float32 logits: rows of one batch round alike up to ~1e-7


TIED_CASES = {
    "topk-k1": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0),
    "topk-k2": SamplerConfig(gen_length=4, block_length=4, steps=2, temperature=0.8),
    "threshold-0.3": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=0.3),
    "threshold-0.2-cap2": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=0.2,
                                        max_commit_per_step=2),
    "topk-dual": SamplerConfig(gen_length=4, block_length=2, steps=4, temperature=1.0, cache="dual"),
}


@pytest.mark.parametrize("name", list(TIED_CASES))
def test_tied_paths_sum_to_one_and_match_the_sampler(name):
    """Every path of the blind model enumerated: probabilities sum to 1 (a tie counted for both positions sums to
    more) and equal the sampler's frequencies over 20,000 draws (G-test), so the likelihood's tie rule is the
    sampler's."""
    cfg = TIED_CASES[name]
    model = blind_model(mask_logit=None if cfg.threshold is not None else 0.0)  # thresholds need confident tokens
    completion, commit = enumerate_paths(cfg)
    with torch.no_grad():
        probs = path_logprob(model, rollout_of(completion, commit), cfg).log_prob.exp()
    assert abs(float(probs.sum()) - 1) < 1e-6, float(probs.sum())
    counts = sampler_counts(model, cfg, path_keys(completion, commit, cfg))
    G, df, pval = g_test(counts, DRAWS * probs)
    assert df >= 10 and pval > 0.01, (G, df, pval)
    drawn = completion[counts > 0]
    tied = torch.tensor([len(set(r)) < len(r) for r in drawn.tolist()])
    assert int(tied.sum()) > 0  # the sampler really drew paths with tied proposals


def mask_heavy_model():
    """confident_model with a random direction added to the mask token's LM-head row: the mask's full-softmax
    probability ranges over 0–0.7 and differs between positions (the plain model gives it 4e-4 to 1.4e-3), so the
    confidence's normaliser (mask token included, as the sampler) changes which position is the most confident."""
    model = confident_model()
    with torch.no_grad():
        w = model.model.transformer.ff_out.weight
        g = torch.Generator().manual_seed(7)
        w[MASK_ID] += 4.0 * torch.randn(w.shape[1], generator=g) * w.norm(dim=1).mean() / w.shape[1] ** 0.5
    return model


@pytest.mark.parametrize("name", ["topk-k1", "threshold-0.5"])
def test_uncached_paths_with_a_probable_mask_token_match_the_sampler(name):
    """The path law equals sampler frequencies with the mask-heavy model, uncached (a likelihood whose confidence
    drops the mask token fails the threshold case at p ~ 1e-65; top-k only reorders where the mask's probability
    differs between the positions of one canvas, which this model rarely does at the first step)."""
    cfg = CASES[name]
    assert cfg.cache == "none"
    model = mask_heavy_model()
    completion, commit = enumerate_paths(cfg)
    with torch.no_grad():
        probs = path_logprob(model, rollout_of(completion, commit), cfg).log_prob.exp()
        canvas = torch.cat([PROMPT.expand(300, -1), completion[:300]], 1)  # partly filled canvases
        canvas[:, -3:][torch.rand(300, 3, generator=torch.Generator().manual_seed(0)) < 0.6] = MASK_ID
        p_mask = model(input_ids=canvas, attention_mask=torch.ones_like(canvas, dtype=torch.bool)).logits.softmax(
            -1)[:, -3:, MASK_ID][canvas[:, -3:] == MASK_ID]
    assert float(p_mask.quantile(0.9)) > 0.2, p_mask  # the mask token takes real probability on many canvases
    assert abs(float(probs.sum()) - 1) < 1e-4
    counts = sampler_counts(model, cfg, path_keys(completion, commit, cfg))
    G, df, pval = g_test(counts, DRAWS * probs)
    assert df >= 10 and pval > 0.01, (G, df, pval)
