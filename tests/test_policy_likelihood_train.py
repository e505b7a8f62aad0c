"""Policy likelihoods in training: shared masks (first-iteration ratio exactly 1), memory flat in K with the gradient
of the all-at-once computation, post-EOS never scored, SPG's loss, the registry, and one-line refusals of bad input."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.config import PolicyLikelihoodConfig, Preset, SamplerConfig, TrainConfig
from dllm_ais.likelihood.mask_draws import _rows_logp, draw_logprobs, draw_stratified, token_terms
from dllm_ais.likelihood.policy import POLICY_LIKELIHOODS, group_size_of, policy_likelihood
from dllm_ais.likelihood.spg import spg_eubo
from dllm_ais.models.tiny import init_weights, tiny_model
from dllm_ais.presets import get_preset
from dllm_ais.rl.config import GRPOConfig
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.rl.spg import spg_loss
from dllm_ais.train.backend import DiffusionBackend
from dllm_ais.train.flags import check_combinations
from dllm_ais.types import Rollout

MASK = 4
SETTINGS = [("elbo", PolicyLikelihoodConfig(elbo_draws=4)),
            ("elbo", PolicyLikelihoodConfig(elbo_draws=4, elbo_scheme="antithetic")),
            ("elbo", PolicyLikelihoodConfig(elbo_draws=2, elbo_scheme="quadrature")),
            ("coupled", PolicyLikelihoodConfig()),
            ("spg", PolicyLikelihoodConfig(elbo_draws=3, spg_block_length=2))]


def _model(seed=0):
    m = tiny_model(seed=seed, dtype=torch.float64, d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64)
    return init_weights(m, torch.Generator().manual_seed(seed), std=0.3)


def _rollout(B=6, G=3, P=3, L=6):
    g = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(5, 100, (B // G, P), generator=g).repeat_interleave(G, 0)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    completion_ids = torch.randint(5, 100, (B, L), generator=g)
    lengths = torch.tensor([6, 4, 5, 2, 6, 3])[:B]
    completion_mask = torch.arange(L)[None, :] < lengths[:, None]
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                   completion_mask=completion_mask, commit_step=torch.zeros(B, L, dtype=torch.long), num_steps=1)


def _backend(name, cfg):
    return DiffusionBackend(SamplerConfig(gen_length=6, block_length=6, steps=6), MASK, (2,), policy_logprob=name,
                            likelihood=cfg)


@pytest.mark.parametrize("name,cfg", SETTINGS)
def test_first_iteration_ratio_is_exactly_one_on_micro_batches(name, cfg):
    model, ro, be = _model().eval(), _rollout(), _backend(name, cfg)  # eval: SPG's θ pass is refused in train mode
    with torch.no_grad():
        old = be.token_logp(model, ro, seed=17)  # π_old on the full batch
    mask, adv = ro.completion_mask, torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0])
    cfg_g = GRPOConfig(importance_sampling_level=be.policy.level, beta=0.0)
    new = be.token_logp(model, ro, seed=17, rows=torch.arange(6))  # θ with gradients, one micro-batch
    assert torch.equal(new.detach(), old)  # ratio exactly 1
    assert float(grpo_loss(new, old, adv, mask, cfg_g).clip_ratio_region) == 0.0
    for rows in (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])):  # θ on micro-batches: the same masks; only
        part = be.token_logp(model, ro, seed=17, rows=rows)  # the forward's batch shape differs (rounding)
        torch.testing.assert_close(part.detach(), old[rows], rtol=0, atol=1e-12)
        assert torch.equal(be.policy_draw(ro, 17).rows(rows).mask, be.policy_draw(ro, 17).mask[rows])
    assert not torch.equal(be.token_logp(model, ro, seed=18), old)  # another seed draws other masks
    ref = _model(seed=1)  # the reference on the same draw: the same masks, another model
    d = be.policy_draw(ro, 17)
    with torch.no_grad():
        assert torch.equal(be.token_logp(ref, ro, seed=17), be.policy.token_logp(
            ref, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, d, mask_token_id=MASK))


@pytest.mark.parametrize("name,cfg", SETTINGS)
def test_post_eos_tokens_are_never_scored(name, cfg):
    model, ro, be = _model(), _rollout(), _backend(name, cfg)
    with torch.no_grad():
        a = be.token_logp(model, ro, seed=5)
        ro2 = _rollout()
        ro2.completion_ids[~ro2.completion_mask] = 77  # other post-EOS tokens (masked on the canvas: mask_tail)
        b = be.token_logp(model, ro2, seed=5)
    assert (a[~ro.completion_mask] == 0).all()
    assert torch.equal(a, b)
    if name == "spg":
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0])
        with torch.no_grad():
            assert torch.equal(be.sequence_logp(model, ro, 5, adv), be.sequence_logp(model, ro2, 5, adv))


def _saved_bytes(fn) -> int:
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_memory_flat_in_K_and_gradient_equals_all_at_once():
    model, ro = _model(), _rollout()
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    d = draw_stratified(ro.completion_mask, 8, torch.Generator().manual_seed(0))
    params = [p for p in model.parameters()]
    adv = torch.linspace(-1, 1, 6, dtype=torch.float64)

    def replayed():
        return (adv * token_terms(d, draw_logprobs(model, *args, d, mask_token_id=MASK)).sum(-1)).sum()

    def all_at_once():  # every (sequence, draw) row in one forward, no checkpoint
        B, K, L = d.mask.shape
        x = torch.cat([ro.prompt_ids, torch.where(ro.completion_mask, ro.completion_ids, MASK)], 1)
        x = x[:, None].expand(B, K, -1).reshape(B * K, -1).clone()
        m = d.mask.reshape(B * K, L)
        x[:, 3:] = torch.where(m, MASK, x[:, 3:])
        attn = torch.ones_like(x, dtype=torch.bool)
        keep = m.any(-1)
        lp = torch.zeros(B * K, L, dtype=torch.float64)
        lp[keep] = _rows_logp(model, x[keep], attn[keep], m[keep], ro.completion_ids.repeat_interleave(K, 0)[keep], 3)
        return (adv * token_terms(d, lp.view(B, K, L)).sum(-1)).sum()

    g1 = torch.autograd.grad(replayed(), params)
    g2 = torch.autograd.grad(all_at_once(), params)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)  # the batch shapes differ (float32 inner ops)
    assert max(float(a.abs().max()) for a in g1) > 1e-2  # a real gradient
    one = draw_stratified(ro.completion_mask, 1, torch.Generator().manual_seed(0))
    plain_one = _saved_bytes(lambda: _rows_logp(model, torch.cat([ro.prompt_ids, ro.completion_ids], 1),
                                                torch.ones(6, 9, dtype=torch.bool), one.mask[:, 0],
                                                ro.completion_ids, 3).sum())
    replay_eight = _saved_bytes(replayed)
    assert replay_eight < 0.25 * plain_one, (replay_eight, plain_one)  # K = 8 holds less than one draw's graph


def test_spg_loss_gradient_equals_gspo_at_ratio_one():
    torch.manual_seed(0)
    ell = torch.randn(4, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0], dtype=torch.float64)
    lengths = torch.tensor([3, 5, 2, 4])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    (g_spg,) = torch.autograd.grad(spg_loss(ell, adv, lengths).loss, ell)
    logp = ell[:, None].expand(4, 5)  # every counted token carries ℓ_i: GSPO's mean log-ratio is ℓ_i − ℓ_old
    cfg = GRPOConfig(importance_sampling_level="sequence", loss_type="dapo", beta=0.0)
    (g_gspo,) = torch.autograd.grad(grpo_loss(logp, logp.detach(), adv, mask, cfg).loss, ell)
    torch.testing.assert_close(g_spg, g_gspo)
    expected = -(lengths * adv).double() / lengths.sum()
    torch.testing.assert_close(g_spg, expected)
    empty = spg_loss(torch.tensor([float("nan"), 1.0]), torch.ones(2), torch.tensor([0, 2]))
    assert torch.isfinite(empty.loss) and float(empty.loss) == -1.0


def test_spg_uses_elbo_for_positive_and_eubo_or_mixture_for_the_rest():
    model, ro = _model(), _rollout()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0])
    vals = {}
    for mix in (None, 0.5, 0.0):
        be = _backend("spg", PolicyLikelihoodConfig(elbo_draws=3, spg_block_length=2, spg_mix=mix))
        with torch.no_grad():
            vals[mix] = be.sequence_logp(model, ro, 3, adv)
            elbo = be.token_logp(model, ro, 3).sum(-1)
    pos = adv > 0
    assert torch.equal(vals[None][pos], elbo[pos]) and torch.equal(vals[0.0], elbo)
    d = be.policy_draw(ro, 3)
    with torch.no_grad():
        lp = be.policy.draw_logp(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, d,
                                 mask_token_id=MASK)
    eubo = spg_eubo(d, lp, 1.5)
    assert torch.equal(vals[None][~pos], eubo[~pos]) and not torch.allclose(eubo, elbo)
    torch.testing.assert_close(vals[0.5][~pos], 0.5 * vals[None][~pos] + 0.5 * elbo[~pos])


def test_registry_levels_rows_and_groups():
    assert set(POLICY_LIKELIHOODS) == {"elbo", "coupled", "spg", "mdpo", "dtreerpo"}
    assert policy_likelihood("elbo").level == "sequence"
    assert policy_likelihood("elbo", PolicyLikelihoodConfig(elbo_ratio_level="token")).level == "token"
    assert policy_likelihood("coupled").level == "token" and policy_likelihood("coupled").rows_per_sequence == 3
    assert group_size_of(_rollout().prompt_ids) == 3
    assert _backend("one_step", PolicyLikelihoodConfig()).policy is None
    with pytest.raises(ValueError, match="use one of"):
        policy_likelihood("one_step")


@pytest.mark.parametrize("kwargs,match", [
    ({"elbo_draws": 0}, "elbo_draws=0"), ({"elbo_scheme": "antithetic", "elbo_draws": 3}, "even K"),
    ({"elbo_scheme": "quadrature", "elbo_draws": 1}, "even K"), ({"elbo_scheme": "nope"}, "use one of"),
    ({"spg_beta": 0.0}, "spg_beta"), ({"spg_mix": 1.5}, "spg_mix"), ({"coupled_t_min": 0.0}, "coupled t range")])
def test_bad_settings_are_refused_in_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        PolicyLikelihoodConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_presets_spg_refuses_kl_and_elbo_sets_the_sequence_ratio():
    base = get_preset("tiny-cpu")
    with pytest.raises(ValueError, match="--beta 0"):
        Preset("x", "", base.model, base.sampler, TrainConfig(policy_logprob="spg"), base.grpo)
    p = Preset("x", "", base.model, base.sampler, TrainConfig(policy_logprob="elbo"), base.grpo)
    assert p.grpo.importance_sampling_level == "sequence"
    assert Preset.from_dict(p.to_dict()) == p  # the settings round-trip through config.json
    with pytest.raises(ValueError, match="--elbo-draws has no effect"):
        check_combinations({"--elbo-draws": 4}, base)
    with pytest.raises(ValueError, match="--spg-beta has no effect"):
        check_combinations({"--spg-beta": 1.0}, p)


def test_spg_sequence_bound_trains_through_its_own_loss():
    model, ro = _model().train(), _rollout()
    be = _backend("spg", PolicyLikelihoodConfig(elbo_draws=2, spg_block_length=2, spg_mix=0.5))
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0])
    rows = torch.tensor([1, 3, 4])
    ell = be.sequence_logp(model, ro, 7, adv[rows], rows=rows)  # the trainer hook's call, θ in training mode
    out = spg_loss(ell, adv[rows].double(), ro.completion_mask[rows].sum(-1))
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    with torch.no_grad():
        full = be.sequence_logp(model, ro, 7, adv)
    torch.testing.assert_close(ell.detach(), full[rows], rtol=0, atol=1e-12)  # the batch's draw, sliced
