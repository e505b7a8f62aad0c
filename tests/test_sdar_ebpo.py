"""EBPO's composite ELBO for SDAR (models/sdar/ebpo.py) against DARE's own code (tests/fixtures/anchors/ebpo.json,
yjyddq/DARE@83ae8a3, recorded by running `_forward_process_ebpo`, `compute_ebpo_composite_elbo` and
`compute_policy_loss_ebpo`): the composite ELBO, its per-token terms, the sequence-ratio loss and its gradient equal
DARE's on DARE's masks (atol 1e-5, rtol 0); the draw's per-cell mask counts equal DARE's seed by seed (the offset is
the first uniform of both); the draw's law: exact per-cell marginals, exact stratification counts, uniform subsets
(G-test); the Monte-Carlo mean equals the exact expectation (enumerated); gradients flow; other families refuse it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import combinations
from math import comb
from pathlib import Path

import pytest
import torch
from dream_helpers import g_test
from test_sdar_training import _batch, _exact_expectation

from dllm_ais.likelihood.logprobs import token_logprobs
from dllm_ais.models.sdar.ebpo import (
    cell_weights,
    composite_terms,
    counted_blocks,
    draw_ebpo_masks,
    ebpo_token_logp,
    mask_counts,
    noise_levels,
)
from dllm_ais.models.sdar.likelihood import block_elbo_terms, completion_canvas
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.presets import get_preset
from dllm_ais.rl.config import GRPOConfig
from dllm_ais.rl.grpo import grpo_loss

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "anchors" / "ebpo.json").read_text())
MASK, LB = 4, 4


def _dare_canvas(case):
    """DARE's [prompt | response] rows (left-padded prompts, response tails after the stop) on our block canvas:
    (canvas, clean, counted, to_canvas: DARE [..., S] response values -> our [..., T])."""
    s = case["settings"]
    P, R, mask_id = s["prompt_width"], s["response_width"], s["mask_token_id"]
    ids, att = torch.tensor(case["inputs"]["input_ids"]), torch.tensor(case["inputs"]["attention_mask"]).bool()
    canvas, clean, counted = completion_canvas(ids[:, :P], att[:, :P], ids[:, P:], att[:, P:], s["block_length"],
                                               R, mask_id)

    def to_canvas(x):  # [B, K, S] -> [B, K, T], the response part placed at the canvas's completion slots
        zero = torch.zeros(clean.shape, dtype=x.dtype)
        return torch.stack([canvas.scatter(x[:, k, P:], zero) for k in range(x.shape[1])], 1)

    return canvas, clean, counted, to_canvas


def _fixture_terms(case, logits_key):
    """Our composite-ELBO terms [B, T] from DARE's masks and the fixture's logits; and the canvas pieces."""
    canvas, clean, counted, to_canvas = _dare_canvas(case)
    mask = to_canvas(torch.tensor(case["draw"]["mask_indices"]))  # [B, K, T]
    ids = torch.tensor(case["inputs"]["input_ids"])
    logits = torch.tensor(case["inputs"][logits_key])  # [B, K, S, V]
    lp = token_logprobs(logits, ids[:, None, :].expand(logits.shape[:3]))  # [B, K, S]
    weight = cell_weights(mask, counted, LB)
    return composite_terms(to_canvas(lp), mask, weight), canvas, counted, mask, weight, to_canvas


def test_weights_and_composite_elbo_equal_dare_on_its_masks():
    case = FIXTURE["batch"]
    terms, canvas, counted, mask, weight, to_canvas = _fixture_terms(case, "logits")
    assert not (mask & ~counted[:, None]).any()  # DARE masks response tokens only: our counted slots
    p_mask = to_canvas(torch.tensor(case["draw"]["p_mask"]).double())
    torch.testing.assert_close(torch.where(mask, 1 / weight, 0.0), p_mask, atol=1e-7, rtol=0)  # 1/p_mask = n/l
    # every counted block of every draw is masked (EBPO's point), and nothing else
    blocks = (mask.view(*mask.shape[:2], -1, LB).any(-1), counted.view(counted.shape[0], 1, -1, LB).any(-1))
    assert torch.equal(blocks[0], blocks[1].expand_as(blocks[0]))
    want = torch.tensor(case["outputs"]["composite_elbo"], dtype=torch.float32)
    torch.testing.assert_close(terms.sum(-1), want, atol=1e-5, rtol=0)
    per_token = torch.tensor(case["outputs"]["token_elbos"]).mean(1)  # [B, R]: DARE's terms averaged over draws
    torch.testing.assert_close(canvas.gather(terms, 0.0), per_token, atol=1e-5, rtol=0)


def test_the_sequence_ratio_loss_and_its_gradient_equal_dare():
    """grpo_loss at importance_sampling_level sequence_sum, loss_type grpo = compute_policy_loss_ebpo (one row
    clipped in the fixture: its gradient is 0); ∂loss/∂term_t = DARE's ∂loss/∂ELBO for every counted token t."""
    case, out = FIXTURE["batch"], FIXTURE["batch"]["outputs"]
    new, canvas, counted, *_ = _fixture_terms(case, "logits")
    old = _fixture_terms(case, "logits_old")[0]
    mask = canvas.gather(counted, False)  # [B, R] completion_mask
    train = canvas.gather(new, 0.0).double().requires_grad_(True)
    cfg = GRPOConfig(loss_type="grpo", importance_sampling_level="sequence_sum", epsilon=0.2, beta=0.0,
                     max_completion_length=mask.shape[1])
    res = grpo_loss(train, canvas.gather(old, 0.0).double(), torch.tensor(case["inputs"]["advantages"]).double(),
                    mask, cfg)
    res.loss.backward()
    assert math.isclose(float(res.loss.detach()), out["pg_loss"], abs_tol=1e-5)
    assert math.isclose(float(res.clip_ratio_region), out["pg_clipfrac"], abs_tol=1e-6) and out["pg_clipfrac"] > 0
    assert math.isclose(float(res.clip_ratio_low), out["pg_clipfrac_lower"], abs_tol=1e-6)
    want = torch.tensor(out["d_pg_loss_d_composite"]).double()[:, None].expand_as(train)
    torch.testing.assert_close(train.grad, torch.where(mask, want, 0.0), atol=1e-5, rtol=0)


