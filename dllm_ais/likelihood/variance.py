"""Variance of the FP8/BF16 log-ratio estimators at equal forward passes (the core of scripts/variance.py).

Estimators compared (all estimate ℓ = ELBO_a − ELBO_b; every one costs 2 models × K forward rows per sequence):

| name        | draws shared by both models | scheme     | levels (l or t)               |
|-------------|-----------------------------|------------|-------------------------------|
| independent | no                          | mask-count | stratified                    |
| coupled     | yes (common random numbers) | mask-count | i.i.d.                        |
| stratified  | yes                         | mask-count | stratified                    |
| antithetic  | yes                         | mask-count | stratified, K/2 + complements |
| uniform_t   | yes                         | uniform-t  | stratified                    |

`independent` vs `stratified` isolates the coupling (same draw scheme); `coupled` vs `stratified` isolates
stratification. The std of ℓ is taken per sequence over R independent replicates (the batch is repeated R times in
one call; every row draws its own offsets and masks, so this equals R calls with different seeds) and then averaged
over sequences.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dllm_ais.likelihood.elbo import DEFAULT_BATCH_SIZE
from dllm_ais.likelihood.ratio import coupled_log_ratio, independent_log_ratio


@dataclass(frozen=True)
class EstimatorSpec:
    """One log-ratio estimator configuration of the study."""

    name: str
    """Name in the csv and the plot."""
    fn: Callable
    """coupled_log_ratio or independent_log_ratio."""
    kwargs: dict = field(default_factory=dict)
    """scheme / stratified / antithetic passed to fn."""
    models: int = 2
    """Models evaluated per draw (forward rows per draw)."""

    def supports(self, num_draws: int) -> bool:
        """Antithetic draws come in pairs: K must be even."""
        return not (self.kwargs.get("antithetic") and num_draws % 2)

    def forward_passes(self, num_draws: int) -> int:
        """Nominal forward rows per sequence: models × K."""
        return self.models * num_draws


ESTIMATORS: dict[str, EstimatorSpec] = {s.name: s for s in (
    EstimatorSpec("independent", independent_log_ratio, dict(scheme="mask_count", stratified=True)),
    EstimatorSpec("coupled", coupled_log_ratio, dict(scheme="mask_count", stratified=False)),
    EstimatorSpec("stratified", coupled_log_ratio, dict(scheme="mask_count", stratified=True)),
    EstimatorSpec("antithetic", coupled_log_ratio, dict(scheme="mask_count", stratified=True, antithetic=True)),
    EstimatorSpec("uniform_t", coupled_log_ratio, dict(scheme="uniform_t", stratified=True)),
)}
"""The estimators of the study, by name."""


@dataclass(frozen=True)
class VarianceResult:
    """The spread of one estimator at one K."""

    estimator: str
    """Estimator name (ESTIMATORS)."""
    K: int
    """Draws per model per estimate."""
    forward_passes: int
    """Nominal forward rows per sequence and estimate (2 models × K)."""
    rows_per_sequence: float
    """Forward rows actually run per sequence and estimate (uniform-t skips draws that mask nothing)."""
    std_log_ratio: float
    """Std of ℓ over the R replicates, per sequence, averaged over sequences."""
    std_err: float
    """Standard error of std_log_ratio across sequences (std over sequences / sqrt(B))."""
    mean_log_ratio: float
    """Mean of ℓ over replicates and sequences."""
    std_elbo_a: float
    """Std of model_a's ELBO alone (the masking noise the coupling must cancel), averaged over sequences."""
    num_sequences: int
    """B, sequences in the study."""
    repeats: int
    """R, replicates per sequence."""
    seconds: float
    """Wall time of the measurement."""


def measure(model_a, model_b, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
            completion_mask: torch.Tensor, spec: EstimatorSpec, num_draws: int, repeats: int,
            generator: torch.Generator | int, batch_size: int = DEFAULT_BATCH_SIZE,
            mask_token_id: int | None = None) -> VarianceResult:
    """Std of ℓ per sequence over `repeats` replicates of `spec` with K = num_draws, averaged over the B sequences."""
    if repeats < 2:
        raise ValueError(f"repeats={repeats} must be >= 2 to estimate a standard deviation.")
    if not spec.supports(num_draws):
        raise ValueError(f"{spec.name} needs an even K, got {num_draws}.")
    B = prompt_ids.shape[0]
    rep = [t.repeat(repeats, 1) for t in (prompt_ids, prompt_mask, completion_ids, completion_mask)]  # [R·B, ·]
    start = time.perf_counter()
    with torch.no_grad():
        est = spec.fn(model_a, model_b, *rep, num_draws=num_draws, generator=generator, batch_size=batch_size,
                      mask_token_id=mask_token_id, **spec.kwargs)
    seconds = time.perf_counter() - start
    ell = est.log_ratio.view(repeats, B)  # [R, B]
    std = ell.std(0)  # [B]
    return VarianceResult(
        estimator=spec.name, K=num_draws, forward_passes=spec.forward_passes(num_draws),
        rows_per_sequence=est.num_rows / (repeats * B), std_log_ratio=std.mean().item(),
        std_err=(std.std().item() / B**0.5) if B > 1 else float("nan"), mean_log_ratio=ell.mean().item(),
        std_elbo_a=est.elbo_a.view(repeats, B).std(0).mean().item(), num_sequences=B, repeats=repeats,
        seconds=seconds)
