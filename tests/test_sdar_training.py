"""SDAR's training likelihoods (models/sdar/likelihood.py) and trainer backend (models/sdar/backend.py): the block-wise
ELBO from one two-stream forward equals each block scored on its own by the block-causal model; its Monte-Carlo mean
equals the exact expectation over the mask law (enumerated); the coupled FP8/BF16 ratio; the FP8 copy of SDAR equals
its torch twin and syncs in place; what SDAR cannot train is refused in one line."""

from __future__ import annotations

import itertools
from dataclasses import replace
from math import comb

import pytest
import torch
from torch import nn

from dllm_ais.fp8 import FP8Linear, quantize_model, sync_weights
from dllm_ais.fp8.fake_quant import aligned_forward
from dllm_ais.likelihood.logprobs import token_logprobs
from dllm_ais.models.sdar.likelihood import (
    block_elbo_terms,
    block_elbo_token_logp,
    completion_canvas,
    draw_block_masks,
    sft_loss,
)
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.presets import get_preset

MASK, LB = 4, 4


@pytest.fixture(scope="module")
def model():
    return tiny_sdar_model(seed=3, std=0.3)  # std 0.3: peaked, position-dependent logits (a sharper check)


def _batch():
    """Two left-padded prompts (lengths 5 and 3: prompt tails of 1 and 3) and completions of 6 with a stop tail."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 100, (2, 5), generator=g)
    pmask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    comp = torch.randint(5, 100, (2, 8), generator=g)
    cmask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3], dtype=torch.bool)
    return prompt, pmask, comp, cmask


def _reference_logp(model, clean, keep, mask):
    """[B, T] log p at the masked slots, each block scored alone: canvas = clean blocks before it, its noisy block,
    masks after (never seen: block-causal), run through the plain block-causal forward."""
    B, T = clean.shape
    out = torch.zeros(B, T)
    for b in range(B):
        for k in range(T // LB):
            blk = slice(k * LB, (k + 1) * LB)
            if not mask[b, blk].any():
                continue
            x = clean[b].clone()
            x[blk] = torch.where(mask[b, blk], MASK, x[blk])
            x[(k + 1) * LB:] = MASK
            logits = model(x[None], attention_mask=keep[b][None], block_length=LB).logits[0]  # [T, V]
            lp = token_logprobs(logits[blk], clean[b, blk])
            out[b, blk] = torch.where(mask[b, blk], lp, 0.0)
    return out


def test_two_stream_block_elbo_equals_each_block_scored_alone(model):
    prompt, pmask, comp, cmask = _batch()
    canvas, clean, counted = completion_canvas(prompt, pmask, comp, cmask, LB, 6, MASK)
    mask, weight = draw_block_masks(counted, LB, 3, torch.Generator().manual_seed(1))
    assert not (mask & ~counted[:, None]).any() and mask.any(-1).all()
    with torch.no_grad():
        got = block_elbo_terms(model, clean, canvas.keep, mask, weight, LB, MASK)
        want = sum(_reference_logp(model, clean, canvas.keep, mask[:, k]) * weight[:, k].float() for k in range(3)) / 3
    assert got.abs().max() > 1.0  # real terms
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    per_token = block_elbo_token_logp(model, prompt, pmask, comp, cmask, block_length=LB, gen_length=6,
                                      num_draws=3, generator=torch.Generator().manual_seed(1), mask_token_id=MASK)
    assert per_token.shape == comp.shape and (per_token[~cmask] == 0).all()
    torch.testing.assert_close(per_token.sum(-1), got.sum(-1), atol=1e-5, rtol=0)
    rows = torch.tensor([1])  # a micro-batch sees the full batch's draws
    part = block_elbo_token_logp(model, prompt, pmask, comp, cmask, block_length=LB, gen_length=6, num_draws=3,
                                 generator=torch.Generator().manual_seed(1), mask_token_id=MASK, rows=rows)
    torch.testing.assert_close(part, per_token[rows], atol=1e-5, rtol=0)


def _exact_expectation(model, clean, keep, counted):
    """E over the mask law of Σ_b (n_b / l_b) Σ_{j ∈ S_b} log p: every block's every subset, enumerated."""
    total = 0.0
    for k in range(clean.shape[1] // LB):
        slots = counted[0, k * LB:(k + 1) * LB].nonzero().squeeze(-1) + k * LB
        n = len(slots)
        for l in range(1, n + 1):
            for subset in itertools.combinations(slots.tolist(), l):
                m = torch.zeros_like(counted)
                m[0, list(subset)] = True
                lp = _reference_logp(model, clean, keep, m).sum()
                total += (1 / n) * (1 / comb(n, l)) * (n / l) * float(lp)
    return total


@pytest.mark.parametrize("K", [1, 4])
def test_the_block_elbo_estimate_is_unbiased_for_its_exact_expectation(model, K):
    prompt, pmask, comp, cmask = _batch()
    prompt, pmask, comp, cmask = prompt[1:], pmask[1:], comp[1:], cmask[1:]  # tail of 3: blocks of 1 and 4 counted
    canvas, clean, counted = completion_canvas(prompt, pmask, comp, cmask, LB, 6, MASK)
    with torch.no_grad():
        exact = _exact_expectation(model, clean, canvas.keep, counted)
        R = 4000 // K  # rows of the same sequence, each its own K-draw estimate
        rows = lambda t: t.expand(R, -1)  # noqa: E731
        mask, weight = draw_block_masks(rows(counted), LB, K, torch.Generator().manual_seed(7))
        est = block_elbo_terms(model, rows(clean), rows(canvas.keep), mask, weight, LB, MASK).sum(-1).double()
    se = float(est.std() / R**0.5)
    assert abs(float(est.mean()) - exact) < 4 * se, (float(est.mean()), exact, se)
    assert se < 0.05 * abs(exact)  # the check has power


def test_sft_loss_is_finite_and_trains(model):
    prompt, pmask, comp, _ = _batch()
    m = tiny_sdar_model(seed=3, std=0.3).train()
    loss = sft_loss(m, prompt, pmask, comp, MASK, LB, torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and float(loss.detach()) > 0
    assert m.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def _backend(model, **train):
    from dllm_ais.models.sdar.backend import build_backend

    p = get_preset("tiny-sdar")
    return build_backend(p.sampler, model, None, replace(p.train, **train))


def test_coupled_ratio_is_zero_for_one_model_and_the_elbo_difference_for_two(model):
    backend = _backend(model)
    roll = quantize_model(model, backend="torch")
    prompt, pmask, _, _ = _batch()
    rollout = backend.sample(roll, prompt, pmask, torch.Generator().manual_seed(0))
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    with torch.no_grad():
        assert (backend.mismatch_log_w(model, model, rollout, g(), "sequence") == 0).all()
        seq = backend.mismatch_log_w(model, roll, rollout, g(), "sequence")
        tok = backend.mismatch_log_w(model, roll, rollout, g(), "token")
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g()))
        assert backend.mismatch_num_draws != backend.likelihood.elbo_draws  # ℓ's own K
        backend = replace(backend, likelihood=replace(backend.likelihood, elbo_draws=backend.mismatch_num_draws))
        diff = backend.token_logp(model, rollout, seed) - backend.token_logp(roll, rollout, seed)
    torch.testing.assert_close(tok, torch.where(rollout.completion_mask, diff, 0.0))
    torch.testing.assert_close(seq, tok.sum(-1))
    elbo = backend.token_logp(model, rollout, seed).sum(-1)
    assert (seq != 0).all() and (seq.abs() < 0.2 * elbo.abs()).all()  # FP8 moves the ELBO, by a fraction of it


