"""SDAR's policy likelihoods measured by rung 2 (issue 42 item 5), in mc_estimators.py's interface: each entry turns a
sampled batch into Σ_{i ∈ unit} c_i ∇_W s_i (LM head) and the forward rows each sequence cost.

The scoring is the package's own: `block_elbo_token_logp` (models/sdar/likelihood.py) and `path_terms`
(models/sdar/trajectory.py) run on a `LeafTap` — the HeadTap's recorded logits returned as grad-requiring leaves —
so ∂s/∂z comes from autograd through exactly the package's functions and ∇_W = Σ ∂s/∂z ⊗ h (mc_head.py).
- `elbo-block` K (`--policy-logprob elbo`): the block-wise ELBO, one two-stream forward per draw: K rows.
- `one_step-block`: d1's one-step carried to blocks (prompt masked w.p. 0.15, every counted completion slot masked,
  clean blocks before each block as context; one two-stream forward, exact_sdar.py's rung-1 row of the same name):
  not a likelihood SDAR trains with (the package refuses one_step for SDAR). 1 row.
- `trajectory` (every step, from the PathRecord: θ = θ_old = the sampler), `trajectory-selection` (plus each step's
  selection term), `trajectory-merge{2,4}` (TraceRL's shrink, `--trajectory-merge N`: a replay through
  `path_terms(shrink=N)`). Rows = the replay's two-stream forwards (SDARLaw.replay_rows): one per local step used,
  whatever the number of blocks. Horvitz–Thompson step subsets (`--trajectory-steps`) are refused for SDAR by its
  backend and not measured.
The full-attention mask draws (ELBO schemes over the whole canvas, coupled, SPG) are not SDAR's and have no entry.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dllm_ais.analysis.mc_estimators import Batch, Variant, per_unit
from dllm_ais.analysis.mc_head import leaf, outer_sum
from dllm_ais.analysis.mc_plans import counted_step_table


class LeafTap:
    """A model view over a HeadTap whose forwards return the recorded logits as leaves (kept with their head
    inputs in `zs`, `hs`)."""

    def __init__(self, tap):
        self.__dict__.update(tap=tap, zs=[], hs=[])

    def __call__(self, input_ids, attention_mask=None, positions=None, **kwargs):
        self.tap.take()
        self.tap(input_ids=input_ids, attention_mask=attention_mask, positions=positions, **kwargs)
        (call,) = self.tap.take()
        z = leaf(call.z)
        self.zs.append(z)
        self.hs.append(call.h)
        return SimpleNamespace(logits=z)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["tap"], name)


def score(bt: Batch, value) -> torch.Tensor:
    """Σ_units of ∂(Σ_i c_i value_i)/∂W: value(model) -> [B] per-sequence values computed with `model` (a LeafTap)."""
    lt = LeafTap(bt.tap)
    with torch.enable_grad():
        v = value(lt)
        grads = torch.autograd.grad((bt.coef * v.double()).sum(), lt.zs, allow_unused=True)
    out = torch.zeros(bt.n_units, bt.record.token.shape[-1], dtype=torch.float64)
    for h, g in zip(lt.hs, grads, strict=True):
        if g is not None:
            out += outer_sum(g, h, bt.unit, bt.n_units)
    return out


class BlockElbo:
    """`--policy-logprob elbo` for SDAR: models/sdar/likelihood.py `block_elbo_token_logp` with K draws."""

    def variants(self, L: int, budgets) -> list[Variant]:
        return [Variant("elbo", "elbo-block", K) for K in budgets]

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        from dllm_ais.models.sdar.likelihood import block_elbo_token_logp

        r, cfg = bt.rollout, bt.law.config

        def value(model):
            return block_elbo_token_logp(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                         block_length=cfg.block_length, gen_length=cfg.gen_length,
                                         num_draws=v.setting, generator=g, mask_token_id=bt.mask_id).sum(-1)

        return score(bt, value), v.setting * bt.counted.any(-1).double()


class OneStepBlock:
    """d1's one-step for blocks (module doc)."""

    def variants(self, L: int, budgets) -> list[Variant]:
        return [Variant("one_step", "one_step-block", 1)]

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        from dllm_ais.likelihood.one_step import P_MASK_PROMPT, draw_prompt_mask
        from dllm_ais.models.sdar.likelihood import completion_canvas, masked_token_logp

        r, cfg = bt.rollout, bt.law.config
        pm = draw_prompt_mask(r.prompt_mask, P_MASK_PROMPT, g) & r.prompt_mask.bool()
        prompts = torch.where(pm, bt.mask_id, r.prompt_ids)  # the prompt masked in the clean stream
        cv, clean, counted = completion_canvas(prompts, r.prompt_mask, r.completion_ids, r.completion_mask,
                                               cfg.block_length, cfg.gen_length, bt.mask_id)

        def value(model):
            return masked_token_logp(model, clean, cv.keep, counted, cfg.block_length, bt.mask_id).sum(-1)

        return score(bt, value), bt.counted.any(-1).double()


class PathLaw:
    """The trajectory likelihoods of SDAR (module doc)."""

    def variants(self, L: int, budgets) -> list[Variant]:
        out = [Variant("trajectory", "trajectory", 0)]
        out += [Variant("trajectory", f"trajectory-merge{n}", n) for n in (2, 4)]
        out.append(Variant("trajectory", "trajectory-selection", 0))
        return out

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        r, rec, law = bt.rollout, bt.record, bt.law
        c = bt.counted & (r.commit_step >= 0)
        if v.label.startswith("trajectory-merge"):
            return self._merged(bt, v.setting), law.replay_rows(r, v.setting)
        per_seq = torch.einsum("bl,bld->bd", c.double(), rec.token.double())  # [B, D]
        if v.label == "trajectory-selection":  # each step with a counted commit brings its selection term
            has = counted_step_table(r.commit_step, c)  # [B, S']
            S = rec.select.shape[1]
            chosen = torch.zeros(c.shape[0], S, dtype=torch.float64)
            chosen[:, :has.shape[1]] = has.double()
            per_seq = per_seq + torch.einsum("bs,bsd->bd", chosen, rec.select.double())
        return per_unit(bt, per_seq), law.replay_rows(r)

    def _merged(self, bt: Batch, n: int) -> torch.Tensor:
        from dllm_ais.models.sdar.trajectory import path_terms

        def value(model):
            return path_terms(model, bt.rollout, bt.law.config, bt.mask_id, selection=False, shrink=n)[0].sum(-1)

        return score(bt, value)


SDAR_ESTIMATORS: dict[str, object] = {"one_step": OneStepBlock(), "elbo": BlockElbo(), "trajectory": PathLaw()}
"""`--policy-logprob` name -> SDAR's rung-2 entry (mc_ground_truth.run_cell picks it by the law's family)."""
