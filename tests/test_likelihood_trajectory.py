"""Trajectory (commit-only) mismatch ratio: exactness, exact enumeration on 4-token completions, subsampling, chunks."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.logprobs import proposal_logprobs
from dllm_ais.likelihood.ratio import coupled_log_ratio
from dllm_ais.likelihood.trajectory import replay_logprobs, replay_plan, trajectory_log_ratio
from dllm_ais.models.tiny import tiny_model
from dllm_ais.samplers.diffusion import diffusion_sample
from dllm_ais.train.backend import DiffusionBackend


def _prompts(B, P, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (B, P), generator=g)
    mask = torch.ones(B, P, dtype=torch.bool)
    mask[0, :2] = False  # left padding
    if B > 3:
        mask[3, :4] = False
    return ids, mask


def _rollout(model, cfg, B=6, P=7, seed=0, stops=(4,)):
    ids, mask = _prompts(B, P, seed)
    return diffusion_sample(model, ids, mask, cfg, model.config.mask_token_id, list(stops),
                            generator=torch.Generator().manual_seed(seed + 1))


@torch.no_grad()
def sampler_record(model, rollout, cfg):
    """What an uncached sampler records as log μ: at each step the whole batch's canvas, the current block's logits
    (positions as a slice, as samplers/diffusion.py computes them), proposal_logprobs of the tokens committed then."""
    B, L = rollout.completion_ids.shape
    P, mask_id = rollout.prompt_ids.shape[1], model.config.mask_token_id
    out = None
    per_block = cfg.steps // cfg.num_blocks
    for t in range(rollout.num_steps):
        lo = (t // per_block) * cfg.block_length
        hi = lo + cfg.block_length
        canvas = torch.where((rollout.commit_step >= 0) & (rollout.commit_step < t), rollout.completion_ids, mask_id)
        x = torch.cat([rollout.prompt_ids, canvas], 1)
        attn = torch.cat([rollout.prompt_mask, torch.ones(B, L, dtype=torch.bool)], 1)
        logits = model(input_ids=x, attention_mask=attn, positions=slice(P + lo, P + hi)).logits.float()
        lp = proposal_logprobs(logits, rollout.completion_ids[:, lo:hi], cfg.temperature, mask_id)
        out = torch.zeros(B, L, dtype=lp.dtype) if out is None else out
        hit = rollout.commit_step[:, lo:hi] == t
        out[:, lo:hi] = torch.where(hit, lp, out[:, lo:hi])
    return out


def _fp8(model):
    from dllm_ais.fp8.quantize import quantize_model

    return quantize_model(model, backend="torch")


def _fp4(model, fmt="nvfp4"):
    from dllm_ais.fp4.linear import quantize_model

    return quantize_model(model, fmt=fmt)


CFG = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.8)


def test_same_model_replay_is_exactly_zero():
    model = tiny_model(seed=0, dtype=torch.float64)
    rollout = _rollout(model, CFG)
    mask_id = model.config.mask_token_id
    # a separate copy as μ (no short-cut on identity): both replays are the same computation
    est = trajectory_log_ratio(model, copy.deepcopy(model), rollout, temperature=0.8, mask_token_id=mask_id)
    assert torch.equal(est.log_ratio, torch.zeros(6)) and torch.equal(est.token_log_ratio, torch.zeros(6, 8))
    # what the uncached sampler records (whole-batch, block-slice forwards) is what the replay computes, exactly
    recorded = sampler_record(model, rollout, CFG)
    rollout.logp_rollout = recorded
    est = trajectory_log_ratio(model, None, rollout, temperature=0.8, mask_token_id=mask_id, chunk_size=5)
    assert torch.equal(est.log_ratio, torch.zeros(6))
    assert est.num_canvases > 0 and est.num_forwards == -(-est.num_canvases // 5)
    backend = DiffusionBackend(CFG, mask_id, (4,), mismatch_estimator="trajectory")
    assert torch.equal(backend.mismatch_log_w(model, model, rollout, None, "token"), torch.zeros(6, 8))


def test_replay_of_the_rollout_copy_matches_the_sampler_record():
    """Without a record the estimator replays μ; for an uncached sampler that is μ's record (fp32: up to matmul
    blocking across batch shapes)."""
    model = tiny_model(seed=0)
    mu = _fp8(model)
    rollout = _rollout(mu, CFG)
    plan = replay_plan(rollout.commit_step, rollout.completion_mask)
    replayed = replay_logprobs(mu, rollout, plan, temperature=0.8, mask_token_id=model.config.mask_token_id)
    recorded = sampler_record(mu, rollout, CFG)
    counted = rollout.completion_mask
    assert torch.allclose(replayed[counted], recorded[counted], atol=2e-6, rtol=0)
    assert bool((replayed[counted] < 0).all())
    est = trajectory_log_ratio(model, mu, rollout, temperature=0.8, mask_token_id=model.config.mask_token_id)
    rollout.logp_rollout = recorded
    est_rec = trajectory_log_ratio(model, None, rollout, temperature=0.8, mask_token_id=model.config.mask_token_id)
    assert torch.allclose(est.log_ratio, est_rec.log_ratio, atol=1e-5, rtol=0)
    assert est.log_ratio.abs().max() > 1e-3  # a real FP8 mismatch is measured


def test_token_terms_sum_to_the_sequence_and_skip_uncounted_tokens():
    model = tiny_model(seed=0)
    rollout = _rollout(_fp8(model), CFG, B=8, stops=tuple(range(5, 40)))  # many stop ids: some rows end early
    assert not bool(rollout.completion_mask.all())
    est = trajectory_log_ratio(model, _fp8(model), rollout, temperature=0.8, mask_token_id=model.config.mask_token_id)
    assert bool((est.token_log_ratio[~rollout.completion_mask] == 0).all())
    assert torch.allclose(est.token_log_ratio.double().sum(-1).float(), est.log_ratio, atol=1e-6)
    backend = DiffusionBackend(CFG, model.config.mask_token_id, (4,), mismatch_estimator="trajectory")
    seq = backend.mismatch_log_w(model, _fp8(model), rollout, None, "sequence")
    tok = backend.mismatch_log_w(model, _fp8(model), rollout, None, "token")
    assert torch.equal(seq, est.log_ratio) and torch.equal(tok, est.token_log_ratio)


def test_temperature_zero_is_refused():
    model = tiny_model(seed=0)
    rollout = _rollout(model, CFG)
    with pytest.raises(ValueError, match="--temperature 0"):
        trajectory_log_ratio(model, _fp8(model), rollout, temperature=0.0, mask_token_id=model.config.mask_token_id)


def test_chunking_gives_identical_results():
    model = tiny_model(seed=0, dtype=torch.float64)
    other = tiny_model(seed=1, dtype=torch.float64)
    rollout = _rollout(other, CFG)
    kw = dict(temperature=0.8, mask_token_id=model.config.mask_token_id)
    base = trajectory_log_ratio(model, other, rollout, **kw)
    for size in (1, 2, 3, 5, 1000):
        est = trajectory_log_ratio(model, other, rollout, chunk_size=size, **kw)
        assert torch.equal(est.token_log_ratio, base.token_log_ratio), size
        assert est.num_forwards == -(-base.num_canvases // size)
    model32, mu32 = tiny_model(seed=0), _fp8(tiny_model(seed=0))  # float32: equal up to matmul blocking
    base = trajectory_log_ratio(model32, mu32, rollout, **kw)
    for size in (1, 7):
        est = trajectory_log_ratio(model32, mu32, rollout, chunk_size=size, **kw)
        assert torch.allclose(est.token_log_ratio, base.token_log_ratio, atol=2e-6, rtol=0)


def test_step_subsampling_is_exact_over_every_subset():
    """Horvitz–Thompson step subsampling: the estimate averaged over *every* K-subset of each sequence's steps equals
    the full sum, to float64 rounding (no Monte-Carlo noise, so a scale error of any size fails: planting (S + 1) / K
    for S / K in `plan_for_steps` moves the average by 1/S of the sum, 12–25 % here). Checked on the trajectory ℓ_j
    of an FP8 pair and on the path terms log q + selection of one model (O(1) each)."""
    from dllm_ais.likelihood.trajectory import counted_steps, plan_for_steps, policy_token_logp

    model = tiny_model(seed=0)
    mu = _fp8(model)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.8, threshold=0.2)
    rollout = diffusion_sample(mu, *_prompts(4, 7, 0), cfg, model.config.mask_token_id, [4],
                               generator=torch.Generator().manual_seed(1))
    counted = rollout.completion_mask
    full = replay_plan(rollout.commit_step, counted)
    ell = trajectory_log_ratio(model, mu, rollout, temperature=0.8, mask_token_id=model.config.mask_token_id,
                               plan=full).token_log_ratio.double()  # [B, L] unscaled ℓ_j
    with torch.no_grad():
        path = policy_token_logp(model, rollout, full, cfg, mask_token_id=model.config.mask_token_id,
                                 selection=True)  # [B, L]
    steps = counted_steps(rollout.commit_step, counted)
    S = [s.numel() for s in steps]
    for K in (1, 2, 3):
        assert all(n > K for n in S)
        for terms in (ell, path):
            for b in range(4):  # every subset of sequence b's steps (the other sequences keep all theirs)
                estimates = []
                for subset in itertools.combinations(steps[b].tolist(), K):
                    chosen = [torch.tensor(subset) if i == b else steps[i] for i in range(4)]
                    plan = plan_for_steps(rollout.commit_step, counted, chosen, K)
                    assert plan.rows.tolist().count(b) == K
                    estimates.append(float((plan.scale[b] * terms[b]).sum()))
                mean, exact = sum(estimates) / len(estimates), float(terms[b][counted[b]].sum())
                assert abs(mean - exact) <= 1e-9 * max(1.0, abs(exact)), (K, b, mean, exact)
                assert abs(exact) > 1e-4 and max(estimates) - min(estimates) > 1e-6  # the subsets do differ
    g = torch.Generator().manual_seed(7)
    drawn = replay_plan(rollout.commit_step, counted, 2, g)  # the random draw: K distinct steps, scale S/K
    assert [drawn.rows.tolist().count(b) for b in range(4)] == [2] * 4
    for b in range(4):
        assert set(drawn.scale[b][drawn.scale[b] > 0].tolist()) == {S[b] / 2}
    with pytest.raises(ValueError, match="Generator"):
        replay_plan(rollout.commit_step, counted, 2)


# ------------------------------------------------------------------------------ exact enumeration, 4-token outputs
@torch.no_grad()
def _subset_logits(model, prompt_ids, prompt_mask, y):
    """Logits at every position of the canvas with the positions in subset s filled, for every subset s of the
    completion's L positions: [B, 2^L, L, V]."""
    B, L = y.shape
    mask_id = model.config.mask_token_id
    bits = torch.tensor([[(s >> j) & 1 for j in range(L)] for s in range(2 ** L)], dtype=torch.bool)  # [S, L]
    canvas = torch.where(bits[None], y[:, None], mask_id)  # [B, S, L]
    S, P = bits.shape[0], prompt_ids.shape[1]
    ids = torch.cat([prompt_ids[:, None].expand(-1, S, -1), canvas], -1).flatten(0, 1)
    attn = torch.cat([prompt_mask[:, None].expand(-1, S, -1), torch.ones_like(canvas, dtype=torch.bool)], -1)
    logits = model(input_ids=ids, attention_mask=attn.flatten(0, 1), positions=slice(P, None)).logits
    return logits.view(B, S, L, -1)


