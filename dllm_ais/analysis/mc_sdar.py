"""SDAR's sampler and exact step law for rung 2's Monte-Carlo ground truth (issue 42 item 5, in issue 40's ladder).

A batch is drawn by the package's SDAR sampler (models/sdar/sampler.py `sdar_sample`: native per-block KV cache,
causal across blocks, so each step's logits are the block-causal forward's — no approximation) through a `HeadTap`.
The tap records every forward: the prefill of the prompts' full blocks (when there are any), each denoising step's
block forward and each block's store pass. `step_calls` keeps the denoising steps (their order and blocks follow from
the rollout's commit steps: every step commits a token in some row, blocks run in order, one store pass after each).
Each step's law is then evaluated on a leaf copy of its block logits with models/sdar/selection.py — the functions
models/sdar/trajectory.py `path_terms` sums (the proposal term of every committed slot, the step's selection term
with the schedule's quota n_s of the batch's local step) — and differentiated through the logits (mc_head.py).
Canvas columns map to completion positions through `block_canvas` (a prompt tail shares the first block; the slots
that fill the last block are part of the completion record and of the path, never counted).
"""

from __future__ import annotations

import torch

from dllm_ais.analysis.mc_head import Call, leaf, logit_grad
from dllm_ais.types import Rollout

RUNG2_BLOCK = 4
"""Block length of rung 2's SDAR cells (SDAR's released models are trained with 4)."""


