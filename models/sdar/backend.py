"""SDAR as a trainer backend: DiffusionBackend's interface with SDAR's sampler (models/sdar/sampler.py) and SDAR's
likelihoods (models/sdar/likelihood.py, models/sdar/trajectory.py).

- rollouts: `sdar_sample` (native per-block KV cache) with the BF16 master or its FP8 rollout copy (fp8/quantize.py's
  per-Linear copy; refilled in place after every optimizer step by fp8/sync.py as LLaDA's is).
- policy likelihood (`--policy-logprob`): `elbo` — the block-wise ELBO, one two-stream [x_t | x_0] forward per mask
  draw (K = --elbo-draws; masks random within each response block, the clean blocks before it as context), per-token
  terms whose sum is the sequence ELBO; `ebpo` — EBPO's composite ELBO (models/sdar/ebpo.py, DARE's
  `_forward_process_ebpo`: the same per-cell law, every counted block masked in every draw, the K · N_b (draw, block)
  cells of a sequence stratified from one offset; K = --elbo-draws), trained on the sequence ratio
  exp(ELBO_θ − ELBO_old) (Preset sets importance_sampling_level sequence_sum); `trajectory` — the exact path law of
  the rollout (models/sdar/trajectory.py:
  every step's filtered-proposal term, plus its selection term with --trajectory-selection), per token; with
  --trajectory-merge k, TraceRL's shrink k (k consecutive steps of a block scored at the state before the first).
- mismatch ratio ℓ = log π_old − log μ (`--mismatch-estimator`): `elbo` — the coupled block-wise ELBO difference of
  the master and the rollout copy on the same K = TrainConfig.mismatch_num_draws draws (sequence: summed; token /
  geometric: per token), drawn by EBPO's law when the policy likelihood is `ebpo` (so ℓ is a difference of the
  estimator the ratio uses); `trajectory` — the exact path law of the path that ran, replayed under both (per token;
  summed for sequence).
- SFT warm-up: SDAR's own objective (likelihood.py `sft_loss`) through the two-stream forward.

Sampling settings from SamplerConfig: gen_length, block_length, steps (the total: denoising_steps = steps /
(gen_length / block_length) per block), temperature (0 = the official greedy T = 1, top_k = 1), sdar_strategy
(default low_confidence_dynamic), sdar_threshold (default 0.9), cuda_graphs; top_k 0 and top_p 1 (off: the official
generate's and TraDo's rollout defaults; a checkpoint's generation_config.json is for autoregressive decoding and is
not read). What SDAR's sampler does not have (--cache, Fast-dLLM's --threshold, --remasking random, --cfg-scale) is
refused by models/sdar/family.py `refusal`; what SDAR cannot train yet by `training_refusal` (before any write).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.sdar.family import refusal
from dllm_ais.train.backend import DiffusionBackend, build_diffusion_backend
from dllm_ais.types import Rollout

DEFAULT_STRATEGY = "low_confidence_dynamic"
"""SamplerConfig.sdar_strategy None: generate.py's default strategy, TraDo's rollout one (configs/rl_trado.yaml)."""
DEFAULT_THRESHOLD = 0.9
"""SamplerConfig.sdar_threshold None: TraDo's dynamic_threshold (configs/rl_trado.yaml; generate.py's CLI: 0.85)."""
POLICY_LOGPROBS = ("elbo", "ebpo", "trajectory")
"""The policy likelihoods SDAR trains with (module docstring)."""


def training_refusal(train) -> str | None:
    """What SDAR cannot train with TrainConfig `train` yet, in one line, or None."""
    if train.policy_logprob not in POLICY_LOGPROBS:
        return (f"SDAR: --policy-logprob {train.policy_logprob} is not built for block diffusion; use elbo (the "
                "block-wise ELBO, one two-stream forward per draw), ebpo (EBPO's composite ELBO) or trajectory (the "
                "exact path law).")
    scheme = train.likelihood.elbo_scheme
    for bad, why in ((train.trajectory_steps is not None, "--trajectory-steps: SDAR's path law replays every step "
                      "(one two-stream forward per local step); drop it"),
                     (train.policy_logprob == "elbo" and scheme != "stratified", f"--elbo-scheme {scheme} is the "
                      "full-canvas ELBO's; SDAR's block-wise ELBO draws mask counts stratified per block: drop it")):
        if bad:
            return f"SDAR: {why}."
    return None


def sdar_sampler_config(sampler: SamplerConfig, train=None):
    """The SDARSamplerConfig of a SamplerConfig (module docstring); what SDAR's sampler lacks, and with `train` (a
    TrainConfig) what SDAR cannot train, is refused in one line."""
    from dllm_ais.models.sdar.sampler import SDARSamplerConfig

    why = refusal(sampler, "one_step", "elbo", None) or (training_refusal(train) if train is not None else None)
    if why:
        raise ValueError(why)
    return SDARSamplerConfig(gen_length=sampler.gen_length, block_length=sampler.block_length,
                             denoising_steps=sampler.steps // sampler.num_blocks,
                             strategy=sampler.sdar_strategy or DEFAULT_STRATEGY,
                             threshold=DEFAULT_THRESHOLD if sampler.sdar_threshold is None else sampler.sdar_threshold,
                             temperature=sampler.temperature, cuda_graphs=sampler.cuda_graphs)


@dataclass(frozen=True)
class SDARBackend(DiffusionBackend):
    """DiffusionBackend for SDAR: models/sdar/sampler.py rollouts, the block-wise ELBO, EBPO's composite ELBO or the
    exact path law."""

    sdar: object = None
    """The SDARSamplerConfig rollouts use (`sdar_sampler_config`)."""

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.models.sdar.sampler import sdar_sample

        return sdar_sample(model, prompt_ids, prompt_mask, self.sdar, self.mask_token_id, self.stop_token_ids,
                           generator=generator)

    def prepare(self, rollout: Rollout, generator: torch.Generator) -> None:
        """Nothing to share: the path law replays every step; the ELBO's draws come from the logp seed."""

    def token_scale(self, rollout: Rollout) -> None:
        """Every counted token is scored (no Horvitz–Thompson subsampling)."""
        return None

    @property
    def policy_replay_is_ratio(self) -> bool:
        """The policy's per-token terms are the trajectory ratio's (the path law at shrink 1, the same selection
        setting): ℓ is π_old's replay minus μ's, both replayed for the policy already (train/step_mismatch.py), so
        `mismatch_log_w` does not replay the path on both copies again."""
        return (self.policy_logprob == "trajectory" and self.trajectory_merge == 1
                and self.mismatch_estimator == "trajectory")

    @property
    def seed_free_policy(self) -> bool:
        """The policy likelihood draws nothing (the path law): one π_old replay serves every inner iteration."""
        return self.policy_logprob == "trajectory"

    def _elbo(self, model, rollout: Rollout, generator: torch.Generator, rows=None, num_draws=None) -> torch.Tensor:
        """Per-token ELBO terms [B, L] on the draws of `generator` (policy ratio and the coupled mismatch ℓ): the
        block-wise ELBO's mask law, or EBPO's when the policy likelihood is ebpo."""
        from dllm_ais.models.sdar.ebpo import draw_ebpo_masks
        from dllm_ais.models.sdar.likelihood import block_elbo_token_logp, draw_block_masks

        draw = {"ebpo": draw_ebpo_masks}.get(self.policy_logprob, draw_block_masks)
        return block_elbo_token_logp(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                     rollout.completion_mask, block_length=self.sdar.block_length,
                                     gen_length=self.sdar.gen_length,
                                     num_draws=num_draws or self.likelihood.elbo_draws,
                                     generator=generator, mask_token_id=self.mask_token_id, rows=rows,
                                     draw=draw)

    def _path(self, model, rollout: Rollout, rows=None, shrink: int = 1) -> torch.Tensor:
        from dllm_ais.likelihood.trajectory import rollout_rows
        from dllm_ais.models.sdar.trajectory import path_terms

        if rows is not None:
            rollout = rollout_rows(rollout, rows)
        return path_terms(model, rollout, self.sdar, self.mask_token_id, selection=self.trajectory_selection,
                          shrink=shrink)[0]

    def token_logp(self, model, rollout: Rollout, seed: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[B, L] per-token log π terms: the block-wise ELBO's or EBPO's composite ELBO's on the seed's draws, or the
        path law's."""
        if self.policy_logprob == "trajectory":  # --trajectory-merge k: TraceRL's shrink k
            return self._path(model, rollout, rows, shrink=self.trajectory_merge).float()
        return self._elbo(model, rollout, self._draws(rollout, seed), rows)

    @staticmethod
    def _draws(rollout: Rollout, seed: int) -> torch.Generator:
        return torch.Generator(rollout.completion_ids.device).manual_seed(int(seed))

    def rollout_token_logp(self, model_rollout, rollout: Rollout, seed: int,
                           rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.token_logp(model_rollout, rollout, seed, rows)

    def mismatch_log_w(self, model_old, model_rollout, rollout: Rollout, generator, level: str) -> torch.Tensor:
        """ℓ: [B] (sequence) or [B, L] per token; 0 when the master rolled out (μ = π_old)."""
        mask = rollout.completion_mask.bool()
        if model_old is model_rollout:
            zeros = torch.zeros(mask.shape, device=mask.device)
            return zeros if level != "sequence" else zeros.sum(-1)
        if self.mismatch_estimator == "trajectory":
            per_token = (self._path(model_old, rollout) - self._path(model_rollout, rollout)).float()
        else:  # the coupled block-wise ELBO: the same K = mismatch_num_draws draws for both models
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
            per_token = (self._elbo(model_old, rollout, self._draws(rollout, seed), num_draws=self.mismatch_num_draws)
                         - self._elbo(model_rollout, rollout, self._draws(rollout, seed),
                                      num_draws=self.mismatch_num_draws))
        per_token = torch.where(mask, per_token, 0.0)
        return per_token if level != "sequence" else per_token.sum(-1)

    def sft_loss(self, model, prompt_ids, prompt_mask, completion_ids, generator) -> torch.Tensor:
        from dllm_ais.models.sdar.likelihood import sft_loss

        return sft_loss(model, prompt_ids, prompt_mask, completion_ids, self.mask_token_id, self.sdar.block_length,
                        generator)


def build_backend(sampler: SamplerConfig, model, tokenizer, train=None) -> SDARBackend:
    """The family's backend hook: SDAR's sampler, and with `train` (a TrainConfig) SDAR's likelihoods."""
    return build_diffusion_backend(SDARBackend, sampler, model, train, sdar=sdar_sampler_config(sampler, train))


def resolve_sampler(preset):
    """The family's resolve_sampler hook, called by `dllm-ais train` before the run directory exists: the sampler
    settings and the likelihoods are checked (one line); nothing is resolved from the checkpoint."""
    sdar = sdar_sampler_config(preset.sampler, preset.train)
    line = (f"SDAR sampling: {sdar.strategy} (threshold {sdar.threshold}), {sdar.denoising_steps} denoising steps "
            f"per block of {sdar.block_length}, temperature {sdar.temperature}.")
    return preset, line, {"runs": {"strategy": sdar.strategy, "threshold": sdar.threshold,
                                   "denoising_steps": sdar.denoising_steps}}