def _subset_logprobs(model, prompt_ids, prompt_mask, y, T):
    """log p(y_j | canvas with the positions in subset s filled) for every subset s and position j: [B, 2^L, L]."""
    logits = _subset_logits(model, prompt_ids, prompt_mask, y)
    S = logits.shape[1]
    return proposal_logprobs(logits, y[:, None].expand(-1, S, -1), T, model.config.mask_token_id).double()


def _path_logprob(lp, order):
    """Σ_t log p(y_order[t] | canvas of order[:t]) for one order: lp [B, S, L] -> [B]."""
    s, total = 0, 0.0
    for j in order:
        total = total + lp[:, s, j]
        s |= 1 << j
    return total


def _exact_log_prob(lp):
    """log Σ_orders Π_t p(y_σt | canvas_t): the random-remasking sampler's log P(y) up to the model-free order
    factor Π 1/(L − t) (one token per step). lp [B, S, L] -> [B]."""
    L = lp.shape[-1]
    return torch.stack([_path_logprob(lp, o) for o in itertools.permutations(range(L))]).logsumexp(0)


RANDOM4 = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0, remasking="random")


def test_trajectory_is_the_exact_path_ratio_and_an_unbiased_weight():
    """Random remasking, one token per step: the order is chosen uniformly, so the exact log-ratio of the sampled
    path (y, order) is the trajectory ℓ, and E over μ's posterior of the order given y of e^ℓ is π_old(y) / μ(y)."""
    model = tiny_model(seed=0)
    mu = _fp4(model)
    B = 6
    ids, mask = _prompts(B, 6, 3)
    mask_id = model.config.mask_token_id
    rollout = diffusion_sample(mu, ids, mask, RANDOM4, mask_id, [mask_id], generator=torch.Generator().manual_seed(0))
    lp_old = _subset_logprobs(model, ids, mask, rollout.completion_ids, 1.0)
    lp_mu = _subset_logprobs(mu, ids, mask, rollout.completion_ids, 1.0)
    est = trajectory_log_ratio(model, mu, rollout, temperature=1.0, mask_token_id=mask_id)
    for b in range(B):
        order = rollout.commit_step[b].argsort().tolist()
        path = _path_logprob(lp_old[b:b + 1], order) - _path_logprob(lp_mu[b:b + 1], order)
        assert abs(float(est.log_ratio[b]) - float(path)) < 2e-5
    # every order of each y as a rollout: E_{σ ~ μ(σ | y)}[e^ℓ(σ)] = π_old(y) / μ(y)
    orders = list(itertools.permutations(range(4)))
    rows = torch.arange(B).repeat_interleave(len(orders))
    commit = torch.tensor(orders * B).argsort(-1)  # commit_step[j] = the step at which position j is committed
    many = copy.copy(rollout)
    many.prompt_ids, many.prompt_mask = ids[rows], mask[rows]
    many.completion_ids, many.completion_mask = rollout.completion_ids[rows], rollout.completion_mask[rows]
    many.commit_step = commit
    many.logp_rollout = None  # orders the sampler never drew: μ is replayed on them, not read from its record
    ell = trajectory_log_ratio(model, mu, many, temperature=1.0, mask_token_id=mask_id).log_ratio.double()
    path_mu = torch.stack([_path_logprob(lp_mu, o) for o in orders], 1).flatten()  # [B * 24]
    post = (path_mu.view(B, -1) - _exact_log_prob(lp_mu)[:, None])  # log μ(σ | y)
    lhs = (post + ell.view(B, -1)).logsumexp(-1)
    exact = _exact_log_prob(lp_old) - _exact_log_prob(lp_mu)
    assert torch.allclose(lhs, exact, atol=5e-5, rtol=0), (lhs, exact)
    assert exact.abs().max() > 1e-2  # FP4 mismatch is large enough for this to mean something


