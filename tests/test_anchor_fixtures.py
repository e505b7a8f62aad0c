"""The project's likelihoods against numbers produced by the anchors' own code (tests/fixtures/anchors/*.json).

Each fixture was made by running an anchor's estimator function — copied verbatim into a scratch script outside
the repository, see docs/anchors.md for how — on the tiny LLaDA below, recording the masks it drew and its outputs.
The project's function is fed the same masks and must agree to ATOL = 1e-5 absolute (rtol 0), except LLaDA's
float32 ELBO (2e-5: its float32 sum, see LLADA_FLOAT32_ATOL), which also agrees to 1e-9 on the float64 model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.elbo import elbo_from_draws
from dllm_ais.likelihood.masks import MaskDraws
from dllm_ais.likelihood.one_step import one_step_logprobs
from dllm_ais.likelihood.replay import canvases
from dllm_ais.likelihood.trajectory import merge_commit_steps, merge_rollout, replay_plan
from dllm_ais.models.tiny import init_weights, tiny_model
from dllm_ais.train.backend import DiffusionBackend
from dllm_ais.types import Rollout

FIXTURES = Path(__file__).parent / "fixtures" / "anchors"
ATOL = 1e-5
"""Absolute agreement every fixture test checks (rtol 0: a relative tolerance would let 5e-4 through on an ELBO of
−50); docs/anchors.md states it, and the one fixture with a wider bound and why."""


LLADA_FLOAT32_ATOL = 2e-5
"""llada_elbo.json's float32 values: LLaDA's get_log_likelihood sums its 8 draws' cross-entropies in float32, so at
|ELBO| ≈ 52–60 its value carries float32 rounding (one ulp there is 3.8e-6; the fixture's rows differ from ours by 0,
1, 1 and 3 ulps). The same function on the float64 copy of the model agrees with ours to FLOAT64_ATOL."""
FLOAT64_ATOL = 1e-9
"""Fixtures also recorded on the float64 model: agreement up to float64 rounding."""


def assert_within(got: torch.Tensor, want: torch.Tensor, atol: float = ATOL) -> None:
    """max |got − want| <= atol, compared in float64 (rtol 0)."""
    def f64(x):  # a list of JSON floats goes straight to float64 (through float32 it would round to 1e-7)
        return x.double() if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float64)

    torch.testing.assert_close(f64(got), f64(want), rtol=0, atol=atol)


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def model_of(record: dict):
    """The fixture's tiny LLaDA, rebuilt and checked against the recorded parameter sum."""
    spec = record["model"]
    m = tiny_model(seed=spec["model_seed"])
    init_weights(m, torch.Generator().manual_seed(spec["init_seed"]), std=spec["init_std"])
    total = float(sum(p.detach().double().sum() for p in m.parameters()))
    assert total == pytest.approx(spec["param_sum"], rel=1e-9), "tiny_model/init_weights changed: regenerate fixtures"
    assert m.config.mask_token_id == spec["mask_token_id"]
    return m.eval()


def tensors(record: dict, *names: str, dtype=torch.long):
    return [torch.tensor(record["inputs"][n], dtype=dtype) for n in names]


def test_every_fixture_names_its_anchor():
    files = sorted(FIXTURES.glob("*.json"))
    assert len(files) >= 6
    for f in files:
        anchor = json.loads(f.read_text())["anchor"]
        assert anchor["repo"].count("/") == 1 and len(anchor["commit"]) == 40, f.name
        # one function (path + function) or several, each named with its file:lines
        assert (anchor.get("path") and anchor.get("function")) or (
            anchor.get("functions") and all(":" in where for where in anchor["functions"].values())), f.name


def test_d1_one_step_matches_diffu_grpo():
    """d1's _get_per_token_logps (seeded prompt mask, every completion position masked) = one_step_logprobs fed the
    prompt mask d1 drew."""
    rec = load("d1_one_step.json")
    m = model_of(rec)
    prompt, completion = tensors(rec, "prompt_ids", "completion_ids")
    (masked,) = tensors(rec, "prompt_masked", dtype=torch.bool)
    with torch.no_grad():
        got = one_step_logprobs(m, prompt, torch.ones_like(prompt, dtype=torch.bool), completion,
                                prompt_masked=masked)
    want = torch.tensor(rec["outputs"]["per_token_logps"])
    assert bool(masked.any()) and got.shape == want.shape
    assert_within(got, want)


