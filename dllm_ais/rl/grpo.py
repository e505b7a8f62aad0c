"""The GRPO loss: token- or sequence-level clipped surrogate, optional k3 KL, weighted by the correction ω.

Per token t of sequence i (TRL's GRPOTrainer, written out):

    r_it   = exp(logp_train − logp_old)                       importance_sampling_level = token
           = exp(mean_t (logp_train − logp_old))  [B, 1]      importance_sampling_level = sequence (GSPO)
           = exp(Σ_t (logp_train − logp_old))     [B, 1]      importance_sampling_level = sequence_sum (EBPO)
    surr   = −min(r Â_i, clip(r, 1 − ε, 1 + ε_high) Â_i)
    kl     = exp(logp_ref − logp_train) − (logp_ref − logp_train) − 1              (k3)
    ℓ_it   = ω · surr + β · kl                                ω: [B] or [B, L], detached (dllm_ais/rl/correction.py)
    loss   = aggregate(ℓ) by loss_type

loss_type = tbpo (trust-band policy optimisation, this project's reading of QaRL; docs/corrections.md §TBPO): the
GSPO sequence ratio s_i = exp(mean_t (logp_train − logp_old)), clipped to the band [1 − ε, 1 + ε_high], and for
Â_i < 0 the dual clip of dual-clip PPO:

    J_i    = min(s_i Â_i, clip(s_i, 1 − ε, 1 + ε_high) Â_i)
    J_i    = max(J_i, c Â_i)            when Â_i < 0   (so the per-sequence loss −J_i <= c |Â_i|, c = dual_clip > 1)
    loss   = mean_i ω̄_i · (−J_i)        (grpo aggregation: mean over each sequence's tokens, then over sequences)

Options (each off by default): `clip_ratio_c` — verl's per-token dual clip, surr = min(surr, c·|Â|) where Â < 0
(compute_policy_loss_vanilla); loss_type = cispo — TRL's CISPO, ℓ_it = −sg(min(r_it, ε_high)) Â_i log π_θ(y_t), token
mean; `off_policy_mask_threshold` δ — TRL's off-policy sequence mask (DeepSeek-V3.2): the surrogate of sequence i is
kept iff Â_i >= 0 or mean_t (log μ − log π_θ) <= δ (log μ = `logp_rollout`, π_θ detached); bypass-mode rejection
(`bypass_correction`) — verl's rollout_rs on π_θ / μ inside the loss, rejected tokens weighted 0 (`rejected=zero`) or
removed from the mask (`drop`).

ω multiplies the surrogate only (not the KL), so the loss is affine in ω and the gradient of AIS's ω = (1 − λ) + λ w̃
is exactly (1 − λ) ∇loss(ω = 1) + λ ∇loss(ω = w̃). Positions outside `mask` are replaced (torch.where) before any
arithmetic: NaN/inf there never reach the loss or its gradient. Dividing by gradient-accumulation steps is the
trainer's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm_ais.metrics import CORR_REJECT_FRAC, LOSS_OFF_POLICY_MASKED
from dllm_ais.rl.config import CorrectionConfig, GRPOConfig
from dllm_ais.rl.mismatch_stats import chain_keep


@dataclass(frozen=True)
class LossOutput:
    """The loss and its detached diagnostics (TRL's names; clip ratios as TRL's clip_ratio/{low,high,region}_mean)."""

    loss: torch.Tensor
    """[] differentiable loss."""
    policy_loss: torch.Tensor
    """[] aggregated ω-weighted clipped surrogate (the loss without the β · KL term)."""
    kl: torch.Tensor | None
    """[] mean per-token k3 KL to the reference over counted tokens; None when no logp_ref was given."""
    clip_ratio_low: torch.Tensor | None
    """[] fraction of counted tokens (sequences, at sequence level) with r < 1 − ε and Â < 0; None for a loss without
    a ratio or clip (SPG: no loss/clip_frac* metrics at all)."""
    clip_ratio_high: torch.Tensor | None
    """[] fraction with r > 1 + ε_high and Â > 0 (None: no clip)."""
    clip_ratio_region: torch.Tensor | None
    """[] fraction clipped either way (low or high): where the surrogate's gradient is zero (None: no clip)."""
    dual_clip_frac: torch.Tensor | None = None
    """[] loss_type=tbpo: fraction of non-empty sequences whose loss the dual clip bounds (Â < 0, −J = c|Â|);
    clip_ratio_c: fraction of counted tokens at verl's per-token bound (verl's pg_clipfrac_lower)."""
    off_policy_masked_frac: torch.Tensor | None = None
    """[] off_policy_mask_threshold: fraction of non-empty sequences whose surrogate the off-policy mask removed."""
    reject_frac: torch.Tensor | None = None
    """[] bypass-mode rejection: fraction of counted tokens rejected on π_θ / μ (logged as corr/reject_frac)."""

    def metrics(self) -> dict[str, float]:
        """Scalar metrics under DESIGN.md §8 names (one device sync)."""
        names = {"loss/policy": self.policy_loss}
        if self.clip_ratio_region is not None:
            names.update({"loss/clip_frac": self.clip_ratio_region, "loss/clip_frac_low": self.clip_ratio_low,
                          "loss/clip_frac_high": self.clip_ratio_high})
        if self.kl is not None:
            names["loss/kl"] = self.kl
        if self.dual_clip_frac is not None:
            names["loss/dual_clip_frac"] = self.dual_clip_frac
        if self.off_policy_masked_frac is not None:
            names[LOSS_OFF_POLICY_MASKED] = self.off_policy_masked_frac
        if self.reject_frac is not None:
            names[CORR_REJECT_FRAC] = self.reject_frac
        values = torch.stack([v.detach().double() for v in names.values()]).tolist()
        return dict(zip(names, values, strict=True))