def _corr(a, b):
    return float(torch.corrcoef(torch.stack([a.detach().double(), b.detach().double()]))[0, 1])


@pytest.mark.parametrize("copy_fn", [_fp8, _fp4], ids=["fp8", "nvfp4"])
def test_correlation_with_the_exact_sequence_log_ratio(copy_fn):
    """Over 128 sampled 4-token completions: the trajectory ℓ (one sampled order) vs the exact marginal log-ratio
    log π_old(y) − log μ(y) (all 24 orders enumerated), beside the coupled ELBO ratio at K = 2.

    Measured here (random tiny model, seed 0): trajectory corr 0.896 (FP8) / 0.839 (NVFP4), ELBO 0.779 / 0.829; RMSE
    trajectory 0.0119 / 0.0554 nats, ELBO 0.0227 / 0.0691. The ≥ 0.99 of issue 18 is not reached: the trajectory
    ratio is the exact ratio of the sampled *path* (y, order) — see the test above — and the spread of path ratios
    across the orders that produce the same y is what separates it from the marginal ratio."""
    model = tiny_model(seed=0)
    mu = copy_fn(model)
    mask_id = model.config.mask_token_id
    ids, mask = _prompts(128, 6, 1)
    rollout = diffusion_sample(mu, ids, mask, RANDOM4, mask_id, [mask_id], generator=torch.Generator().manual_seed(1))
    traj = trajectory_log_ratio(model, mu, rollout, temperature=1.0, mask_token_id=mask_id).log_ratio
    exact = (_exact_log_prob(_subset_logprobs(model, ids, mask, rollout.completion_ids, 1.0))
             - _exact_log_prob(_subset_logprobs(mu, ids, mask, rollout.completion_ids, 1.0)))
    elbo = coupled_log_ratio(model, mu, ids, mask, rollout.completion_ids, rollout.completion_mask, num_draws=2,
                             generator=torch.Generator().manual_seed(2), mask_token_id=mask_id).log_ratio
    c_traj, c_elbo = _corr(traj, exact), _corr(elbo, exact)
    rmse = lambda e: float((e.double() - exact).pow(2).mean().sqrt())  # noqa: E731
    print(f"corr trajectory {c_traj:.3f} elbo {c_elbo:.3f}; rmse trajectory {rmse(traj):.4f} elbo {rmse(elbo):.4f}")
    assert c_traj >= 0.8 and c_elbo < 0.9
    assert rmse(traj) < rmse(elbo)


