"""The π_old, reference and mismatch-correction terms of one GRPO step (the trainer calls these with itself):
π_old's per-token log-probs, the log-ratio ℓ against the rollout policy μ, the correction ω and every mismatch
diagnostic, and the reference policy's log-probs for the KL term."""

from __future__ import annotations

import contextlib

import torch

from dllm_ais import metrics as M
from dllm_ais.rl.correction import CorrectionOutput
from dllm_ais.rl.mismatch_stats import k1, masked_mean, rollout_diagnostics
from dllm_ais.train.distributed import correct_global, gather_rows
from dllm_ais.train.step_data import micro_batches, step_generator


def train_forward(trainer):
    """Context of every π_θ / π_old forward of the master: plain, or QaRL's aligned fake-quant forward."""
    if trainer.cfg.correction.train_forward != "aligned":
        return contextlib.nullcontext()
    from dllm_ais.fp8.backends import BACKENDS
    from dllm_ais.fp8.fake_quant import aligned_forward

    return aligned_forward(trainer.master, BACKENDS[trainer.tc.fp8_backend].scheme)


@torch.no_grad()
def old_logp(trainer, rollout, seeds: list[int]) -> list[torch.Tensor]:
    """π_old's per-token log-probs [B, L] per inner iteration: the master (aligned forward if chosen), or with
    bypass the rollout policy μ itself (no BF16 old-policy pass). A trajectory policy replays one plan per
    rollout: computed once, micro-batch by micro-batch as the update computes π_θ (ratio exactly 1 at first)."""
    backend = trainer.policy.backend
    if trainer.cfg.correction.bypass:
        return [backend.rollout_token_logp(trainer.rollout_model, rollout, s) for s in seeds]
    with train_forward(trainer):
        if backend.token_scale(rollout) is not None:  # a trajectory policy: one replay for every iteration
            chunks = micro_batches(rollout.completion_ids.shape[0], trainer.tc.gradient_accumulation_steps,
                                   rollout.completion_ids.device)
            return [backend.token_logp_by_rows(trainer.master, rollout, chunks)] * len(seeds)
        if getattr(backend, "seed_free_policy", False):  # SDAR's path law: no draws, one replay for every iteration
            return [backend.token_logp(trainer.master, rollout, seeds[0])] * len(seeds)
        return [backend.token_logp(trainer.master, rollout, s) for s in seeds]


def correction(trainer, rollout, adv, logp_old: torch.Tensor, seed: int
               ) -> tuple[CorrectionOutput, dict, torch.Tensor]:
    """ℓ, ω, every mismatch diagnostic of the step, and log μ [B, L] (the rollout policy's per-token log-probs
    under the same masks, for the loss's off-policy mask). logp_old [B, L] is π_old under the logp seed `seed`."""
    cc, backend, mask = trainer.cfg.correction, trainer.policy.backend, rollout.completion_mask
    with torch.no_grad():
        same = cc.bypass or trainer.rollout_model is trainer.master  # μ = π_old by construction
        logp_roll = logp_old if same else backend.rollout_token_logp(trainer.rollout_model, rollout, seed)
        scale = backend.token_scale(rollout)  # [B, L] HT weights of a trajectory policy, else None
        scored = mask if scale is None else mask & (scale > 0)  # the tokens carrying π_old and μ terms
        token_log_w = torch.where(scored, logp_old - logp_roll, 0)  # [B, L]
        if cc.bypass:
            log_w = token_log_w if cc.correction_level != "sequence" else token_log_w.sum(-1)  # zeros
        elif scale is not None and backend.mismatch_estimator == "trajectory":  # π_old's replay is the policy's
            token_log_w = (token_log_w.double() * scale).float()  # ℓ_j, Horvitz–Thompson weighted
            log_w = token_log_w if cc.correction_level != "sequence" else token_log_w.sum(-1)
        elif getattr(backend, "policy_replay_is_ratio", False):  # SDAR: π_old's and μ's path-law replays are ℓ's
            log_w = token_log_w if cc.correction_level != "sequence" else token_log_w.sum(-1)
        elif getattr(backend, "mismatch_estimator", "elbo") == "trajectory":  # replayed canvases, every level
            with train_forward(trainer):
                token_log_w = backend.mismatch_log_w(trainer.master, trainer.rollout_model, rollout, step_generator(
                    trainer.tc.seed, trainer.step, "mismatch", trainer.acc.device), "token")  # [B, L] ℓ_j
            log_w = token_log_w if cc.correction_level != "sequence" else token_log_w.sum(-1)
        elif cc.correction_level == "sequence":
            with train_forward(trainer):
                log_w = backend.mismatch_log_w(trainer.master, trainer.rollout_model, rollout,
                                               step_generator(trainer.tc.seed, trainer.step, "mismatch",
                                                              trainer.acc.device), "sequence")
        else:  # token / geometric: the per-token log-ratios (LLaDA: one-step estimator, same masks as π_old)
            log_w = token_log_w
        # the global batch's rows, gathered once for every statistic below and for the correction
        (g_old, g_roll, g_scored, g_mask), _ = gather_rows(trainer.acc, logp_old, logp_roll, scored, mask)
        diag = rollout_diagnostics(g_old, g_roll, g_scored, cc.log_w_clamp)
        metrics = {M.DIAGNOSTIC_NAMES[k]: float(v) for k, v in diag.items()}
        recorded = rollout.logp_rollout if rollout.logp_rollout is not None else logp_roll  # [B, L]
        metrics[M.ROLLOUT_LOGP_MU] = float(torch.where(scored, recorded, 0).sum(-1).mean())  # concentration
        if cc.train_forward == "aligned":  # what alignment removed: the plain forward on the same rollouts
            plain = backend.token_logp(trainer.master, rollout, seed)
            (g_plain,), _ = gather_rows(trainer.acc, plain)
            metrics[M.MISMATCH_KL_TOKEN_BF16] = float(masked_mean(k1(g_plain.double() - g_roll.double()),
                                                                  g_scored))
            if cc.correction_level == "sequence":  # same mask draws (same generator seed) as the aligned ℓ
                plain_lw = backend.mismatch_log_w(trainer.master, trainer.rollout_model, rollout, step_generator(
                    trainer.tc.seed, trainer.step, "mismatch", trainer.acc.device), "sequence")  # [B]
                (plain_lw,), _ = gather_rows(trainer.acc, plain_lw)
                lengths = g_mask.sum(-1)  # [B_global]
                metrics[M.MISMATCH_KL_BF16] = float(masked_mean(-plain_lw / lengths.clamp(min=1), lengths > 0))
    # over the rows of every process: λ is the global batch's, identical on every rank
    corr = correct_global(trainer.acc, log_w, adv, mask, cc, prev_lam=trainer.prev_lam, token_log_w=token_log_w,
                          global_mask=g_mask)
    metrics.update(corr.metrics())
    return corr, metrics, logp_roll


def ref_logp(trainer, rollout, seed):
    if trainer.ref_model is not None:
        return trainer.policy.backend.token_logp(trainer.ref_model, rollout, seed)
    with trainer.master.disable_adapter():
        return trainer.policy.backend.token_logp(trainer.master, rollout, seed)
