"""Sampled paths and their exact path-likelihood gradients (LM head) for rung 2's Monte-Carlo ground truth.

A batch of completions is drawn by the package's own sampler (LLaDA: samplers/diffusion.py `diffusion_sample`, one
full forward per step, no cache; Dream: models/dream/sampler.py `dream_sample`, uncached `diffusion_generate`) through a
`HeadTap`, which records every step's logits and head inputs. The law of each recorded step is then evaluated on a
leaf copy of those logits with the package's exact step law — the same functions `path_logprob` sums
(LLaDA: likelihood/trajectory.py + selection.py: the proposal term of every committed token and the step's selection
term, top-k with the schedule's k or threshold; Dream: models/dream/trajectory.py's law, dream_selection.py;
SDAR: mc_sdar.py, which maps its cached forwards to steps itself) —
and differentiated through the logits (mc_head.py). No replay forward is needed: the sampler's forward of step t is
the forward of canvas t.

`PathRecord` keeps, per sequence, the LM-head gradient of every committed token's proposal term (`token`, at its
commit step) and of every step's selection term (`select`), so the target ∇ log P(path) and every trajectory
likelihood (commit-only, Horvitz–Thompson step subsets, selection on) are weighted sums of the same pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.analysis.mc_head import Call, HeadTap, leaf, logit_grad
from dllm_ais.analysis.mc_sdar import SDARLaw
from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.logprobs import proposal_logprobs
from dllm_ais.likelihood.selection import LOG_ZERO, SelectionRule, selection_logprob
from dllm_ais.likelihood.trajectory import scheduled_count
from dllm_ais.types import Rollout


@dataclass
class PathRecord:
    """The path-likelihood pieces of a batch of B sampled sequences (L positions, S sampler steps)."""

    token: torch.Tensor
    """[B, L, D] float32: ∇_W log q(y_j | canvas of j's commit step) (0 where never committed)."""
    select: torch.Tensor
    """[B, S, D] float32: ∇_W of each step's selection term."""
    log_prob: torch.Tensor
    """[B] float64 log P(path): Σ token terms + Σ selection terms (the package's path law)."""
    token_lp: torch.Tensor
    """[B, L] float64 each committed token's proposal log-probability."""

    def path_grad(self) -> torch.Tensor:
        """[B, D] float64 ∇_W log P(path)."""
        return self.token.double().sum(1) + self.select.double().sum(1)


class LLaDALaw:
    """LLaDA's sampler and step law (uncached; fixed schedule or threshold; one or several blocks)."""

    family = "llada"

    def __init__(self, config: SamplerConfig, mask_token_id: int):
        if config.cache != "none" or config.cfg_scale != 0:
            raise ValueError("rung 2 scores the uncached sampler without guidance (cache none, cfg_scale 0).")
        if config.temperature <= 0:
            raise ValueError("the path law needs a sampling density: temperature > 0.")
        self.config, self.mask = config, mask_token_id
        self.rule = SelectionRule.of(config, mask_token_id)

    @classmethod
    def named(cls, sampler: str, L: int, mask_token_id: int, threshold: float, blocks: int = 1) -> tuple:
        """(law, block length) of a named sampler at length L, T = 1, steps = L: `low_confidence` (one block),
        `low_confidence-blocks` (`blocks` blocks), `threshold` (one block, τ = threshold)."""
        block = L // blocks if sampler == "low_confidence-blocks" else L
        thr = threshold if sampler == "threshold" else None
        config = SamplerConfig(gen_length=L, block_length=block, steps=L, temperature=1.0, threshold=thr)
        return cls(config, mask_token_id), block

    def sample(self, tap: HeadTap, prompt_ids, prompt_mask, stop_ids, generator) -> Rollout:
        from dllm_ais.samplers.diffusion import diffusion_sample

        return diffusion_sample(tap, prompt_ids, prompt_mask, self.config, self.mask, stop_ids, generator)

    def block_of(self, call: Call, P: int) -> int:
        """Completion offset of the block a recorded step computed logits for."""
        return call.positions.start - P

    def step(self, z: torch.Tensor, lo: int, t: int, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """(token terms [B, Lb] float64 on the tokens committed at step t, selection term [B] float64) of step t on
        the block starting at completion offset lo; z [B, Lb, V] the step's logits (a leaf)."""
        B, Lb = z.shape[:2]
        cs = rollout.commit_step[:, lo:lo + Lb]  # [B, Lb]
        y = rollout.completion_ids[:, lo:lo + Lb]
        commit = cs == t
        masked = (cs < 0) | (cs >= t)  # masked before the step
        lp = proposal_logprobs(z, y, self.config.temperature, self.mask).double()  # [B, Lb]
        token = torch.where(commit, lp, 0.0)
        expected = None
        if self.config.threshold is None:
            expected = scheduled_count(cs, torch.full((B,), t, dtype=torch.long), self.config)
        sel = selection_logprob(z, masked, commit, y, self.rule, expected)  # [B]
        return token, torch.where(commit.any(-1), sel, 0.0)  # a row committing nothing (a waiting row): no term

    def token_logprob(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log q(y | z) under the proposal (a trajectory replay's token term)."""
        return proposal_logprobs(z, y, self.config.temperature, self.mask)


class DreamLaw:
    """Dream's uncached sampler (one block, Dream's schedule) and its step law."""

    family = "dream"

    def __init__(self, config, mask_token_id: int):
        if config.cache != "none":
            raise ValueError("rung 2 scores Dream's uncached generate only (a cached rollout's logits came from the "
                             "cache; the package scores it from the sampler's record, without a gradient).")
        if config.temperature <= 0:
            raise ValueError("the path law needs a sampling density: temperature > 0.")
        from dllm_ais.models.dream.selection import DreamRule

        self.config, self.mask = config, mask_token_id
        self.rule = DreamRule.of(config, mask_token_id)

    @classmethod
    def named(cls, sampler: str, L: int, mask_token_id: int, threshold: float, blocks: int = 1) -> tuple:
        """(law, block length L) of Dream's uncached sampler with position rule `sampler` (its `alg`), T = 1,
        steps = L (Dream's threshold and blocks need its cache: not measurable here, so both are ignored)."""
        from dllm_ais.models.dream.sampler import DreamSamplerConfig

        return cls(DreamSamplerConfig(gen_length=L, steps=L, alg=sampler, temperature=1.0), mask_token_id), L

    def sample(self, tap: HeadTap, prompt_ids, prompt_mask, stop_ids, generator) -> Rollout:
        from dllm_ais.models.dream.sampler import dream_sample

        return dream_sample(tap, prompt_ids, prompt_mask, self.config, self.mask, stop_ids, generator)

    def block_of(self, call: Call, P: int) -> int:
        return 0

    def step(self, z: torch.Tensor, lo: int, t: int, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """As LLaDALaw.step with Dream's law (models/dream/trajectory.py): z [B, L, V] the shifted logits."""
        from dllm_ais.models.dream.selection import (
            dream_selection_logprob,
            move_probability,
            proposal_logprob,
        )
        from dllm_ais.models.dream.selection import scheduled_count as dream_count

        cfg = self.config
        cs, y = rollout.commit_step, rollout.completion_ids
        commit = cs == t
        masked = (cs < 0) | (cs >= t)
        token = torch.where(commit, proposal_logprob(z, y, self.rule), 0.0).double()
        p_move = move_probability(t, cfg.steps, cfg.eps) if self.rule.alg == "origin" else None
        sel = dream_selection_logprob(z, masked, commit, y, self.rule, p_move)  # [B]
        if self.rule.alg != "origin":
            k = torch.tensor([dream_count(masked[b:b + 1], t, cfg.steps, cfg.eps) for b in range(z.shape[0])])
            sel = torch.where(commit.sum(-1) == k, sel, torch.full_like(sel, LOG_ZERO))
        return token, sel

    def token_logprob(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from dllm_ais.models.dream.selection import proposal_logprob

        return proposal_logprob(z, y, self.rule)


LAWS = {"llada": LLaDALaw, "dream": DreamLaw, "sdar": SDARLaw}
"""Model family -> its sampler and step law."""


def path_record(law, calls: list[Call], rollout: Rollout) -> PathRecord:
    """Every recorded step's law differentiated through its logits: the PathRecord of the batch (module doc)."""
    if hasattr(law, "path_pieces"):  # a family that maps its own forwards to steps (SDAR: mc_sdar.py)
        return PathRecord(*law.path_pieces(calls, rollout))
    B, L = rollout.completion_ids.shape
    P = rollout.prompt_ids.shape[1]
    if len(calls) != rollout.num_steps:
        raise ValueError(f"{len(calls)} recorded forwards for {rollout.num_steps} sampler steps: rung 2 needs one "
                         "forward per step (no cache, no guidance).")
    D = calls[0].z.shape[-1] * calls[0].h.shape[-1]
    token = torch.zeros(B, L, D, dtype=torch.float32)
    select = torch.zeros(B, len(calls), D, dtype=torch.float32)
    log_prob = torch.zeros(B, dtype=torch.float64)
    token_lp = torch.zeros(B, L, dtype=torch.float64)
    for t, call in enumerate(calls):
        lo = law.block_of(call, P)
        with torch.enable_grad():
            z = leaf(call.z)
            tok, sel = law.step(z, lo, t, rollout)
            g_tok = logit_grad(tok, z, retain=True)  # [B, Lb, V]
            g_sel = logit_grad(sel, z)
        Lb = z.shape[1]
        hit = (rollout.commit_step[:, lo:lo + Lb] == t).nonzero()  # [c, 2] (row, block position)
        if hit.numel():
            b, j = hit[:, 0], hit[:, 1]
            token[b, lo + j] = torch.einsum("cv,cd->cvd", g_tok[b, j], call.h[b, j]).reshape(len(b), -1)
        select[:, t] = torch.einsum("bjv,bjd->bvd", g_sel, call.h).reshape(B, -1)
        log_prob += tok.detach().sum(-1) + sel.detach()
        token_lp[:, lo:lo + Lb] += tok.detach()
    return PathRecord(token=token, select=select, log_prob=log_prob, token_lp=token_lp)


def sample_paths(law, tap: HeadTap, prompt_ids, prompt_mask, stop_ids, generator) -> tuple[Rollout, PathRecord]:
    """Draw a batch with the family's sampler through `tap` and return it with its PathRecord."""
    tap.take()
    rollout = law.sample(tap, prompt_ids, prompt_mask, stop_ids, generator)
    return rollout, path_record(law, tap.take(), rollout)