@torch.no_grad()
def _subset_distributions(model, prompt_ids, prompt_mask, y):
    """For every subset s of committed positions and every position j, two [B, 2^L, L, V] float64 distributions: the
    T = 1 proposal (mask token removed) and the full softmax the low-confidence sampler reads its confidence from."""
    logits = _subset_logits(model, prompt_ids, prompt_mask, y).double()
    proposal = logits.index_fill(-1, torch.tensor([model.config.mask_token_id]), -torch.inf).softmax(-1)
    return proposal, logits.softmax(-1)


def _exact_low_confidence_log_prob(proposal, full, y):
    """T = 1, one token per step, low-confidence remasking (LLaDA's default, samplers/diffusion.py): every masked
    position proposes X_i ~ proposal_i and the one whose proposal has the highest full-softmax probability is
    committed, so with the order-selection term
        log P(y) = log Σ_σ Π_t proposal_σt(y_σt | c_t) Π_{i masked at t, i ≠ σt} P(full_i(X_i) < full_σt(y_σt)).
    proposal, full [B, 2^L, L, V], y [B, L] -> [B]."""
    B, S, L, V = proposal.shape
    index = y[:, None, :, None].expand(-1, S, -1, 1)
    prop_y, conf_y = proposal.gather(-1, index).squeeze(-1), full.gather(-1, index).squeeze(-1)  # [B, S, L]
    paths = []
    for order in itertools.permutations(range(L)):
        s, total = 0, torch.zeros(B, dtype=torch.float64)
        for j in order:
            total = total + prop_y[:, s, j].log()
            for i in range(L):
                if i != j and not (s >> i) & 1:  # another masked position must propose something less confident
                    below = (full[:, s, i] < conf_y[:, s, j, None]).double()  # [B, V]
                    total = total + (proposal[:, s, i] * below).sum(-1).log()
            s |= 1 << j
        paths.append(total)
    return torch.stack(paths).logsumexp(0)