def test_the_draw_gives_dares_per_cell_counts_seed_by_seed():
    """One sequence: the offset is the first uniform both draw (DARE: torch.rand(()) on the seeded global RNG; ours:
    the generator's first), so every (draw, block) count l equals DARE's; the subsets differ (law only)."""
    case = FIXTURE["seeds"]
    _, _, counted, to_canvas = _dare_canvas(case)
    K = case["settings"]["mc_num"]
    for seed, dare in case["mask_indices_by_seed"].items():
        theirs = to_canvas(torch.tensor(dare)[None])  # [1, K, T]
        ours, _ = draw_ebpo_masks(counted, LB, K, torch.Generator().manual_seed(int(seed)))
        per_cell = lambda m: m.view(K, -1, LB).sum(-1)  # noqa: E731
        assert torch.equal(per_cell(ours[0]), per_cell(theirs[0])), seed
        assert not (ours & ~counted[:, None]).any()


def test_per_cell_marginals_are_exactly_uniform():
    """l_c as a function of the offset U: on a grid of U that holds every breakpoint (multiples of 1 / (N · n)),
    each count 1..n_j takes exactly 1/n_j of the grid, for every cell, with unequal blocks and an empty one."""
    n = torch.tensor([[3, 4, 0, 1, 2]])  # counted slots per block (block 2 after the stop: not a cell)
    counted = torch.zeros(1, 5 * LB, dtype=torch.bool)
    for j, c in enumerate(n[0].tolist()):
        counted[0, j * LB:j * LB + c] = True
    nn_, cell, blocks = counted_blocks(counted, LB)
    assert torch.equal(nn_, n) and cell.tolist() == [[0, 1, -1, 2, 3]] and blocks.tolist() == [4]
    K = 3
    M = K * 4 * 12  # N · lcm(3, 4, 1, 2)
    U = (torch.arange(M, dtype=torch.float64) + 0.5) / M
    t = noise_levels(U.float(), cell.expand(M, -1), blocks.expand(M), K)  # [M, K, nb]
    l = mask_counts(t, n.expand(M, -1))
    for j, nj in enumerate(n[0].tolist()):
        for k in range(K):
            counts = torch.bincount(l[:, k, j], minlength=nj + 1)
            want = [M] if nj == 0 else [0] + [M // nj] * nj
            assert counts.tolist() == want, (j, k)


@pytest.mark.parametrize("seed", range(5))
def test_the_cells_of_a_sequence_are_stratified_from_one_offset(seed):
    """For any offset the N = K · N_b levels hit each [i/N, (i+1)/N) once; with equal blocks of n | N every count
    1..n occurs exactly N/n times in the sequence (on the drawn masks)."""
    K, nb = 4, 3
    counted = torch.ones(2, nb * LB, dtype=torch.bool)
    mask, weight = draw_ebpo_masks(counted, LB, K, torch.Generator().manual_seed(seed))
    l = mask.view(2, K, nb, LB).sum(-1)  # [B, K, nb]
    for row in l:
        assert torch.bincount(row.flatten(), minlength=LB + 1).tolist() == [0] + [K * nb // LB] * LB
    torch.testing.assert_close(weight.view(2, K, nb, LB)[..., 0], LB / l.double())
    n, cell, blocks = counted_blocks(counted, LB)
    U = torch.rand(2, generator=torch.Generator().manual_seed(100 + seed))
    t = noise_levels(U, cell, blocks, K)
    strata = (t.flatten(1).double() * K * nb).floor().sort(-1).values
    assert torch.equal(strata, torch.arange(K * nb, dtype=torch.float64).expand(2, -1))


def test_the_masked_subset_is_uniform_given_its_count():
    """One block of 4 counted slots, 6,000 sequences with their own offsets: (l, S) has law 1/(n · C(n, l))."""
    R = 6000
    counted = torch.zeros(R, 2 * LB, dtype=torch.bool)
    counted[:, 1:LB + 1] = True  # slots 1-3 of block 0 and slot 4 (block 1): two cells, n = 3 and 1
    mask, _ = draw_ebpo_masks(counted, LB, 1, torch.Generator().manual_seed(0))
    block = mask[:, 0, 1:LB]  # [R, 3]
    outcomes = [s for l in range(1, 4) for s in combinations(range(3), l)]
    index = {s: i for i, s in enumerate(outcomes)}
    obs = torch.zeros(len(outcomes))
    for row in block.tolist():
        obs[index[tuple(i for i, b in enumerate(row) if b)]] += 1
    expected = torch.tensor([R / (3 * comb(3, len(s))) for s in outcomes])
    _, _, p = g_test(obs, expected)
    assert p > 1e-3, (obs, expected)
    assert mask[:, 0, LB].all()  # the single-slot block is masked in every draw


@pytest.fixture(scope="module")
def model():
    return tiny_sdar_model(seed=3, std=0.3)


def test_the_composite_elbo_estimate_is_unbiased_for_its_exact_expectation(model):
    """The per-cell law is the block-wise ELBO's: the same enumerated expectation (test_sdar_training.py)."""
    prompt, pmask, comp, cmask = (x[1:] for x in _batch())  # prompt tail of 3: blocks of 1 and 4 counted tokens
    canvas, clean, counted = completion_canvas(prompt, pmask, comp, cmask, LB, 6, MASK)
    K, R = 2, 2000
    with torch.no_grad():
        exact = _exact_expectation(model, clean, canvas.keep, counted)
        rows = lambda t: t.expand(R, -1)  # noqa: E731
        mask, weight = draw_ebpo_masks(rows(counted), LB, K, torch.Generator().manual_seed(7))
        est = block_elbo_terms(model, rows(clean), rows(canvas.keep), mask, weight, LB, MASK).sum(-1).double()
    se = float(est.std() / R**0.5)
    assert abs(float(est.mean()) - exact) < 4 * se, (float(est.mean()), exact, se)
    assert se < 0.05 * abs(exact)  # the check has power


def test_token_terms_follow_the_draw_and_gradients_flow():
    m = tiny_sdar_model(seed=3, std=0.3).train()
    prompt, pmask, comp, cmask = _batch()
    kw = dict(block_length=LB, gen_length=6, num_draws=3, mask_token_id=MASK)
    per_token = ebpo_token_logp(m, prompt, pmask, comp, cmask, generator=torch.Generator().manual_seed(1), **kw)
    canvas, clean, counted = completion_canvas(prompt, pmask, comp, cmask, LB, 6, MASK)
    mask, weight = draw_ebpo_masks(counted, LB, 3, torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = block_elbo_terms(m, clean, canvas.keep, mask, weight, LB, MASK)
    assert per_token.shape == comp.shape and (per_token[~cmask] == 0).all()
    torch.testing.assert_close(per_token.detach(), canvas.gather(want, 0.0), atol=1e-5, rtol=0)
    part = ebpo_token_logp(m, prompt, pmask, comp, cmask, generator=torch.Generator().manual_seed(1),
                           rows=torch.tensor([1]), **kw)
    torch.testing.assert_close(part.detach(), per_token.detach()[1:], atol=1e-5, rtol=0)
    per_token.sum().backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_the_preset_and_backend_wire_ebpo():
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.sdar.backend import build_backend

    p = get_preset("tiny-sdar")
    q = replace(p, train=replace(p.train, policy_logprob="ebpo", likelihood=replace(p.train.likelihood,
                                                                                     elbo_draws=2)))
    assert q.grpo.importance_sampling_level == "sequence_sum" and "ebpo K=2" in q.summary()
    with pytest.raises(ValueError, match="--loss-type tbpo") as err:
        replace(q, grpo=replace(q.grpo, loss_type="tbpo"))
    assert "\n" not in str(err.value)
    model = tiny_sdar_model(seed=3, std=0.3)
    backend = build_backend(q.sampler, model, None, q.train)
    roll = quantize_model(model, backend="torch")
    prompt, pmask, _, _ = _batch()
    rollout = backend.sample(roll, prompt, pmask, torch.Generator().manual_seed(0))
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    kw = dict(block_length=LB, gen_length=q.sampler.gen_length, mask_token_id=MASK)
    with torch.no_grad():
        got = backend.token_logp(model, rollout, 11)
        want = ebpo_token_logp(model, *args, num_draws=2, generator=torch.Generator().manual_seed(11), **kw)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        seq = backend.mismatch_log_w(model, roll, rollout, torch.Generator().manual_seed(5), "sequence")
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(5)))
        diff = [ebpo_token_logp(x, *args, num_draws=q.train.mismatch_num_draws,
                                generator=torch.Generator().manual_seed(seed), **kw) for x in (model, roll)]
    torch.testing.assert_close(seq, torch.where(rollout.completion_mask, diff[0] - diff[1], 0.0).sum(-1))
    assert (seq != 0).all()  # ℓ: the coupled composite-ELBO difference of master and FP8 copy


@pytest.mark.parametrize("preset", ["tiny-cpu", "tiny-dream"])
def test_other_families_refuse_ebpo_in_one_line(preset):
    p = get_preset(preset)
    with pytest.raises(ValueError, match="built for SDAR models only") as err:
        replace(p, train=replace(p.train, policy_logprob="ebpo"))
    assert "\n" not in str(err.value)


def test_the_plan_counts_ebpo_rows_through_the_family():
    from dllm_ais.plan.workload import workload_from_preset

    p = get_preset("tiny-sdar")
    q = replace(p, train=replace(p.train, policy_logprob="ebpo", likelihood=replace(p.train.likelihood, elbo_draws=3)))
    w = workload_from_preset(q, prompt_len=8)
    # one two-stream forward per draw (models/sdar/shape.py), two canvases each (Family.replay_step_canvases)
    assert w.policy == "ebpo" and w.policy_draws == 2 * 3
