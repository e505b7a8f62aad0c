"""The mask-draw policy likelihoods behind one interface, chosen once by name from a registry.

Every one: `draw_rollout(rollout, seed)` the batch's `PolicyDraw` once (from a seed: shared by π_θ, π_old and the
reference; a micro-batch of θ takes `draw.rows(idx)`), `token_logp(model, ..., draw)` -> [B, L] per-token terms (with
gradients, memory flat in K: `mask_draws.draw_logprobs`), `level` (the GRPO ratio level it implies) and
`rows_per_sequence` (forward rows per sequence and likelihood evaluation; an upper bound where a draw can skip empty
canvases). `spg` adds `sequence_logp(..., adv)` for its own loss. The random-mask ones also take
`draw(prompt_ids, prompt_mask, completion_mask, seed)` (no rollout needed); `mdpo` and `dtreerpo` score the
rollout's own recorded canvases, so they need its commit steps.

- `elbo`: Σ_j of its terms is the sequence ELBO; with the sequence level GRPO's ratio is exp((ELBO − ELBO_old)/L_i).
- `coupled`: DiffuCoder's per-token log-prob ½[log p_full + log p_partial / t_eff], a token-level ratio.
- `spg`: token terms of SPG's ELBO (used for π_old / diagnostics); the loss takes `sequence_logp`.
- `mdpo`: Σ over K of the rollout's canvases x_t of λ_t · c_j · log p(y_j | x_t) / K on every counted position x_t
  masks (likelihood/mdpo.py), a token-level ratio; ≤ `mdpo_steps` rows per sequence.
- `dtreerpo`: log p(y_j | x_{b_k}) of each counted token at the first canvas of its segment of the rollout's steps
  (likelihood/dtreerpo.py), a token-level ratio; ≤ `dtreerpo_segments` rows per sequence.
The settings are one frozen `dllm_ais.config.PolicyLikelihoodConfig`; nothing here branches on a name.
"""

from __future__ import annotations

import torch

from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.dtreerpo import draw_dtreerpo
from dllm_ais.likelihood.inputs import as_generator
from dllm_ais.likelihood.mask_draws import (
    PolicyDraw,
    draw_antithetic,
    draw_coupled,
    draw_logprobs,
    draw_quadrature,
    draw_stratified,
    token_terms,
)
from dllm_ais.likelihood.mdpo import draw_mdpo
from dllm_ais.likelihood.spg import draw_spg, spg_sequence_logp
from dllm_ais.types import Rollout


def group_size_of(prompt_ids: torch.Tensor) -> int:
    """Rows per group: the common length of the runs of identical consecutive prompts (1 if the runs differ)."""
    B = prompt_ids.shape[0]
    new = torch.ones(B, dtype=torch.bool, device=prompt_ids.device)
    new[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(-1)
    starts = new.nonzero().squeeze(-1).tolist() + [B]
    runs = {b - a for a, b in zip(starts[:-1], starts[1:], strict=True)}
    return runs.pop() if len(runs) == 1 else 1


class MaskDrawLikelihood:
    """Shared scoring: the draw's canvases through the model, weighted per token (`mask_draws.token_terms`)."""

    level = "token"
    """The GRPO ratio level the likelihood implies."""
    own_loss = False
    """True when the likelihood trains on a loss of its own instead of GRPO's ratio (SPG)."""
    forwards_depend_on_rollout = False
    """True when how many forward calls one evaluation makes depends on the rollout (so it differs between ranks, and
    FSDP, which gathers each layer in lockstep, refuses it: train/fsdp_setup.py)."""

    def __init__(self, config: PolicyLikelihoodConfig, block_length: int | None = None,
                 sampler_steps: int | None = None):
        self.config = config
        self.block_length = block_length
        self.sampler_steps = sampler_steps  # the sampler's fixed-schedule steps (None: unknown): caps mdpo's rows

    @property
    def rows_per_sequence(self) -> int:
        return self.config.elbo_draws

    def draw(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_mask: torch.Tensor,
             generator: torch.Generator | int) -> PolicyDraw:
        raise NotImplementedError

    def draw_rollout(self, rollout: Rollout, generator: torch.Generator | int) -> PolicyDraw:
        """The batch's draw for a rollout (what the trainer calls): random masks need only its shapes."""
        return self.draw(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_mask, generator)

    def draw_logp(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw: PolicyDraw, *,
                  mask_token_id: int) -> torch.Tensor:
        """[B, K, L] log p of each draw's masked tokens."""
        return draw_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw,
                             mask_token_id=mask_token_id, mask_tail=self.config.mask_tail,
                             batch_size=self.config.batch_size)

    def token_logp(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw: PolicyDraw, *,
                   mask_token_id: int) -> torch.Tensor:
        """[B, L] per-token terms of the estimate (their sum over j is the sequence estimate)."""
        lp = self.draw_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw,
                            mask_token_id=mask_token_id)
        return token_terms(draw, lp)