def test_the_low_confidence_probability_is_what_the_sampler_draws():
    """2-token completions of one prompt from a confident tiny model, 6,000 draws: the frequency of each of the 12
    likeliest completions is within 4 SE of the enumerated probability; the random-remasking formula (no selection
    term) is not (so the check has the power to tell them apart)."""
    model = tiny_model(seed=1)
    with torch.no_grad():
        model.model.transformer.ff_out.weight.mul_(20.0)
    mask_id, N = model.config.mask_token_id, 6000
    ids, mask = _prompts(1, 6, 5)
    cfg = SamplerConfig(gen_length=2, block_length=2, steps=2, temperature=1.0, remasking="low_confidence")
    draws = diffusion_sample(model, ids.expand(N, -1), mask.expand(N, -1), cfg, mask_id, [mask_id],
                             generator=torch.Generator().manual_seed(0)).completion_ids  # [N, 2]
    ys, counts = draws.unique(dim=0, return_counts=True)
    top = counts.argsort(descending=True)[:12]
    ys, freq = ys[top], counts[top].double() / N
    proposal, full = _subset_distributions(model, ids.expand(len(ys), -1), mask.expand(len(ys), -1), ys)
    exact = _exact_low_confidence_log_prob(proposal, full, ys).exp()
    se = (exact * (1 - exact) / N).sqrt()
    assert freq[0] > 0.02  # the model is confident enough for the frequencies to mean something
    assert ((freq - exact).abs() < 4 * se).all(), (freq, exact)
    lp = proposal.gather(-1, ys[:, None, :, None].expand(-1, 4, -1, 1)).squeeze(-1).log()  # [12, 4, 2]
    uniform_order = (_exact_log_prob(lp) - math.log(2)).exp()
    assert ((freq - uniform_order).abs() > 4 * se).any()


