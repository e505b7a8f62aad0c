"""`dllm-ais train`'s flag groups: correction and loss (docs/corrections.md), Fast-dLLM rollouts and the estimators
that see them. New train flags go here (and into FIELD_FLAGS when they set a config field)."""

from __future__ import annotations

import argparse


def add_correction_args(p: argparse.ArgumentParser) -> None:
    from dllm_ais.rl.config import (
        AIS_COMBINERS,
        AIS_TARGETS,
        CORRECTION_LEVELS,
        CORRECTIONS,
        LOSS_TYPES,
        TRAIN_FORWARDS,
        TRL_ALIASES,
        CorrectionConfig,
    )

    p.add_argument("--correction", default=None, choices=[*CORRECTIONS, *TRL_ALIASES], metavar="NAME",
                   help=f"mismatch correction (docs/corrections.md): {', '.join(CORRECTIONS)}; TRL's "
                   f"{' / '.join(TRL_ALIASES)} also set --correction-level")
    p.add_argument("--correction-level", default=None, choices=CORRECTION_LEVELS,
                   help="weight per sequence, per token, or geometric (exp of the mean token log-ratio)")
    p.add_argument("--is-cap", type=float, default=None, help="C: TIS cap / MIS upper threshold (TRL's clip max)")
    p.add_argument("--is-cap-min", type=float, default=None, help="MIS lower threshold (TRL's clip min; 0 = none)")
    p.add_argument("--band", type=float, nargs=2, metavar=("LOW", "HIGH"), default=None,
                   help="--correction band (IcePop): keep weights in [LOW, HIGH], zero outside (default 0.5 5)")
    p.add_argument("--ais-target", default=None, choices=AIS_TARGETS, help="the full-IS mode AIS mixes towards")
    p.add_argument("--ais-tau", type=float, default=None, metavar="TAU",
                   help=f"τ of AIS's severity s = 1 − exp(−D/τ) (default {CorrectionConfig.ais_tau}; docs/ais.md "
                   "§5a)")
    p.add_argument("--ais-ema", type=float, default=None, metavar="BETA",
                   help="EMA factor β in [0, 1) for λ across steps (default 0: per-batch λ)")
    p.add_argument("--ais-combiner", default=None, choices=AIS_COMBINERS,
                   help="how s, R, g become λ: product = s·R·g (default), severity = s·g (not shrunk by the ESS R)")
    p.add_argument("--reject", default=None, metavar="STAT:AGG:THRESHOLD",
                   help="reject samples by divergence, e.g. k3:seq_mean:0.01 (k1|k2|k3 : token|seq_sum|seq_mean|"
                   "seq_max); several rules comma-separated (all must pass); k1 also takes ratio bounds LOWER_UPPER, "
                   "e.g. k1:seq_mean:0.5_2; or none (default: none)")
    p.add_argument("--normalize-weights", action="store_true", help="normalise the weights to batch mean 1")
    p.add_argument("--bypass", action="store_true",
                   help="use the rollout policy as pi_old (skip the BF16 old-policy pass)")
    p.add_argument("--train-forward", default=None, choices=TRAIN_FORWARDS,
                   help="aligned: fake-quantise the training forward like the FP8 rollout copy (QaRL)")
    p.add_argument("--loss-type", default=None, choices=LOSS_TYPES, help="GRPO loss aggregation, or tbpo (QaRL)")
    p.add_argument("--dual-clip", type=float, default=None, help="tbpo: dual-clip bound c > 1 for negative Â")
    p.add_argument("--mask-error-completions", type=float, default=None, metavar="FRAC",
                   help="drop completions whose repeated-n-gram fraction exceeds FRAC from the loss")
    p.add_argument("--error-ngram", type=int, default=None, help="n of the repeated-n-gram detector (default 4)")
    p.add_argument("--rejected", default=None, choices=["zero", "drop"],
                   help="rejected samples (omega = 0): zero = stay in the loss normaliser (TRL's *_mask, default); "
                   "drop = leave the loss mask, token means over kept tokens (verl's rollout_rs)")
    p.add_argument("--no-is-cap", action="store_true",
                   help="no upper IS bound (TRL's vllm_importance_sampling_clip_max=None)")
    p.add_argument("--clip-ratio-c", type=float, default=None,
                   help="verl's per-token dual clip for negative advantages in the standard loss (c > 1, verl: 3)")
    p.add_argument("--epsilon-high", type=float, default=None,
                   help="upper clip 1 + EPS of the ratio; with --loss-type cispo the absolute cap of the ratio")
    p.add_argument("--off-policy-mask", type=float, default=None, metavar="DELTA",
                   help="TRL's off_policy_mask_threshold: drop negative-advantage sequences whose mean "
                   "log mu - log pi_theta exceeds DELTA")