@pytest.mark.parametrize("dtype,key,atol", [(torch.float32, "log_likelihood", LLADA_FLOAT32_ATOL),
                                             (torch.float64, "log_likelihood_float64", FLOAT64_ATOL)])
def test_llada_elbo_matches_get_log_likelihood(dtype, key, atol):
    """LLaDA's get_log_likelihood (K = 8 mask-count draws, weight L/l) = elbo_from_draws on the same draws, per row:
    within float32 rounding on the float32 model, within float64 rounding on its float64 copy."""
    rec = load("llada_elbo.json")
    m = model_of(rec).to(dtype)
    prompt, completion, counts = tensors(rec, "prompt_ids", "completion_ids", "count")
    (mask,) = tensors(rec, "mask", dtype=torch.bool)  # [B, K, L]
    B, K, L = mask.shape
    assert torch.equal(mask.sum(-1), counts)
    for b in range(B):
        draws = MaskDraws(mask=mask[b:b + 1], level=counts[b:b + 1].double() / L, weight=L / counts[b:b + 1].double())
        ones_p = torch.ones(1, prompt.shape[1], dtype=torch.bool)
        ones_c = torch.ones(1, L, dtype=torch.bool)
        with torch.no_grad():
            got = elbo_from_draws(m, prompt[b:b + 1], ones_p, completion[b:b + 1], ones_c, draws)
        assert got.num_rows == K
        assert_within(got.estimate.reshape(()), rec["outputs"][key][b], atol)


def _tracerl_rollout(rec: dict) -> Rollout:
    prompt, completion, steps = tensors(rec, "prompt_ids", "completion_ids", "step_map")
    ones = torch.ones_like(completion, dtype=torch.bool)
    return Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt, dtype=torch.bool), completion_ids=completion,
                   completion_mask=ones, commit_step=steps, num_steps=int(steps.max()) + 1)


@pytest.mark.parametrize("shrink", [1, 2, 3])
def test_trajectory_merge_matches_tracerl_shrink(shrink):
    """TraceRL's collapse_k_unique + trajectory canvases (shrink N) = --trajectory-merge N: the same canvases and
    scored tokens, and the same log-probs once the mask token leaves the normaliser (the sampler never proposes it:
    ours = TraceRL's − log(1 − p(mask)))."""
    rec = load("tracerl.json")
    out = rec["outputs"][str(shrink)]
    m = model_of(rec)
    rollout = _tracerl_rollout(rec)
    L = rollout.completion_ids.shape[1]
    merged = merge_rollout(rollout, shrink, L)
    plan = replay_plan(merged.commit_step, merged.completion_mask)
    ids, _ = canvases(merged, plan.rows, plan.steps, m.config.mask_token_id)
    P = rollout.prompt_ids.shape[1]
    masked = ids[:, P:] == m.config.mask_token_id  # [N, L] our canvases, row-then-step order as TraceRL's
    scored = merge_commit_steps(rollout.commit_step, shrink, L)[plan.rows] == plan.steps[:, None]
    assert plan.rows.tolist() == out["row"]
    assert torch.equal(masked, torch.tensor(out["canvas_masked"]))
    assert torch.equal(scored, torch.tensor(out["scored"]))
    config = SamplerConfig(gen_length=L, block_length=L, steps=rollout.num_steps, temperature=1.0)
    backend = DiffusionBackend(config, m.config.mask_token_id, [1], policy_logprob="trajectory",
                               trajectory_merge=shrink)
    with torch.no_grad():
        got = backend.token_logp(m, rollout, 0)  # [B, L]
    lp, lp_mask = torch.tensor(out["token_logp"]), torch.tensor(out["mask_token_logp"])  # [N, L]
    want = torch.zeros_like(got)
    for i, row in enumerate(out["row"]):
        sel = torch.tensor(out["scored"][i])
        want[row, sel] = (lp[i] - torch.log1p(-torch.exp(lp_mask[i])))[sel]
    assert_within(got, want)
    assert not math.isclose(float(got.sum()), float(lp[torch.tensor(out["scored"])].sum()), abs_tol=1e-3)
