"""`dllm-ais variance --policy`: how noisy each policy likelihood is at a given cost, on any checkpoint.

For every policy likelihood the trainer can use (d1's `one_step`; `elbo` with its three schemes; DiffuCoder's
`coupled`; `spg`'s ELBO for Â > 0 and EUBO for Â ≤ 0) and each K, the sequence log-likelihood ℓ̂_i = Σ_j of the
estimator's per-token terms is drawn R times per sequence with independent masks, on the trainer copy (model a):
  std_seq_logp   the std over the R draws of ℓ̂_i, averaged over sequences (nats);
  mean_seq_logp  the mean of ℓ̂_i over draws and sequences (a bound or an estimate of log p: not comparable across
                 estimators that estimate different things, e.g. d1's one-step value is not a likelihood);
  std_grad_norm  the std over the R draws of ‖∇_θ Σ_i ℓ̂_i / Σ_i L_i‖ (the gradient a GRPO step with Â ≡ 1, ratio 1
                 would take), relative to its mean (`rel_std_grad`): how much of the gradient is mask noise;
against forward rows per sequence (one_step 1, coupled 3, the others K). `one_step` has no K: its randomness is the
prompt mask (p = 0.15); with no prompt tokens masked it is deterministic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

ROWS = {"one_step": 1, "elbo-stratified": None, "elbo-antithetic": None, "elbo-quadrature": None,
        "coupled": 3, "spg-elbo": None, "spg-eubo": None}
"""Policy estimators measured, each with its fixed forward rows per sequence, or None = K (one per draw)."""


@dataclass(frozen=True)
class PolicyVarianceResult:
    estimator: str
    K: int
    forward_rows: int
    """Forward rows per sequence and likelihood evaluation."""
    std_seq_logp: float
    std_err: float
    """Standard error of std_seq_logp over sequences."""
    mean_seq_logp: float
    std_grad_norm: float
    rel_std_grad: float
    num_sequences: int
    repeats: int
    seconds: float


def supports(name: str, K: int) -> bool:
    """Whether `name` runs at K draws (one_step and coupled at their own fixed cost only; antithetic and
    quadrature need an even K)."""
    if ROWS[name] is not None:  # a fixed cost (one_step, coupled): measured once, at K = 1
        return K == 1
    if name in ("elbo-antithetic", "elbo-quadrature"):
        return K % 2 == 0
    return True


def forward_rows(name: str, K: int) -> int:
    return ROWS[name] or K


def _estimator(name: str, K: int, block_length: int):
    """(policy likelihood object or None for one_step, the advantage sign it is measured at)."""
    from dllm_ais.config import PolicyLikelihoodConfig
    from dllm_ais.likelihood.policy import policy_likelihood

    if name == "one_step":
        return None, 1.0
    if name.startswith("elbo-"):
        cfg = PolicyLikelihoodConfig(elbo_draws=K, elbo_scheme=name.split("-", 1)[1])
        return policy_likelihood("elbo", cfg, block_length), 1.0
    if name == "coupled":
        return policy_likelihood("coupled", PolicyLikelihoodConfig(), block_length), 1.0
    cfg = PolicyLikelihoodConfig(elbo_draws=K)
    return policy_likelihood("spg", cfg, block_length), 1.0 if name == "spg-elbo" else -1.0


def _seq_logp(model, est, sign: float, seqs, generator: torch.Generator, mask_token_id: int) -> torch.Tensor:
    """[B] one draw of each sequence's estimate (differentiable)."""
    from dllm_ais.likelihood.one_step import one_step_logprobs

    prompt_ids, prompt_mask, completion_ids, completion_mask = seqs
    if est is None:
        lp = one_step_logprobs(model, prompt_ids, prompt_mask, completion_ids, generator=generator,
                               mask_token_id=mask_token_id)
        return (lp * completion_mask).sum(-1)
    draw = est.draw(prompt_ids, prompt_mask, completion_mask, generator)
    if hasattr(est, "sequence_logp"):  # spg: ELBO for Â > 0, EUBO for Â ≤ 0
        adv = torch.full(completion_mask.shape[:1], sign, device=completion_ids.device)
        return est.sequence_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw, adv,
                                 mask_token_id=mask_token_id)
    return est.token_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw,
                          mask_token_id=mask_token_id).sum(-1)


def measure_policy(model, seqs, name: str, K: int, repeats: int, generator: torch.Generator, *,
                   mask_token_id: int, block_length: int) -> PolicyVarianceResult:
    """R independent draws of `name` at K on `seqs` = (prompt_ids, prompt_mask, completion_ids, completion_mask)."""
    t0 = time.perf_counter()
    est, sign = _estimator(name, K, block_length)
    params = [p for p in model.parameters() if p.requires_grad]
    lengths = seqs[3].sum().clamp(min=1)
    values, norms = [], []
    for _ in range(repeats):
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        ell = _seq_logp(model, est, sign, seqs, torch.Generator().manual_seed(seed), mask_token_id)  # [B]
        grads = torch.autograd.grad(ell.sum() / lengths, params, allow_unused=True)
        norms.append(float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None))))
        values.append(ell.detach().double())
    v = torch.stack(values)  # [R, B]
    per_seq = v.std(0, unbiased=True) if repeats > 1 else torch.zeros(v.shape[1], dtype=v.dtype)  # [B]
    n = torch.tensor(norms, dtype=torch.float64)
    std_n = float(n.std(unbiased=True)) if repeats > 1 else 0.0
    B = v.shape[1]
    return PolicyVarianceResult(
        estimator=name, K=K, forward_rows=forward_rows(name, K), std_seq_logp=float(per_seq.mean()),
        std_err=float(per_seq.std(unbiased=True) / B**0.5) if B > 1 else 0.0, mean_seq_logp=float(v.mean()),
        std_grad_norm=std_n, rel_std_grad=std_n / max(float(n.mean()), 1e-30), num_sequences=B, repeats=repeats,
        seconds=time.perf_counter() - t0)


def format_policy_table(results: list[PolicyVarianceResult]) -> str:
    head = (f"{'estimator':<16} {'K':>3} {'rows':>4} {'std(ℓ̂)':>9} {'±':>8} {'mean(ℓ̂)':>10} {'std‖∇‖':>9} "
            f"{'rel':>6} {'s':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.estimator:<16} {r.K:>3} {r.forward_rows:>4} {r.std_seq_logp:>9.4g} {r.std_err:>8.2g} "
                     f"{r.mean_seq_logp:>10.4g} {r.std_grad_norm:>9.3g} {r.rel_std_grad:>6.3f} {r.seconds:>6.1f}")
    return "\n".join(lines)