class ELBOLikelihood(MaskDrawLikelihood):
    """Sequence ELBO with K draws: stratified (VRPO/BGPO), antithetic (ESPO) or quadrature (GDPO)."""

    @property
    def level(self) -> str:
        return self.config.elbo_ratio_level

    def draw(self, prompt_ids, prompt_mask, completion_mask, generator) -> PolicyDraw:
        c, g = self.config, as_generator(generator)
        if c.elbo_scheme == "antithetic":
            return draw_antithetic(completion_mask, c.elbo_draws, g, group_size_of(prompt_ids))
        fn = {"stratified": draw_stratified, "quadrature": draw_quadrature}[c.elbo_scheme]
        return fn(completion_mask, c.elbo_draws, g)


class CoupledLikelihood(MaskDrawLikelihood):
    """DiffuCoder's coupled-GRPO per-token estimator (3 forwards per sequence)."""

    rows_per_sequence = 3

    def draw(self, prompt_ids, prompt_mask, completion_mask, generator) -> PolicyDraw:
        return draw_coupled(completion_mask, generator, self.config.coupled_t_min, self.config.coupled_t_max)


class SPGLikelihood(MaskDrawLikelihood):
    """SPG: block-random draws; ELBO for Â > 0, EUBO (or the mixture) otherwise, via `sequence_logp`."""

    level = "sequence"
    own_loss = True

    def draw(self, prompt_ids, prompt_mask, completion_mask, generator) -> PolicyDraw:
        c = self.config
        block = c.spg_block_length or self.block_length or completion_mask.shape[1]
        return draw_spg(completion_mask, c.elbo_draws, generator, block, prompt_mask, c.spg_p_mask_prompt,
                        c.spg_block_rule)

    def sequence_logp(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw: PolicyDraw,
                      adv: torch.Tensor, *, mask_token_id: int) -> torch.Tensor:
        """[B] the bound each sequence trains on (`spg.spg_sequence_logp`)."""
        lp = self.draw_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw,
                            mask_token_id=mask_token_id)
        return spg_sequence_logp(draw, lp, adv, self.config.spg_beta, self.config.spg_mix)


class RecordedCanvasLikelihood(MaskDrawLikelihood):
    """Scores the rollout's own recorded canvases (`Rollout.commit_step`): its draw needs the rollout."""

    forwards_depend_on_rollout = True  # canvases with no counted token to score are skipped

    def draw(self, prompt_ids, prompt_mask, completion_mask, generator) -> PolicyDraw:
        raise ValueError(f"{type(self).__name__} scores the rollout's recorded canvases: call "
                         "draw_rollout(rollout, seed) (it needs Rollout.commit_step).")


class MDPOLikelihood(RecordedCanvasLikelihood):
    """MDPO: K of the rollout's canvases x_t, every counted masked position, weight λ_t · confidence / K."""

    @property
    def rows_per_sequence(self) -> int:
        """At most `mdpo_steps` canvases, and at most one per sampler step."""
        return min(self.config.mdpo_steps, self.sampler_steps or self.config.mdpo_steps)

    def draw_rollout(self, rollout: Rollout, generator) -> PolicyDraw:
        conf = None
        if self.config.mdpo_confidence:
            if rollout.logp_rollout is None:
                raise ValueError("mdpo_confidence weights by the sampler's probability of each token "
                                 "(Rollout.logp_rollout), which this rollout did not record; sample with the package's "
                                 "sampler or set PolicyLikelihoodConfig.mdpo_confidence False.")
            conf = rollout.logp_rollout.double().exp()
        return draw_mdpo(rollout.commit_step, rollout.completion_mask, self.config.mdpo_steps, generator, conf)


class DTreeRPOLikelihood(RecordedCanvasLikelihood):
    """d-TreeRPO: each counted token scored once, at the first canvas of its segment of the rollout's steps."""

    @property
    def rows_per_sequence(self) -> int:
        """At most one row per segment (segments of a T-step schedule: at most T)."""
        return min(self.config.dtreerpo_segments, self.sampler_steps or self.config.dtreerpo_segments)

    def draw_rollout(self, rollout: Rollout, generator) -> PolicyDraw:
        return draw_dtreerpo(rollout.commit_step, rollout.completion_mask, rollout.num_steps,
                             self.config.dtreerpo_segments)


POLICY_LIKELIHOODS: dict[str, type[MaskDrawLikelihood]] = {
    "elbo": ELBOLikelihood, "coupled": CoupledLikelihood, "spg": SPGLikelihood, "mdpo": MDPOLikelihood,
    "dtreerpo": DTreeRPOLikelihood}
"""The mask-draw policy likelihoods by `--policy-logprob` name (one_step and trajectory live in one_step.py and
trajectory.py: a prompt-mask seed and a replay plan instead of a PolicyDraw)."""


def policy_likelihood(name: str, config: PolicyLikelihoodConfig | None = None,
                      block_length: int | None = None, sampler_steps: int | None = None) -> MaskDrawLikelihood:
    """The likelihood called `name` with its settings (block_length: the sampler's, SPG's default block;
    sampler_steps: the sampler's fixed-schedule steps, which cap the rows of `mdpo` and `dtreerpo`)."""
    if name not in POLICY_LIKELIHOODS:
        raise ValueError(f"policy likelihood {name!r}: use one of {', '.join(POLICY_LIKELIHOODS)}.")
    return POLICY_LIKELIHOODS[name](config or PolicyLikelihoodConfig(), block_length, sampler_steps)
