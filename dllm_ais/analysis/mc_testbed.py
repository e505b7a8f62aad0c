"""The bridge between rung 1 and rung 2 (issue 40): rung 2's Monte-Carlo machinery run on rung 1's enumerable
testbed (analysis/estimators.py: tiny LLaDA, Dream and SDAR, V_c = 3, L = 4), and rung 1's exact figures restricted
to the coordinates rung 2 measures (the LM head's weight), so the two can be compared number for number.

`bridge_bed` builds the rung-2 cell (the package's sampler with T = 1, one block, steps = L; every position
counts; reward = the shift task's fraction right); `exact_head_figures` runs rung 1's closed forms
(estimators.closed_forms) on head-only feature gradients and the head slice of the exact target.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import torch

from dllm_ais.analysis import estimator_draws as D
from dllm_ais.analysis import estimators as E
from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.estimator_families import EXACT_FAMILIES
from dllm_ais.analysis.estimator_features import feature_gradients
from dllm_ais.analysis.exact_sampler import canvas_logits, canvas_table
from dllm_ais.analysis.mc_ground_truth import Bed
from dllm_ais.analysis.mc_paths import LAWS
from dllm_ais.models.shift import logits_view


def bridge_model(cfg: E.EstimatorsConfig, seed: int, checkpoint: int, family: str = "llada"):
    """Rung 1's model of `family` and `seed` at SFT step `checkpoint` (eval mode) and its prompts."""
    tbc = tb.TestbedConfig(**{**asdict(cfg.testbed), "seed": seed})
    model = E.MAKE[family](tbc)
    states = tb.sft_checkpoints(model, tbc, tuple(sorted({0, checkpoint})), family=family, lr=cfg.sft_lr)
    model.load_state_dict(states[checkpoint])
    return model.eval(), tb.draw_prompts(tbc)


def bridge_bed(cfg: E.EstimatorsConfig, model, prompts: torch.Tensor, rule: str, family: str = "llada") -> Bed:
    """The rung-2 cell of rung 1's model, prompts and sampler `rule` (LLaDA: low_confidence or threshold; Dream:
    entropy or maskgit_plus)."""
    t = cfg.testbed
    L = t.gen_length
    law, _ = LAWS[family].named(rule, L, t.mask_id, cfg.threshold)
    answers = tb.answers(prompts, L, t.vocab)  # [n, L]

    def reward(idx: torch.Tensor, rollout) -> torch.Tensor:
        return (rollout.completion_ids == answers[idx]).double().mean(-1)

    return Bed(name=f"testbed/{family}/{rule}", model=model, law=law, prompts=prompts,
               prompt_mask=torch.ones_like(prompts, dtype=torch.bool), reward=reward, stop_ids=(), block_length=L)


def sdar_bridge_bed(cfg: E.EstimatorsConfig, model, prompts: torch.Tensor, rule: str) -> Bed:
    """The rung-2 cell of rung 1's SDAR testbed (exact_testbed.make_sdar): the sampler on the model under the
    one-token prefix (prompts [prefix, x]: one whole block), blocks of SDAR_BLOCK, strategy `rule` (τ =
    cfg.threshold for the dynamic one), T = 1, steps = L; every position counts."""
    from dllm_ais.analysis.mc_sdar import SDARLaw

    t = cfg.testbed
    L = t.gen_length
    law, block = SDARLaw.named(rule, L, t.mask_id, cfg.threshold, block_length=tb.SDAR_BLOCK)
    answers = tb.answers(prompts, L, t.vocab)
    x = model.with_prefix(prompts)

    def reward(idx: torch.Tensor, rollout) -> torch.Tensor:
        return (rollout.completion_ids == answers[idx]).double().mean(-1)

    return Bed(name=f"testbed/sdar/{rule}", model=model.inner, law=law, prompts=x,
               prompt_mask=torch.ones_like(x, dtype=torch.bool), reward=reward, stop_ids=(), block_length=block)


def _head_slice(model) -> slice:
    """Where the LM head's weight sits in the flat `model.parameters()` vector."""
    head = model.get_output_embeddings().weight
    start = 0
    for p in model.parameters():
        if p is head:
            return slice(start, start + p.numel())
        start += p.numel()
    raise ValueError("the LM head's weight is not among the model's parameters.")


def exact_head_figures(cfg: E.EstimatorsConfig, model, prompts: torch.Tensor, rule: str, seed: int = 0,
                       family: str = "llada") -> dict:
    """Rung 1's exact bias², tr Var (N), MSE and cosine of every estimator × budget on the LM head's coordinates:
    {rung-2 key (label:setting): figures}, plus "_target": {"norm_sq": ‖g*‖²}."""
    t = cfg.testbed
    V, L = t.vocab, t.gen_length
    sp = D.Space(t.prompt_len, L)
    feats = feature_gradients(model, prompts, V, L, head_only=True)
    with torch.no_grad():
        logits = canvas_logits(logits_view(model), prompts, canvas_table(V, L), t.mask_id)
    tg = E.target(model, prompts, logits, cfg, rule, family)
    cut = _head_slice(model)
    tg = replace(tg, g_star=tg.g_star[cut], grad_j=tg.grad_j[cut])
    fam = EXACT_FAMILIES[family]
    thr = cfg.threshold if rule in fam.threshold_rules else None
    out = {}
    own = fam.own_moments is not None  # SDAR: its own estimators instead of the mask draws and SPG
    for (name, K), mom in (fam.own_moments(sp, cfg.budgets) if own else E.mask_moments(cfg)).items():
        out[f"{name}:{K}"] = E.closed_forms(mom, feats, tg, L, cfg.G, cfg.N)
    for K in () if own else cfg.budgets:
        reps = D.spg(sp, K, feats.logp_a, cfg.spg_draws, cfg.spg_replicas, cfg.seed + 1000 * seed + K)
        out[f"spg:{K}"] = E._replica_mean([E.closed_forms(m, feats, tg, L, cfg.G, cfg.N) for m in reps],
                                          reps[0].mc_draws)
    for label, merge in (("trajectory", 1), ("trajectory-merge2", 2)):
        mom = fam.trajectory(sp, logits, tg.pi, V, rule, t.mask_id, thr, merge)
        out[f"{label}:{'all' if merge == 1 else merge}"] = E.closed_forms(mom, feats, tg, L, cfg.G, cfg.N)
    for (name, K), mom in E.recorded_canvas_moments(family, sp, logits, cfg, rule).items():
        setting = "all" if name == "mdpo" and K == L else K  # MDPO with K = L scores every canvas
        out[f"{name}:{setting}"] = E.closed_forms(mom, feats, tg, L, cfg.G, cfg.N)
    out["_target"] = {"norm_sq": float(tg.g_star @ tg.g_star), "J": tg.J}
    return out