@pytest.mark.parametrize("copy_fn", [_fp8, _fp4], ids=["fp8", "nvfp4"])
def test_correlation_under_low_confidence_remasking(copy_fn):
    """LLaDA's default sampler (low-confidence remasking), 4-token completions, T = 1: the exact log-ratio includes the
    order-selection terms, which the trajectory ratio leaves out. The trajectory ratio still tracks it better than the
    coupled ELBO at K = 2. Measured here (random tiny model, 128 rows): trajectory corr 0.751 (FP8) / 0.763 (NVFP4),
    ELBO 0.669 / 0.638: far from issue 18's 0.99 under this sampler too, as under random remasking above."""
    model = tiny_model(seed=0)
    mu = copy_fn(model)
    mask_id = model.config.mask_token_id
    ids, mask = _prompts(128, 6, 1)
    cfg = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0, remasking="low_confidence")
    rollout = diffusion_sample(mu, ids, mask, cfg, mask_id, [mask_id], generator=torch.Generator().manual_seed(1))
    y = rollout.completion_ids
    traj = trajectory_log_ratio(model, mu, rollout, temperature=1.0, mask_token_id=mask_id).log_ratio
    exact = (_exact_low_confidence_log_prob(*_subset_distributions(model, ids, mask, y), y)
             - _exact_low_confidence_log_prob(*_subset_distributions(mu, ids, mask, y), y))
    elbo = coupled_log_ratio(model, mu, ids, mask, y, rollout.completion_mask, num_draws=2,
                             generator=torch.Generator().manual_seed(2), mask_token_id=mask_id).log_ratio
    c_traj, c_elbo = _corr(traj, exact), _corr(elbo, exact)
    print(f"low-confidence: corr trajectory {c_traj:.3f} elbo {c_elbo:.3f}")
    assert c_traj > c_elbo + 0.05
    assert exact.std() > 0.05  # a mismatch large enough for the correlations to mean something


class _Counting(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, **kwargs):
        self.calls += 1
        return self.model(**kwargs)


def test_replay_pads_its_forwards_to_the_other_processes(monkeypatch, tmp_path):
    """Under FSDP each forward all-gathers, so a rank with fewer canvases runs discarded forwards until it has made
    as many calls as the busiest rank (`_forwards_in_step`, an all-reduce MAX; here a one-process gloo group, and
    another rank's larger count simulated)."""
    import torch.distributed as dist

    import dllm_ais.likelihood.trajectory as trajectory

    model = tiny_model(seed=0)
    rollout = _rollout(model, CFG, B=4)
    counting = _Counting(model)
    kw = dict(temperature=0.8, mask_token_id=model.config.mask_token_id, chunk_size=2)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        base = trajectory_log_ratio(counting, _fp8(model), rollout, **kw)
        assert counting.calls == base.num_forwards  # one process: no padding
        real = trajectory._forwards_in_step
        monkeypatch.setattr(trajectory, "_forwards_in_step", lambda n, device: real(n, device) + 3)
        counting.calls = 0
        padded = trajectory_log_ratio(counting, _fp8(model), rollout, **kw)
    finally:
        dist.destroy_process_group()
    assert counting.calls == base.num_forwards + 3
    assert torch.equal(padded.token_log_ratio, base.token_log_ratio)


def test_the_policy_path_terms_equal_the_samplers_own_record_selection_included():
    """--policy-logprob trajectory with --trajectory-selection: the replayed per-token path terms (token + shared
    selection term) of the model that sampled equal what the sampler recorded as it sampled (log μ and each step's
    selection term), token for token; the selection terms are not zero here, so a flipped sign or a dropped term in
    `policy_token_logp` fails this fast test beside its code."""
    from dllm_ais.likelihood.trajectory import policy_token_logp, rollout_token_logp

    model = tiny_model(seed=3)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.9)  # 2 commits per step: selection ≠ 0
    ids, mask = _prompts(4, 7, 5)
    rollout = diffusion_sample(model, ids, mask, cfg, model.config.mask_token_id, [4],
                               generator=torch.Generator().manual_seed(6), record_selection=True)
    plan = replay_plan(rollout.commit_step, rollout.completion_mask)
    with torch.no_grad():
        replayed = policy_token_logp(model, rollout, plan, cfg, mask_token_id=model.config.mask_token_id,
                                     selection=True)
        tokens_only = policy_token_logp(model, rollout, plan, cfg, mask_token_id=model.config.mask_token_id,
                                        selection=False)
    recorded = rollout_token_logp(rollout, plan, selection=True)
    torch.testing.assert_close(replayed.double(), recorded.double(), atol=1e-5, rtol=0)
    assert (replayed.double() - tokens_only.double()).abs().max() > 1e-2  # the selection terms matter here