class SDARLaw:
    """SDAR's sampler (static or dynamic strategy, steps = L, T = 1) and its step law."""

    family = "sdar"

    def __init__(self, config, mask_token_id: int):
        from dllm_ais.models.sdar.selection import SDARRule

        if config.temperature <= 0:
            raise ValueError("the path law needs a sampling density: temperature > 0.")
        if config.top_k or config.top_p < 1:
            raise ValueError("rung 2 scores SDAR's sampler without top-k / top-p (the filters' support moves with θ).")
        self.config, self.mask = config, mask_token_id
        self.rule = SDARRule.of(config, mask_token_id)

    @classmethod
    def named(cls, sampler: str, L: int, mask_token_id: int, threshold: float, blocks: int = 1,
              block_length: int = RUNG2_BLOCK) -> tuple:
        """(law, block length) of strategy `sampler` at length L: blocks of `block_length`, steps = L (one commit
        per step's quota: denoising_steps = block_length), T = 1, τ = threshold (dynamic). `blocks` is LLaDA's."""
        from dllm_ais.models.sdar.sampler import SDARSamplerConfig

        config = SDARSamplerConfig(gen_length=L, block_length=block_length, denoising_steps=block_length,
                                   strategy=sampler, threshold=threshold, temperature=1.0, cuda_graphs="off")
        return cls(config, mask_token_id), block_length

    def sample(self, tap, prompt_ids, prompt_mask, stop_ids, generator) -> Rollout:
        from dllm_ais.models.sdar.sampler import sdar_sample

        return sdar_sample(tap, prompt_ids, prompt_mask, self.config, self.mask, stop_ids, generator)

    def canvas(self, rollout: Rollout):
        """The rollout's BlockCanvas, its canvas commit steps [B, T] (−1: none) and tokens [B, T]."""
        from dllm_ais.models.sdar.model import block_canvas

        L = rollout.completion_ids.shape[1]
        cv = block_canvas(rollout.prompt_ids, rollout.prompt_mask, self.config.block_length, self.config.gen_length,
                          self.mask, completion_length=L)
        committed = rollout.commit_step >= 0
        cs = cv.scatter(rollout.commit_step, torch.full_like(cv.ids, -1))
        clean = cv.scatter(torch.where(committed, rollout.completion_ids, self.mask), cv.ids)
        return cv, cs, clean

    def step_calls(self, calls: list[Call], rollout: Rollout) -> list[tuple[int, Call]]:
        """(canvas block, call) of every denoising step, in step order (module doc)."""
        cv, cs, _ = self.canvas(rollout)
        Lb = self.config.block_length
        block_of = {}
        for b, c in (cs >= 0).nonzero().tolist():
            block_of.setdefault(int(cs[b, c]), c // Lb)
        steps = [block_of[t] for t in range(rollout.num_steps)]
        if steps != sorted(steps):
            raise ValueError("SDAR steps out of block order: not a rollout of sdar_sample.")
        rest = calls[1:] if cv.first_block > 0 else calls
        out, i = [], 0
        for k in dict.fromkeys(steps):
            n = steps.count(k)
            out += [(k, c) for c in rest[i:i + n]]
            i += n + 1  # the block's store pass
        if i != len(rest) or any(c.z.shape[1] != Lb for _, c in out):
            raise ValueError(f"{len(calls)} recorded forwards do not match {rollout.num_steps} SDAR steps (prefill, "
                             "steps and one store pass per block expected).")
        return out

    def path_pieces(self, calls: list[Call], rollout: Rollout):
        """(token [B, L, D], select [B, S, D], log P(path) [B], token log q [B, L]): mc_paths.PathRecord's fields."""
        from dllm_ais.models.sdar.selection import proposal_logprob, selection_logprob, transfer_counts

        cv, cs, clean = self.canvas(rollout)
        B, L = rollout.completion_ids.shape
        Lb = self.config.block_length
        counts = transfer_counts(Lb, self.config.denoising_steps)
        slot = cv.scatter(torch.ones_like(rollout.commit_step, dtype=torch.bool), torch.zeros_like(cv.keep))
        cols, valid = cv.completion_columns()
        col_to_j = torch.full(cv.ids.shape, -1, dtype=torch.long)  # canvas column -> completion position
        rows = torch.arange(B)[:, None].expand_as(cols)
        col_to_j[rows[valid], cols[valid]] = torch.arange(L).expand(B, L)[valid]
        steps = self.step_calls(calls, rollout)
        D = steps[0][1].z.shape[-1] * steps[0][1].h.shape[-1]
        token = torch.zeros(B, L, D, dtype=torch.float32)
        select = torch.zeros(B, len(steps), D, dtype=torch.float32)
        log_prob = torch.zeros(B, dtype=torch.float64)
        token_lp = torch.zeros(B, L, dtype=torch.float64)
        first = {}
        for t, (k, call) in enumerate(steps):
            first.setdefault(k, t)
            lo, hi = k * Lb, (k + 1) * Lb
            c = cs[:, lo:hi]
            commit = c == t
            masked = slot[:, lo:hi] & ~((c >= 0) & (c < t))
            quota = torch.full((B,), counts[t - first[k]])
            with torch.enable_grad():
                z = leaf(call.z)
                tok = torch.where(commit, proposal_logprob(z, clean[:, lo:hi], self.rule), 0.0)  # [B, Lb]
                sel = selection_logprob(z, masked, commit, clean[:, lo:hi], quota, self.rule)
                sel = torch.where(commit.any(-1), sel, 0.0)  # a waiting or stopped row: no term
                g_tok = logit_grad(tok, z, retain=True)
                g_sel = logit_grad(sel, z)
            b, i = commit.nonzero(as_tuple=True)
            j = col_to_j[b, lo + i]
            token[b, j] = torch.einsum("cv,cd->cvd", g_tok[b, i], call.h[b, i]).reshape(len(b), -1)
            select[:, t] = torch.einsum("bjv,bjd->bvd", g_sel, call.h).reshape(B, -1)
            log_prob += tok.detach().sum(-1) + sel.detach()
            token_lp[b, j] += tok.detach()[b, i]
        return token, select, log_prob, token_lp

    def replay_rows(self, rollout: Rollout, shrink: int = 1) -> torch.Tensor:
        """[B] float64: two-stream forwards the path-law replay of each sequence makes (models/sdar/trajectory.py:
        one per local step used by any of its blocks; TraceRL's shrink groups `shrink` local steps)."""
        from dllm_ais.models.sdar.trajectory import local_steps, shrink_steps

        cv, cs, _ = self.canvas(rollout)
        B, S = cs.shape[0], self.config.denoising_steps
        cs_b = cs.view(B, cv.num_blocks, self.config.block_length)
        if shrink > 1:
            cs_b = shrink_steps(cs_b, S, shrink)
        return (local_steps(cs_b, S) >= 0).any(1).sum(-1).double()

    def token_logprob(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from dllm_ais.models.sdar.selection import proposal_logprob

        return proposal_logprob(z, y, self.rule)
