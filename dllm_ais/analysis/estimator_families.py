"""The exact testbed's model families (rung 1 of the estimator ladder, analysis/estimators.py): per family its sampler
rules, its key in results.json, the sampler's exact law π over every completion, the trajectory likelihood's
coefficient moments and the sampler's paths as recorded rollouts (MDPO's and d-TreeRPO's rows). Chosen once by
`EXACT_FAMILIES[name]` (no branch on a family's name elsewhere).

LLaDA: the low-confidence remasking rule and Fast-dLLM's confidence threshold (one block, steps = L;
analysis/exact_sampler.py, estimator_draws.trajectory). Dream: the uncached `diffusion_generate` with its entropy and
maskgit_plus rules (analysis/exact_dream.py). SDAR: block diffusion (blocks of 2) with its static and dynamic
strategies, and its own estimators in place of the full-attention mask draws (analysis/exact_sdar.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExactFamily:
    """What rung 1 needs of one model family."""

    title: str
    """The family's name in reports ('LLaDA', 'Dream')."""
    rules: tuple[str, ...]
    """Its samplers' position rules, in report order."""
    key_prefix: str
    """Prefix of its results.json per_model keys ('' for LLaDA's, as before Dream joined)."""
    distribution: Callable[..., torch.Tensor]
    """(logits [n, C, L, V], vocab, rule, mask_id, threshold) -> π [n, V^L] (differentiable)."""
    trajectory: Callable
    """(Space, logits, π, vocab, rule, mask_id, threshold, merge) -> estimator_draws.Moments."""
    path_sets: Callable | None = None
    """(logits, vocab, rule, mask_id, threshold) -> per completion its paths as recorded rollouts
    (estimator_paths.PathSet, None where π(y) = 0), what MDPO and d-TreeRPO score; None: no such rows."""
    threshold_rules: tuple[str, ...] = ("threshold",)
    """Its rules that read EstimatorsConfig.threshold."""
    own_moments: Callable | None = None
    """(Space, budgets) -> {(name, setting): Moments}: the family's own model-independent estimators, measured
    instead of the full-attention mask draws and SPG (None: those)."""
    trajectory_rows: Callable = lambda L, merge: -(-L // merge)
    """(L, merge) -> the nominal rows of the trajectory likelihood (its results key; measured rows are separate)."""


def _llada_distribution(logits, vocab, rule, mask_id, threshold):
    from dllm_ais.analysis.exact_sampler import sampler_distribution

    return sampler_distribution(logits, vocab, rule, threshold=threshold)


def _llada_trajectory(sp, logits, pi, vocab, rule, mask_id, threshold, merge):
    from dllm_ais.analysis import estimator_draws as D

    return D.trajectory(sp, logits, pi, vocab, threshold, merge)


def _dream_distribution(logits, vocab, rule, mask_id, threshold):
    from dllm_ais.analysis.exact_dream import dream_distribution

    return dream_distribution(logits, vocab, rule, mask_id)


def _dream_trajectory(sp, logits, pi, vocab, rule, mask_id, threshold, merge):
    from dllm_ais.analysis.estimator_draws import path_moments
    from dllm_ais.analysis.estimator_paths import dream_paths

    return path_moments(sp, dream_paths(logits, vocab, rule, mask_id), merge)


def _llada_path_sets(logits, vocab, rule, mask_id, threshold):
    from dllm_ais.analysis.estimator_paths import llada_paths, path_sets
    from dllm_ais.likelihood.logprobs import proposal_logprobs

    return path_sets(llada_paths(logits, vocab, threshold), logits, vocab,
                     lambda z, y: proposal_logprobs(z, y, 1.0, mask_id))


def _dream_path_sets(logits, vocab, rule, mask_id, threshold):
    from dllm_ais.analysis.estimator_paths import dream_paths, path_sets
    from dllm_ais.models.dream.selection import DreamRule, proposal_logprob

    dr = DreamRule(rule, 1.0, mask_id)
    return path_sets(dream_paths(logits, vocab, rule, mask_id), logits, vocab, lambda z, y: proposal_logprob(z, y, dr))


def _sdar_distribution(logits, vocab, rule, mask_id, threshold):
    from dllm_ais.analysis.exact_sdar import sdar_distribution

    return sdar_distribution(logits, vocab, rule, mask_id, threshold)


def _sdar_trajectory(sp, logits, pi, vocab, rule, mask_id, threshold, merge):
    from dllm_ais.analysis.exact_sdar import trajectory

    return trajectory(sp, logits, vocab, rule, mask_id, threshold, merge)


def _sdar_moments(sp, budgets):
    from dllm_ais.analysis.exact_sdar import own_moments

    return own_moments(sp, budgets)


def _sdar_rows(L, merge):
    from dllm_ais.analysis.exact_testbed import SDAR_BLOCK

    return -(-SDAR_BLOCK // merge)  # two-stream replays: local steps of a block (steps = L: SDAR_BLOCK per block)


EXACT_FAMILIES = {
    "llada": ExactFamily("LLaDA", ("low_confidence", "threshold"), "", _llada_distribution, _llada_trajectory,
                         path_sets=_llada_path_sets),
    "dream": ExactFamily("Dream", ("entropy", "maskgit_plus"), "dream/", _dream_distribution, _dream_trajectory,
                         path_sets=_dream_path_sets),
    "sdar": ExactFamily("SDAR", ("low_confidence_static", "low_confidence_dynamic"), "sdar/", _sdar_distribution,
                        _sdar_trajectory, threshold_rules=("low_confidence_dynamic",), own_moments=_sdar_moments,
                        trajectory_rows=_sdar_rows),
}
"""Rung 1's families by name."""

RULES = {name: f.rules for name, f in EXACT_FAMILIES.items()}
"""The samplers per family (the keys of results.json's per-rule tables)."""

FAMILY_NAMES = {name: f.title for name, f in EXACT_FAMILIES.items()}
"""Family name -> its title in reports."""


def model_key(family: str, seed: int, checkpoint) -> str:
    """results.json's per_model key (LLaDA's without a prefix, as before Dream joined)."""
    return f"{EXACT_FAMILIES[family].key_prefix}seed{seed}/ck{checkpoint}"