def add_fast_rollout_args(p: argparse.ArgumentParser) -> None:
    """`train`: Fast-dLLM rollouts (KV cache, threshold decoding) and the mismatch estimator that can see them."""
    from dllm_ais.commands.common_args import add_dream_args, add_fast_sampler_args
    from dllm_ais.config import MISMATCH_ESTIMATORS, POLICY_LOGPROBS

    add_fast_sampler_args(p, needs=" (needs --mismatch-estimator trajectory)")
    add_dream_args(p)
    p.add_argument("--mismatch-estimator", default=None, choices=MISMATCH_ESTIMATORS,
                   help="diffusion log-ratio: elbo (coupled MC-ELBO, default) or trajectory (replay of the "
                   "recorded denoising canvases under pi_old; sees --cache/--threshold)")
    p.add_argument("--trajectory-steps", type=int, default=None, metavar="K",
                   help="trajectory: replay K random denoising steps per sequence (Horvitz-Thompson scaled; "
                   "default all)")
    p.add_argument("--policy-logprob", default=None, choices=POLICY_LOGPROBS, help="log pi of the GRPO ratio and KL: "
                   "one_step (d1), trajectory (the sampled denoising path replayed under theta, cache included), "
                   "elbo (sequence ELBO: VRPO / ESPO / GDPO), coupled (DiffuCoder), spg (SPG's ELBO/EUBO bounds "
                   "with its own loss: no ratio, no clip, beta 0), mdpo (MDPO: the rollout's canvases x_t, every "
                   "masked token, lambda_t- and confidence-weighted) or dtreerpo (d-TreeRPO: each segment's tokens "
                   "at the segment's first canvas); SDAR only: ebpo (EBPO's composite ELBO, every block masked in "
                   "every draw, sequence ratio exp(ELBO - ELBO_old); sets --loss-type grpo unless given)")
    p.add_argument("--trajectory-selection", default=None, choices=["on", "off"], help="add the selection term")
    p.add_argument("--trajectory-merge", type=int, default=None, metavar="N",
                   help="trajectory policy likelihood: score N consecutive recorded steps in one forward from the "
                   "group's first canvas (TraceRL's shrink / d2's StepMerge; biased, cheaper; 1 = exact)")


def add_likelihood_args(p: argparse.ArgumentParser) -> None:
    """`train`: settings of the mask-draw policy likelihoods (--policy-logprob elbo | coupled | spg | mdpo | dtreerpo;
    docs/likelihoods.md)."""
    from dllm_ais.config import ELBO_SCHEMES, RATIO_LEVELS

    p.add_argument("--elbo-draws", type=int, default=None, metavar="K",
                   help="elbo / spg / ebpo: mask draws per sequence (forward rows per sequence)")
    p.add_argument("--elbo-scheme", default=None, choices=ELBO_SCHEMES,
                   help="elbo: stratified (VRPO/BGPO), antithetic (ESPO: a mask and its complement; even K) or "
                   "quadrature (GDPO: t = 0.211 / 0.789; even K)")
    p.add_argument("--elbo-ratio-level", default=None, choices=RATIO_LEVELS,
                   help="elbo: sequence ratio exp((ELBO - ELBO_old) / L) (ESPO/GDPO) or per-token terms")
    p.add_argument("--spg-beta", type=float, default=None, metavar="B",
                   help="spg: the EUBO's exponent (SPG: 1.5); spg trains on its own loss (no ratio, no clip) and sets "
                   "--beta to 0 (no KL term; another --beta is refused)")
    p.add_argument("--spg-mix", type=float, default=None, metavar="W",
                   help="spg: non-positive advantages use W*EUBO + (1 - W)*ELBO (SPG's mixture: 0.5; default EUBO)")
    p.add_argument("--mdpo-steps", type=int, default=None, metavar="K",
                   help="mdpo: canvases x_t of the rollout scored per sequence (MDPO's sample_train_steps: 16; forward "
                   "rows per sequence at most)")
    p.add_argument("--mdpo-confidence", default=None, choices=["on", "off"],
                   help="mdpo: weight each token by the probability the sampler committed it with (default on)")
    p.add_argument("--dtreerpo-segments", type=int, default=None, metavar="S",
                   help="dtreerpo: segments of the rollout's steps, cut at int(k*T/S) (d-TreeRPO's branch points; "
                   "default 2); one forward row per segment")
    p.add_argument("--max-commit-per-step", type=int, default=None, metavar="N", help="threshold decoding: commit "
                   "at most N tokens per step (needs --threshold)")
