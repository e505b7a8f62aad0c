"""The policy likelihoods measured by rung 2, one registry entry per `--policy-logprob` name (issue 40).

Every entry turns a sampled batch (`Batch`: the rollout, its `PathRecord`, GRPO's coefficients) into the LM-head
gradient of the GRPO surrogate it implies at θ = θ_old, summed per statistical unit (a GRPO batch of N completions):
ĝ_unit = Σ_{i ∈ unit} c_i ∇s_i with c_i = Â_i / (N L) and s_i the likelihood's sequence value (the sum of its
token terms; SPG: L · its bound, its own loss — rung 1's conventions, analysis/estimators.py). It also returns the
forward rows each sequence cost (measured, not nominal). The draws are the package's own: the registry of
likelihood/policy.py for the mask-draw likelihoods, `draw_prompt_mask` for d1's one-step, `replay_plan` /
`merge_commit_steps` for the trajectory replays; the scoring is the package's (`token_terms`, `spg_sequence_logp`,
the proposal log-probability) on logits recorded through the `HeadTap`.

Adding a likelihood is one entry: an object with `variants(L, budgets)` (the settings to measure, by their nominal
forward rows) and `gradients(batch, variant, generator)` -> ([units, D], [B] rows), built from `score_rows` (any
canvases and per-token weights) or `score_draw` (a `PolicyDraw`). `mdpo` and `dtreerpo` (`RecordedCanvas`) came
after cells were cached: they are not in `BASE_ESTIMATORS` (the default a cell's cache key holds) but in
`SUPPLEMENT_ESTIMATORS`, measured on a cached cell's own paths (mc_ground_truth.supplement_cell).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dllm_ais.analysis.mc_head import HeadTap, leaf, outer_sum
from dllm_ais.analysis.mc_paths import PathRecord
from dllm_ais.analysis.mc_plans import merged_steps, step_plan
from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.inputs import canvas
from dllm_ais.likelihood.mask_draws import PolicyDraw, token_terms
from dllm_ais.models.shift import logits_view
from dllm_ais.types import Rollout

ROW_CHUNK = 4096
"""Canvas rows per model call of a score."""
MAX_OTHER_DRAWS = 8
"""Largest K measured for the antithetic and quadrature ELBOs and SPG (the stratified ELBO, the package default,
goes to the largest budget): K draws cost K forward rows per sequence, the bulk of a cell's time."""


@dataclass
class Batch:
    """One sampled batch of whole units and what every estimator needs about it."""

    law: object
    """The family's sampler law (mc_paths.LLaDALaw / DreamLaw)."""
    tap: HeadTap
    rollout: Rollout
    record: PathRecord
    adv: torch.Tensor
    """[B] GRPO advantages (group z-scores)."""
    coef: torch.Tensor
    """[B] float64 c_i = Â_i / (N L)."""
    unit: torch.Tensor
    """[B] long: the statistical unit (GRPO batch) of each sequence."""
    group: torch.Tensor
    """[B] long: the group (prompt) of each sequence, consecutive and of size G."""
    n_units: int
    G: int
    block_length: int
    """The sampler's block length (SPG's default block, merging's block)."""

    @property
    def mask_id(self) -> int:
        return self.law.mask

    @property
    def counted(self) -> torch.Tensor:
        return self.rollout.completion_mask.bool()


@dataclass(frozen=True)
class Variant:
    """One setting of one estimator."""

    name: str
    """Registry key (the --policy-logprob name)."""
    label: str
    """Row label of the tables (e.g. elbo-stratified)."""
    setting: int
    """K draws, K replayed steps (0: every step), N merged steps, ..."""
    options: dict = field(default_factory=dict)
    """Extra settings (elbo scheme, ...)."""


