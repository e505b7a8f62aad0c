"""`dllm-ais variance --policy` (analysis/policy_variance.py): the spread it reports is the spread of independent draws
of each policy likelihood, recomputed here from the estimators' own API, and the CLI writes one row per setting."""

from __future__ import annotations

import csv

import torch

from dllm_ais.analysis.policy_variance import ROWS, forward_rows, measure_policy, supports
from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.one_step import one_step_logprobs
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.models.tiny import tiny_model


def _seqs(B=3, P=4, L=6):
    g = torch.Generator().manual_seed(5)
    prompt_ids = torch.randint(5, 60, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    completion_ids = torch.randint(5, 60, (B, L), generator=g)
    completion_mask = torch.ones(B, L, dtype=torch.bool)
    completion_mask[0, 4:] = False  # a shorter row: its tail is never scored
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _by_hand(model, seqs, name, K, repeats, seed):
    """The R draws measure_policy takes, through the likelihoods' own functions."""
    mask_id = model.config.mask_token_id
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(repeats):
        draw_seed = int(torch.randint(0, 2**62, (), generator=g))
        gen = torch.Generator().manual_seed(draw_seed)
        with torch.no_grad():
            if name == "one_step":
                lp = one_step_logprobs(model, seqs[0], seqs[1], seqs[2], generator=gen, mask_token_id=mask_id)
                out.append((lp * seqs[3]).sum(-1).double())
                continue
            est = policy_likelihood("elbo", PolicyLikelihoodConfig(elbo_draws=K, elbo_scheme="stratified"), 6)
            draw = est.draw(seqs[0], seqs[1], seqs[3], gen)
            out.append(est.token_logp(model, *seqs, draw, mask_token_id=mask_id).sum(-1).double())
    v = torch.stack(out)
    return float(v.std(0, unbiased=True).mean()), float(v.mean())


def test_reported_spread_is_that_of_independent_draws():
    model = tiny_model(seed=0, dtype=torch.float32)
    seqs = _seqs()
    for name, K in (("one_step", 1), ("elbo-stratified", 2)):
        r = measure_policy(model, seqs, name, K, 4, torch.Generator().manual_seed(11),
                           mask_token_id=model.config.mask_token_id, block_length=6)
        std, mean = _by_hand(model, seqs, name, K, 4, 11)
        assert abs(r.std_seq_logp - std) <= 1e-6 * max(1.0, std) and abs(r.mean_seq_logp - mean) <= 1e-5 * abs(mean)
        assert r.std_seq_logp > 0 and r.std_grad_norm > 0 and r.forward_rows == forward_rows(name, K)


def test_rows_and_supported_settings():
    assert forward_rows("one_step", 1) == 1 and forward_rows("coupled", 1) == 3
    assert forward_rows("elbo-stratified", 8) == 8
    assert not supports("elbo-antithetic", 3) and supports("elbo-quadrature", 4) and not supports("one_step", 2)
    assert set(ROWS) >= {"one_step", "elbo-stratified", "elbo-antithetic", "elbo-quadrature", "coupled", "spg-elbo",
                         "spg-eubo"}


def test_cli_writes_every_policy_estimator(tmp_path):
    from dllm_ais.analysis.variance_cli import main

    out = tmp_path / "v"
    assert main(["--smoke", "--policy", "--ks", "1,2", "--repeats", "2", "--estimators", "coupled", "--out", str(out),
                 "--no-progress"]) == 0
    rows = list(csv.DictReader((out / "policy_variance.csv").open()))
    assert {(r["estimator"], int(r["K"])) for r in rows} == {(n, k) for n in ROWS for k in (1, 2) if supports(n, k)}
    assert all(float(r["std_seq_logp"]) >= 0 and int(r["forward_rows"]) == forward_rows(r["estimator"], int(r["K"]))
               for r in rows)