def test_the_trajectory_ratio_is_the_path_law_difference(model):
    """ℓ replays the exact law on both copies; with the path law as the policy (shrink 1, same selection setting) it
    equals the policy's own π_old and μ terms, which the trainer then uses instead (policy_replay_is_ratio)."""
    from dllm_ais.models.sdar.trajectory import path_terms

    backend = _backend(model, mismatch_estimator="trajectory", trajectory_selection=True)  # ℓ: no gradient
    roll = quantize_model(model, backend="torch")
    prompt, pmask, _, _ = _batch()
    rollout = backend.sample(roll, prompt, pmask, torch.Generator().manual_seed(2))
    with torch.no_grad():
        lw = backend.mismatch_log_w(model, roll, rollout, torch.Generator(), "sequence")
        old, mu = (path_terms(m, rollout, backend.sdar, MASK)[0].sum(-1) for m in (model, roll))
        policy = replace(backend, policy_logprob="trajectory")
        terms = policy.token_logp(model, rollout, 0) - policy.rollout_token_logp(roll, rollout, 1)
    torch.testing.assert_close(lw, (old - mu).float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(lw, torch.where(rollout.completion_mask, terms, 0.0).sum(-1), atol=1e-5, rtol=0)
    assert (lw != 0).any()
    assert policy.policy_replay_is_ratio and not backend.policy_replay_is_ratio  # backend: the ELBO policy
    assert not replace(policy, trajectory_merge=2).policy_replay_is_ratio  # TraceRL's shrink is not the exact law
    assert not replace(policy, mismatch_estimator="elbo").policy_replay_is_ratio


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static"])
def test_the_path_law_policy_with_selection_terms_has_finite_gradients(strategy):
    """Impossible events (−inf terms) inside the selection law's log-sums gave NaN gradients (torch.logaddexp of two
    −inf); selection.py's guarded log-sums give 0 there."""
    m = tiny_sdar_model(seed=1, std=0.3)
    p = get_preset("tiny-sdar")
    from dllm_ais.models.sdar.backend import build_backend

    backend = build_backend(replace(p.sampler, sdar_strategy=strategy, sdar_threshold=0.5), m, None,
                            replace(p.train, policy_logprob="trajectory", trajectory_selection=True))
    prompt, pmask, _, _ = _batch()
    rollout = backend.sample(m, prompt, pmask, torch.Generator().manual_seed(1))
    m.train()
    with_sel = backend.token_logp(m, rollout, 0)
    with_sel.sum().backward()
    grads = [q.grad for q in m.parameters() if q.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    without = replace(backend, trajectory_selection=False).token_logp(m, rollout, 0)
    assert torch.isfinite(with_sel).all() and not torch.allclose(with_sel, without)


def test_sdar_refuses_what_it_cannot_train_in_one_line():
    from dllm_ais.models.sdar.backend import resolve_sampler

    p = get_preset("tiny-sdar")
    for train, words in ((dict(policy_logprob="one_step"), "--policy-logprob one_step"),
                         (dict(policy_logprob="trajectory", trajectory_steps=2), "--trajectory-steps"),
                         (dict(likelihood=replace(p.train.likelihood, elbo_scheme="antithetic", elbo_draws=2)),
                          "--elbo-scheme antithetic")):
        with pytest.raises(ValueError, match=words) as err:
            resolve_sampler(replace(p, train=replace(p.train, **train)))
        assert "\n" not in str(err.value)
    preset, line, record = resolve_sampler(p)
    assert preset is p and "low_confidence_dynamic" in line and record["runs"]["denoising_steps"] == 2


def _master():
    return tiny_sdar_model(seed=2, hidden_size=128, intermediate_size=256, head_dim=32)


def test_fp8_copy_equals_its_torch_twin_and_syncs_in_place():
    master = _master()
    copy = quantize_model(master, backend="torch")  # the fused copy (models/sdar/fused_fp8.py)
    fp8 = {n for n, m in copy.named_modules() if isinstance(m, FP8Linear)}
    assert fp8 == {f"layers.{i}.{n}" for i in range(2) for n in ("qkv", "o_proj", "gate_up", "down")}
    assert not isinstance(copy.lm_head, FP8Linear)
    x = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[1, :4] = False
    with torch.no_grad():
        got = copy(x, keep).logits
        with aligned_forward(master):
            twin = master(x, keep).logits
        plain = master(x, keep).logits
    assert torch.equal(got, twin) and (got - plain).abs().max() > 0.01
    ptrs = {n: t.data_ptr() for n, t in copy.state_dict().items()}
    master.train()
    opt = torch.optim.AdamW(master.parameters(), lr=1e-3)
    nn.functional.cross_entropy(master(x, keep).logits.transpose(1, 2), x).backward()
    opt.step()
    master.eval()
    sync_weights(master, copy)
    with torch.no_grad():
        synced, fresh = copy(x, keep).logits, quantize_model(master, backend="torch")(x, keep).logits
    assert torch.equal(synced, fresh) and not torch.equal(synced, got)
    assert all(t.data_ptr() == ptrs[n] for n, t in copy.state_dict().items())  # in place


def test_a_trajectory_grpo_run_on_tiny_sdar_moves_the_policy(tmp_path, monkeypatch):
    """The path law (token terms) as the policy likelihood and as the mismatch ratio, through the trainer (FP8
    rollouts)."""
    import math

    from safetensors.torch import load_file
    from test_backends import REWARD_MODULE, train_briefly

    from dllm_ais import metrics as M
    from dllm_ais.models.sdar.backend import SDARBackend
    from dllm_ais.train.run_dir import RunDir

    (tmp_path / "sdar_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    # at shrink 1, ℓ is π_old's replay minus μ's, both the policy's own: no third and fourth replay
    monkeypatch.setattr(SDARBackend, "mismatch_log_w", lambda *a, **k: pytest.fail("the path was replayed again"))
    out = tmp_path / "run"
    rows = train_briefly("tiny-sdar", out, "sdar_reward:reward", policy_logprob="trajectory",
                         mismatch_estimator="trajectory")
    assert len(rows) == 2 and all(math.isfinite(r[M.AIS_LAMBDA]) and math.isfinite(r[M.LOSS_POLICY]) for r in rows)
    assert any(r["ais/log_w_min"] != 0.0 for r in rows)  # FP8 rollouts: the path laws differ
    start = load_file(str(next((out / "sft").glob("*.safetensors"))))
    end = load_file(str(next((RunDir(out).latest() / "model").glob("*.safetensors"))))
    assert any(not torch.equal(start[k], end[k]) for k in start)


def test_tracerl_shrink_groups_steps_as_the_anchor_does():
    """tests/fixtures/tracerl_shrink.json: dLLM-RL's `collapse_k_unique` on 40 random block step maps (its source
    field says where from); `shrink_steps` must make the same groups."""
    import json
    from pathlib import Path

    from dllm_ais.models.sdar.trajectory import shrink_steps

    fx = json.loads((Path(__file__).parent / "fixtures" / "tracerl_shrink.json").read_text())
    assert "rl_trado.py:219-231" in fx["source"]
    for case in fx["cases"]:
        ours = shrink_steps(torch.tensor(case["steps"])[None, None], 6, case["shrink"])[0, 0].tolist()
        theirs = case["collapsed"]
        assert [[a == b for b in ours] for a in ours] == [[a == b for b in theirs] for a in theirs], case
    assert any(len(set(c["collapsed"])) < len(set(c["steps"])) for c in fx["cases"])  # shrink merged something


def test_tracerl_shrink_of_every_step_scores_each_block_from_its_first_state(model):
    """shrink >= denoising_steps: every token of a block scored at the state before the block's first step (all its
    completion slots masked, the finished blocks before it clean) — checked against that one forward."""
    from dllm_ais.models.sdar.model import block_canvas, two_stream_logits
    from dllm_ais.models.sdar.selection import SDARRule, proposal_logprob
    from dllm_ais.models.sdar.trajectory import path_terms

    backend = _backend(model, policy_logprob="trajectory", trajectory_merge=2)
    prompt, pmask, _, _ = _batch()
    rollout = backend.sample(model, prompt, pmask, torch.Generator().manual_seed(3))
    cfg = backend.sdar
    with torch.no_grad():
        got = backend.token_logp(model, rollout, 0)  # merge 2 = shrink 2 >= 2 steps a block
        exact = path_terms(model, rollout, cfg, MASK, selection=False)[0]
        L = rollout.completion_ids.shape[1]
        canvas = block_canvas(prompt, pmask, LB, cfg.gen_length, MASK, completion_length=L)
        committed = rollout.commit_step >= 0
        clean = canvas.scatter(torch.where(committed, rollout.completion_ids, MASK), canvas.ids)
        slots = canvas.scatter(torch.ones_like(committed), torch.zeros_like(canvas.keep))
        logits = two_stream_logits(model, torch.where(slots, MASK, clean), clean, canvas.keep, LB)
        want = canvas.gather(proposal_logprob(logits, clean, SDARRule.of(cfg, MASK)), 0.0)
    counted = rollout.completion_mask & committed
    torch.testing.assert_close(got, torch.where(counted, want, 0.0).float(), atol=1e-5, rtol=0)
    assert not torch.allclose(got, exact.float())  # shrink changed what is scored