def per_unit(bt: Batch, per_seq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """[B, D] per-sequence ∇s -> [units, D] Σ c_i ∇s_i (times `scale`)."""
    w = (bt.coef * scale)[:, None] * per_seq.double()
    return torch.zeros(bt.n_units, per_seq.shape[1], dtype=torch.float64).index_add_(0, bt.unit, w)


def score_rows(bt: Batch, rows_b: torch.Tensor, ids: torch.Tensor,
               value: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Forward the canvases `ids` [n, P + L] (row i belongs to sequence rows_b[i]) through the tap, read the logits
    z [n, L, V] of the completion positions (shifted for Dream) and return Σ_units of ∂value/∂W, value(z_list) ->
    [B] per-sequence values built from the leaf logits (a list, one tensor per model call, in row order). The
    GRPO coefficients are applied here: the result is [units, D]."""
    P = bt.rollout.prompt_ids.shape[1]
    attn = torch.ones_like(ids, dtype=torch.bool)
    attn[:, :P] = bt.rollout.prompt_mask.bool()[rows_b]
    view = logits_view(bt.tap)
    zs, hs = [], []
    bt.tap.take()
    for s in range(0, ids.shape[0], ROW_CHUNK):
        view(input_ids=ids[s:s + ROW_CHUNK], attention_mask=attn[s:s + ROW_CHUNK], positions=slice(P, None))
        (call,) = bt.tap.take()
        zs.append(leaf(call.z))
        hs.append(call.h)
    D = bt.record.token.shape[-1]
    if not zs:
        return torch.zeros(bt.n_units, D, dtype=torch.float64)
    with torch.enable_grad():
        v = value(zs)  # [B]
        grads = torch.autograd.grad((bt.coef * v.double()).sum(), zs, allow_unused=True)
    out = torch.zeros(bt.n_units, D, dtype=torch.float64)
    start = 0
    for z, h, g in zip(zs, hs, grads, strict=True):
        n = z.shape[0]
        if g is not None:
            out += outer_sum(g, h, bt.unit[rows_b[start:start + n]], bt.n_units)
        start += n
    return out


def score_draw(bt: Batch, draw: PolicyDraw, seq_value: Callable | None = None, scale: float = 1.0
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A mask draw scored as likelihood/mask_draws.draw_logprobs scores it (post-EOS shown as masks, never scored;
    a draw with `hidden` shows its recorded canvases): one row per (sequence, draw) with a non-empty mask.
    seq_value(draw, lp [B, K, L]) -> [B] (default: the sum of `token_terms`), times `scale`. -> ([units, D], rows
    per sequence [B])."""
    r = bt.rollout
    B, K, L = draw.mask.shape
    P = r.prompt_ids.shape[1]
    recorded = draw.hidden is not None
    x, _ = canvas(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, bt.mask_id,
                  mask_tail=not recorded)
    active = draw.mask.any(-1)  # [B, K]
    rb, rk = active.nonzero(as_tuple=True)
    ids = x[rb].clone()
    shown_masked = draw.hidden[rb, rk] if recorded else draw.mask[rb, rk]
    ids[:, P:] = torch.where(shown_masked, bt.mask_id, ids[:, P:])
    if draw.prompt_masked is not None:
        pm = draw.prompt_masked[rb, rk] & r.prompt_mask.bool()[rb]
        ids[:, :P] = torch.where(pm, bt.mask_id, ids[:, :P])
    y = r.completion_ids[rb]  # [n, L]

    def value(zs: list[torch.Tensor]) -> torch.Tensor:
        lp = torch.cat([z.log_softmax(-1) for z in zs]).gather(-1, y[..., None]).squeeze(-1)  # [n, L]
        full = torch.zeros(B, K, L, dtype=lp.dtype).index_put((rb, rk), lp)
        v = token_terms(draw, full).sum(-1) if seq_value is None else seq_value(draw, full)
        return v * scale

    return score_rows(bt, rb, ids, value), active.sum(-1).double()


class OneStep:
    """d1's one-step estimator: the prompt masked w.p. 0.15, the whole completion masked, one row."""

    def variants(self, L: int, budgets) -> list[Variant]:
        return [Variant("one_step", "one_step", 1)]

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        from dllm_ais.likelihood.one_step import P_MASK_PROMPT, draw_prompt_mask

        c = bt.counted
        pm = draw_prompt_mask(bt.rollout.prompt_mask, P_MASK_PROMPT, g)
        return score_draw(bt, PolicyDraw(c[:, None], c[:, None].double(), pm[:, None]))


def _group_ids(bt: Batch) -> torch.Tensor:
    """Prompt stand-ins [B, 1] naming each sequence's group (policy.group_size_of reads groups off the prompts)."""
    return bt.group[:, None]


class MaskDraw:
    """The mask-draw likelihoods of likelihood/policy.py's registry (elbo schemes, coupled, spg)."""

    def __init__(self, name: str):
        self.name = name

    def variants(self, L: int, budgets) -> list[Variant]:
        if self.name == "coupled":
            return [Variant("coupled", "coupled", 3)]
        if self.name == "spg":
            return [Variant("spg", "spg", K) for K in budgets if K <= MAX_OTHER_DRAWS]
        out = []
        for scheme in ("stratified", "antithetic", "quadrature"):
            out += [Variant("elbo", f"elbo-{scheme}", K, {"elbo_scheme": scheme}) for K in budgets
                    if scheme == "stratified" or (K % 2 == 0 and K <= MAX_OTHER_DRAWS)]
        return out

    def _draw(self, bt: Batch, v: Variant, g: torch.Generator) -> PolicyDraw:
        from dllm_ais.likelihood.policy import policy_likelihood

        cfg = PolicyLikelihoodConfig(elbo_draws=3 if self.name == "coupled" else v.setting, **v.options)
        lik = policy_likelihood(self.name, cfg, bt.block_length)
        if self.name != "coupled":
            return lik.draw(_group_ids(bt), bt.rollout.prompt_mask, bt.counted, g)
        parts = []  # coupled's t is drawn once per GRPO batch: one draw per unit
        for u in range(bt.n_units):
            rows = (bt.unit == u).nonzero().squeeze(-1)
            parts.append(lik.draw(_group_ids(bt)[rows], bt.rollout.prompt_mask[rows], bt.counted[rows], g))
        return PolicyDraw(torch.cat([p.mask for p in parts]), torch.cat([p.weight for p in parts]), None,
                          torch.cat([p.level for p in parts]))

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        draw = self._draw(bt, v, g)
        if self.name != "spg":
            return score_draw(bt, draw)
        from dllm_ais.likelihood.spg import SPG_BETA, spg_sequence_logp

        L = bt.rollout.completion_ids.shape[1]
        return score_draw(bt, draw, lambda d, lp: spg_sequence_logp(d, lp, bt.adv, SPG_BETA, None), scale=float(L))


class Trajectory:
    """The trajectory likelihoods (likelihood/trajectory.py) from the sampler's own canvases: the commit-only replay
    of every counted step (setting 0) or of K steps drawn per sequence (Horvitz–Thompson, `--trajectory-steps K`),
    the merged replay (`--trajectory-merge N`: new canvases, a forward each) and the replay with selection terms
    (`--trajectory-selection on`). The first and last come free from the PathRecord (θ = θ_old = the sampler)."""

    def variants(self, L: int, budgets) -> list[Variant]:
        top = max(budgets)
        out = [Variant("trajectory", "trajectory", 0)]
        out += [Variant("trajectory", "trajectory", K) for K in budgets if K < L]
        out += [Variant("trajectory", f"trajectory-merge{n}", n) for n in (2, 4) if n < L and L // n <= top]
        out.append(Variant("trajectory", "trajectory-selection", 0))
        return out

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        r, rec, c = bt.rollout, bt.record, bt.counted
        if v.label.startswith("trajectory-merge"):
            return self._merged(bt, v.setting)
        scale, chosen, rows = step_plan(r.commit_step, c, v.setting or None, g)
        per_seq = torch.einsum("bl,bld->bd", scale, rec.token.double())  # [B, D]
        if v.label == "trajectory-selection":  # each step with a counted commit brings its selection term
            S = rec.select.shape[1]
            has = torch.zeros(c.shape[0], S, dtype=torch.float64)
            has[:, :chosen.shape[1]] = chosen.double()
            per_seq = per_seq + torch.einsum("bs,bsd->bd", has, rec.select.double())
        return per_unit(bt, per_seq), rows

    def _merged(self, bt: Batch, n: int):
        from dataclasses import replace

        from dllm_ais.likelihood.replay import canvases

        merged = replace(bt.rollout, commit_step=merged_steps(bt.rollout.commit_step, n, bt.block_length))
        _, chosen, rows = step_plan(merged.commit_step, bt.counted, None, None)
        b, s = chosen.nonzero(as_tuple=True)  # every (sequence, merged step) with a counted commit, row-major
        ids, _ = canvases(merged, b, s, bt.mask_id)
        y = merged.completion_ids[b]
        hit = (merged.commit_step[b] == s[:, None]) & bt.counted[b]  # [n, L]
        B = merged.completion_ids.shape[0]

        def value(zs):
            lp = bt.law.token_logprob(torch.cat(zs), y)  # [n, L]
            return torch.zeros(B, dtype=torch.float64).index_add(0, b, torch.where(hit, lp, 0.0).double().sum(-1))

        return score_rows(bt, b, ids, value), rows


class RecordedCanvas:
    """MDPO and d-TreeRPO (likelihood/mdpo.py, dtreerpo.py): the rollout's own recorded canvases, drawn by the
    package (MDPO: policy.MDPOLikelihood.draw_rollout, confidence from the sampler's logp_rollout; d-TreeRPO:
    `draw_dtreerpo` with each sequence's own T, estimator_paths.draw_dtreerpo_own_steps — the path-only setting rung
    1 measures), scored with the canvases shown as recorded. MDPO at K of the candidate canvases (K < L) and at
    every canvas (setting 0, while L fits the largest budget); d-TreeRPO at s segments (s <= L)."""

    def __init__(self, name: str):
        self.name = name

    def variants(self, L: int, budgets) -> list[Variant]:
        if self.name == "dtreerpo":
            return [Variant("dtreerpo", "dtreerpo", s) for s in budgets if s <= L]
        out = [Variant("mdpo", "mdpo", K) for K in budgets if K < L]
        return out + ([Variant("mdpo", "mdpo", 0)] if L <= max(budgets) else [])

    def gradients(self, bt: Batch, v: Variant, g: torch.Generator):
        if self.name == "dtreerpo":
            from dllm_ais.analysis.estimator_paths import draw_dtreerpo_own_steps

            return score_draw(bt, draw_dtreerpo_own_steps(bt.rollout.commit_step, bt.counted, v.setting))
        from dllm_ais.likelihood.policy import policy_likelihood

        L = bt.rollout.completion_ids.shape[1]
        lik = policy_likelihood("mdpo", PolicyLikelihoodConfig(mdpo_steps=v.setting or L))
        return score_draw(bt, lik.draw_rollout(bt.rollout, g))


ESTIMATORS: dict[str, object] = {"one_step": OneStep(), "elbo": MaskDraw("elbo"), "coupled": MaskDraw("coupled"),
                                 "spg": MaskDraw("spg"), "trajectory": Trajectory(), "mdpo": RecordedCanvas("mdpo"),
                                 "dtreerpo": RecordedCanvas("dtreerpo")}
"""`--policy-logprob` name -> its rung-2 entry (dllm_ais.config.POLICY_LOGPROBS)."""

BASE_ESTIMATORS = ("one_step", "elbo", "coupled", "spg", "trajectory")
"""The entries a cell measures by default (MCConfig.estimators; part of every cached cell's key, so it stays)."""
SUPPLEMENT_ESTIMATORS = ("mdpo", "dtreerpo")
"""The entries added to cached cells on the same sampled paths (mc_ground_truth.measure_cell's `supplement`)."""


def all_variants(names, L: int, budgets) -> list[Variant]:
    """Every variant of the named estimators at length L."""
    return [v for name in names for v in ESTIMATORS[name].variants(L, budgets)]