# ------------------------------------------------------------------------------------ importance-sampling level

def token_log_ratio(log_ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-token log ratio, unchanged: [B, L] -> [B, L]."""
    return log_ratio


def sequence_log_ratio(log_ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """GSPO: mean log ratio over counted tokens (log of the geometric mean ratio): [B, L] -> [B, 1]."""
    lengths = valid.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    return torch.where(valid, log_ratio, 0).sum(-1, keepdim=True) / lengths


def sequence_sum_log_ratio(log_ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """EBPO: summed log ratio over counted tokens (log of the ratio of the sequence likelihoods whose per-token terms
    these are; DARE's compute_policy_loss_ebpo): [B, L] -> [B, 1]."""
    return torch.where(valid, log_ratio, 0).sum(-1, keepdim=True)


LOG_RATIO_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
    "sequence_sum": sequence_sum_log_ratio,
}


# ------------------------------------------------------------------------------------------------- aggregations
# x: [B, L] or [B, 1] per-token loss (broadcast over L); valid: [B, L] bool; returns [].

def aggregate_grpo(x: torch.Tensor, valid: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """Mean over each sequence's counted tokens, then mean over the B sequences (empty sequences count as 0)."""
    per_seq = torch.where(valid, x, 0).sum(-1) / valid.sum(-1).clamp(min=1)  # [B]
    return per_seq.mean()


def aggregate_dr_grpo(x: torch.Tensor, valid: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """Dr.GRPO: sum over counted tokens / (B · max_completion_length), a constant normaliser."""
    return torch.where(valid, x, 0).sum() / (valid.shape[0] * max_completion_length)


def aggregate_token_mean(x: torch.Tensor, valid: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """BNPO / DAPO: sum over counted tokens / number of counted tokens in the batch (0 if none).

    TRL's `dapo` divides by the token count of the whole generation batch across processes and accumulation steps;
    on one micro-batch that is this token mean. A trainer that splits a batch should rescale accordingly.
    """
    return torch.where(valid, x, 0).sum() / valid.sum().clamp(min=1)


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "grpo": aggregate_grpo,
    "dr_grpo": aggregate_dr_grpo,
    "bnpo": aggregate_token_mean,
    "dapo": aggregate_token_mean,
    "tbpo": aggregate_grpo,
    "cispo": aggregate_token_mean,
}


def _batch_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of a per-token [B, L] statistic over counted tokens, or of a per-sequence [B, 1] one over non-empty
    sequences; 0 when nothing counts."""
    if x.shape[-1] == 1 and valid.shape[-1] != 1:
        valid = valid.any(-1, keepdim=True)  # [B, 1]
    return torch.where(valid, x, 0).sum() / valid.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------------------- loss

def grpo_loss(logp_train: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              cfg: GRPOConfig, *, weights: torch.Tensor | None = None,
              logp_ref: torch.Tensor | None = None, logp_rollout: torch.Tensor | None = None,
              bypass_correction: CorrectionConfig | None = None,
              token_scale: torch.Tensor | None = None) -> LossOutput:
    """Clipped GRPO surrogate (+ β k3 KL), aggregated by cfg.loss_type.

    logp_train: [B, L] log π_θ of the completion tokens (differentiable).
    logp_old:   [B, L] log π_old (rollout-time BF16 policy), treated as a constant.
    adv:        [B] advantages Â.
    mask:       [B, L] bool, tokens that count; other positions may hold anything, NaN included.
    weights:    None, [B] or [B, L]: ω from dllm_ais.rl.correction (detached here); multiplies the surrogate.
    logp_ref:   [B, L] reference log-probs; required when cfg.beta > 0 (logged as `kl` whenever given).
    logp_rollout: [B, L] log μ (rollout policy) for cfg.off_policy_mask_threshold; None = logp_old (TRL without vLLM).
    bypass_correction: in bypass mode (π_old = μ) the correction config whose rejection rules act here on
                π_θ / μ = exp(logp_train − logp_old) (verl's bypass); None = no in-loss rejection.
    token_scale: None or [B, L] Horvitz–Thompson weights of a step-subsampled likelihood (S_b / K on the replayed
                tokens, 0 on the others; likelihood/trajectory.py): every per-token term (surrogate and KL) is
                multiplied by it while the normalisers keep counting every token of `mask`, so that the loss's
                expectation over the subsample is the loss on every step.
    """
    valid = mask.bool()  # [B, L]
    if logp_train.shape != valid.shape or logp_old.shape != valid.shape:
        raise ValueError(f"logp_train {tuple(logp_train.shape)} and logp_old {tuple(logp_old.shape)} must both have "
                         f"the mask's shape {tuple(valid.shape)}.")
    if adv.shape != valid.shape[:1]:
        raise ValueError(f"adv must have shape [B] = {tuple(valid.shape[:1])}, got {tuple(adv.shape)}.")
    if cfg.beta != 0.0 and logp_ref is None:
        raise ValueError(f"GRPOConfig.beta={cfg.beta} needs logp_ref; pass reference log-probs or set beta=0.")
    if cfg.loss_type == "dr_grpo" and valid.shape[1] > cfg.max_completion_length:
        raise ValueError(f"completion length L={valid.shape[1]} exceeds max_completion_length="
                         f"{cfg.max_completion_length}, the dr_grpo normaliser; raise max_completion_length.")
    eps_low = cfg.epsilon
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    has_tokens = valid.any(-1)  # [B]

    logp = torch.where(valid, logp_train, 0)  # [B, L]
    old = torch.where(valid, logp_old.detach(), 0)  # [B, L]
    reject_frac = None
    in_loss_keep = None
    rules = () if bypass_correction is None else bypass_correction.rejection_rules()
    if rules:  # verl's bypass: rollout_rs on log π_θ − log μ (π_old = μ), recomputed every update
        keep, _ = chain_keep(logp.detach() - old, valid, rules, bypass_correction.log_w_clamp)  # [B] or [B, L]
        keep = keep[:, None].expand_as(valid) if keep.dim() == 1 else keep  # [B, L]
        reject_frac = _batch_mean((~keep).to(logp.dtype), valid)
        if bypass_correction.rejected == "drop":
            valid = valid & keep
            has_tokens = valid.any(-1)
        else:
            in_loss_keep = keep
    a = torch.where(has_tokens, adv.detach(), 0)[:, None]  # [B, 1]
    tbpo = cfg.loss_type == "tbpo"
    level = "sequence" if tbpo else cfg.importance_sampling_level  # TBPO's ratio is GSPO's sequence ratio
    log_iw = LOG_RATIO_LEVELS[level](logp - old, valid)  # [B, L] or [B, 1]
    coef_1 = torch.exp(log_iw)
    dual_clipped = None
    if cfg.loss_type == "cispo":  # TRL: −sg(min(r, ε_high)) Â log π_θ; ε_high is the absolute cap here
        objective = torch.clamp(coef_1, max=eps_high).detach() * a * logp  # [B, L]
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        objective = torch.min(coef_1 * a, coef_2 * a)  # [B, L] or [B, 1]
    if tbpo:
        bound = cfg.dual_clip * a  # [B, 1]
        dual_clipped = (a < 0) & (objective < bound)
        objective = torch.where(a < 0, torch.max(objective, bound), objective)
    elif cfg.clip_ratio_c is not None:  # verl: for Â < 0, −objective <= c |Â| per token
        bound = cfg.clip_ratio_c * a  # [B, 1]
        dual_clipped = (a < 0) & (objective < bound)
        objective = torch.where(a < 0, torch.max(objective, bound), objective)
    surrogate = -objective
    off_policy_frac = None
    if cfg.off_policy_mask_threshold is not None:  # TRL's get_off_policy_mask: [B, 1], 1 = keep
        mu = old if logp_rollout is None else torch.where(valid, logp_rollout.detach(), 0)  # [B, L]
        seq_kl = LOG_RATIO_LEVELS["sequence"](mu - logp.detach(), valid)  # [B, 1] mean_t (log μ − log π_θ)
        opm = (a >= 0) | (seq_kl <= cfg.off_policy_mask_threshold)  # [B, 1]
        off_policy_frac = _batch_mean((~opm).to(logp.dtype), valid)
        surrogate = surrogate * opm
    if in_loss_keep is not None:
        surrogate = surrogate * in_loss_keep

    if weights is not None:
        omega = weights.detach()
        if omega.shape == valid.shape[:1]:
            omega = torch.where(has_tokens, omega, 1)[:, None]  # [B, 1]
        elif omega.shape == valid.shape:
            omega = torch.where(valid, omega, 1)  # [B, L]
        else:
            raise ValueError(f"weights must have shape [B] or [B, L] = {tuple(valid.shape)}, got "
                             f"{tuple(omega.shape)}.")
        surrogate = surrogate * omega

    per_token = surrogate
    kl = None
    if logp_ref is not None:
        ref_diff = torch.where(valid, logp_ref.detach(), 0) - logp  # [B, L]
        per_token_kl = torch.exp(ref_diff) - ref_diff - 1  # [B, L]
        kl = _batch_mean(per_token_kl.detach(), valid)
        if cfg.beta != 0.0:
            per_token = surrogate + cfg.beta * per_token_kl

    if token_scale is not None:
        ht = torch.where(valid, token_scale.detach(), 0).to(per_token.dtype)  # [B, L]
        surrogate, per_token = surrogate * ht, per_token * ht
    aggregate = AGGREGATIONS[cfg.loss_type]
    loss = aggregate(per_token, valid, cfg.max_completion_length)
    with torch.no_grad():
        policy_loss = aggregate(surrogate, valid, cfg.max_completion_length)
        if cfg.loss_type == "cispo":  # TRL's cispo_clip_ratio: the capped ratio of a positive sample
            is_low, is_high = torch.zeros_like(coef_1, dtype=torch.bool), (coef_1 > eps_high) & (a > 0)
        else:
            is_low = (coef_1 < 1 - eps_low) & (a < 0)  # [B, L] or [B, 1]
            is_high = (coef_1 > 1 + eps_high) & (a > 0)
        clip_low = _batch_mean(is_low.to(logp.dtype), valid)
        clip_high = _batch_mean(is_high.to(logp.dtype), valid)
        clip_region = _batch_mean((is_low | is_high).to(logp.dtype), valid)
        dual_frac = None if dual_clipped is None else _batch_mean(dual_clipped.to(logp.dtype), valid)
    return LossOutput(loss=loss, policy_loss=policy_loss, kl=kl, clip_ratio_low=clip_low,
                      clip_ratio_high=clip_high, clip_ratio_region=clip_region, dual_clip_frac=dual_frac,
                      off_policy_masked_frac=off_policy_frac, reject_frac=reject_frac)
