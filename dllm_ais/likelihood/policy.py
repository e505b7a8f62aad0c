"""The mask-draw policy likelihoods behind one interface, chosen once by name from a registry.

Every one: `draw(...)` the batch's `PolicyDraw` once (from a seed: shared by π_θ, π_old and the reference; a
micro-batch of θ takes `draw.rows(idx)`), `token_logp(model, ..., draw)` -> [B, L] per-token terms (with gradients,
memory flat in K: `mask_draws.draw_logprobs`), `level` (the GRPO ratio level it implies) and `rows_per_sequence`
(forward rows per sequence and likelihood evaluation). `spg` adds `sequence_logp(..., adv)` for its own loss.

- `elbo`: Σ_j of its terms is the sequence ELBO; with the sequence level GRPO's ratio is exp((ELBO − ELBO_old)/L_i).
- `coupled`: DiffuCoder's per-token log-prob ½[log p_full + log p_partial / t_eff], a token-level ratio.
- `spg`: token terms of SPG's ELBO (used for π_old / diagnostics); the loss takes `sequence_logp`.
The settings are one frozen `dllm_ais.config.PolicyLikelihoodConfig`; nothing here branches on a name.
"""

from __future__ import annotations

import torch

from dllm_ais.config import PolicyLikelihoodConfig
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
from dllm_ais.likelihood.spg import draw_spg, spg_sequence_logp


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

    def __init__(self, config: PolicyLikelihoodConfig, block_length: int | None = None):
        self.config = config
        self.block_length = block_length

    @property
    def rows_per_sequence(self) -> int:
        return self.config.elbo_draws

    def draw(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_mask: torch.Tensor,
             generator: torch.Generator | int) -> PolicyDraw:
        raise NotImplementedError

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
        return draw_spg(completion_mask, c.elbo_draws, generator, block, prompt_mask, c.spg_p_mask_prompt)

    def sequence_logp(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw: PolicyDraw,
                      adv: torch.Tensor, *, mask_token_id: int) -> torch.Tensor:
        """[B] the bound each sequence trains on (`spg.spg_sequence_logp`)."""
        lp = self.draw_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draw,
                            mask_token_id=mask_token_id)
        return spg_sequence_logp(draw, lp, adv, self.config.spg_beta, self.config.spg_mix)


POLICY_LIKELIHOODS: dict[str, type[MaskDrawLikelihood]] = {
    "elbo": ELBOLikelihood, "coupled": CoupledLikelihood, "spg": SPGLikelihood}
"""The mask-draw policy likelihoods by `--policy-logprob` name (one_step and trajectory live in one_step.py and
trajectory.py: a prompt-mask seed and a replay plan instead of a PolicyDraw)."""


def policy_likelihood(name: str, config: PolicyLikelihoodConfig | None = None,
                      block_length: int | None = None) -> MaskDrawLikelihood:
    """The likelihood called `name` with its settings (block_length: the sampler's, SPG's default block)."""
    if name not in POLICY_LIKELIHOODS:
        raise ValueError(f"policy likelihood {name!r}: use one of {', '.join(POLICY_LIKELIHOODS)}.")
    return POLICY_LIKELIHOODS[name](config or PolicyLikelihoodConfig(), block_length)
