"""Rung 2 of the estimator ladder (issue 40): each policy likelihood's GRPO gradient against a Monte-Carlo ground
truth, on models where nothing can be enumerated.

One *cell* = a model, its sampler (the package's, uncached) and a completion length L. Its target is
g* = ∇J̃ of the sampler that ran — the expected GRPO gradient with the exact path log-likelihood,
E[(1/(N L)) Σ_i Â_i ∇ log P(path_i)] — estimated without bias from sampled GRPO batches (units of N completions
in groups of G, each group's prompt uniform over the cell's prompts) through the package's exact path law
(mc_paths.py: selection terms included; equal to likelihood/trajectory.path_logprob and
models/dream/trajectory.path_logprob, tested). On the SAME batches every registered estimator
(mc_estimators.py) gives its own GRPO gradient; mc_stats.py turns the paired unit vectors into bias², tr Var (at
batch size N), MSE and cosine with jackknife intervals that include the target's Monte-Carlo error, and the
target's own standard error. Gradients are those of the LM head only (mc_head.py: the coordinates of the full
gradient that belong to W [V, d]); rung 1's bridge test compares the same coordinates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm_ais.analysis import mc_stats
from dllm_ais.analysis.mc_estimators import BASE_ESTIMATORS, ESTIMATORS, Batch, Variant, all_variants, per_unit
from dllm_ais.analysis.mc_head import HeadTap, head_size
from dllm_ais.analysis.mc_paths import sample_paths
from dllm_ais.analysis.mc_sdar_estimators import SDAR_ESTIMATORS
from dllm_ais.rl.advantages import group_advantages


@dataclass(frozen=True)
class MCConfig:
    """How much to sample per cell and what to measure (defaults: the committed run)."""

    units: int = 200
    """GRPO batches of N completions per cell (paths = units · N)."""
    N: int = 64
    """Completions per GRPO batch (rung 1's N)."""
    G: int = 8
    """Group size."""
    budgets: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Forward rows per completion compared (each estimator at its settings with these nominal rows)."""
    estimators: tuple[str, ...] = BASE_ESTIMATORS
    """Registry entries measured (mc_estimators.ESTIMATORS; the default, BASE_ESTIMATORS, is what the cached cells
    hold: a new entry joins them as a supplement, `measure_cell`, not here)."""
    blocks: int = 16
    """Jackknife blocks."""
    control_variate: bool = True
    """Subtract β · Σ ∇ log P / (N L) from the target (mc_stats.py)."""
    batch_elements: int = 2 ** 24
    """Budget of one sampling batch's recorded gradients (sequences · L · D floats): whole units per batch."""
    seed: int = 0
    """Seeds the prompt draws, the sampler and the estimators' draws (three generators)."""

    def __post_init__(self):
        if self.N % self.G or self.G < 2:
            raise ValueError(f"MCConfig: N={self.N} must be a multiple of G={self.G} >= 2.")
        if self.units < 2 * self.blocks or self.blocks < 2:
            raise ValueError(f"MCConfig: units={self.units} must be >= 2 · blocks={self.blocks} (jackknife), blocks "
                             ">= 2.")
        unknown = set(self.estimators) - set(ESTIMATORS)
        if unknown:
            raise ValueError(f"MCConfig.estimators: unknown {sorted(unknown)}; known {', '.join(ESTIMATORS)}.")


@dataclass
class Bed:
    """One cell's model, sampler and reward."""

    name: str
    """Label, e.g. llada/rl/L16/low_confidence."""
    model: object
    law: object
    """mc_paths.LLaDALaw, DreamLaw or SDARLaw (the sampler config is law.config)."""
    prompts: torch.Tensor
    """[n, P] prompt ids (left-padded)."""
    prompt_mask: torch.Tensor
    """[n, P] bool."""
    reward: Callable
    """reward(prompt_index [B], rollout) -> [B] float64."""
    stop_ids: tuple[int, ...]
    """Stop tokens of the completion mask (() = every position counts)."""
    block_length: int

    @property
    def L(self) -> int:
        return self.law.config.gen_length


ESTIMATORS_OF = {"sdar": SDAR_ESTIMATORS}
"""Families with likelihoods of their own (block diffusion: mc_sdar_estimators.py); the others use ESTIMATORS. A cell
measures the names of MCConfig.estimators its family's registry has."""


def key(v: Variant) -> str:
    """The results' name of a variant: label:setting (0 = every step: `all`)."""
    return f"{v.label}:{v.setting or 'all'}"


SUPPLEMENT_SEED = 1_000_003
"""The supplement's estimator generator is seeded SUPPLEMENT_SEED + MCConfig.seed (apart from the cell's three)."""
TIMING = ("seconds", "cpu_seconds", "seconds_by_part")
"""A cell result's machine-dependent fields."""


def run_cell(bed: Bed, cfg: MCConfig, log=print) -> dict:
    """Sample cfg.units GRPO batches, accumulate the target and every estimator, and summarise (module doc)."""
    return measure_cell(bed, cfg, (), log)[0]


def measure_cell(bed: Bed, cfg: MCConfig, supplement: tuple[str, ...] = (), log=print) -> tuple[dict, dict | None]:
    """(the cell's result, the result with the `supplement` entries added or None). The supplement's estimators
    draw from a generator of their own (SUPPLEMENT_SEED + seed) after the cell's own in every batch, so the paths,
    the target and every base estimator are exactly those of `run_cell`; the supplemented result adds their rows
    and ranks every estimator together (both results carry this pass's timing)."""
    t0, c0 = time.perf_counter(), time.process_time()
    L, N, G = bed.L, cfg.N, cfg.G
    tap = HeadTap(bed.model)
    D = head_size(bed.model)
    sums = mc_stats.Sums(cfg.blocks, D)
    registry = ESTIMATORS_OF.get(bed.law.family, ESTIMATORS)
    variants = all_variants(cfg.estimators, L, cfg.budgets) if registry is ESTIMATORS else [
        v for name in cfg.estimators if name in registry for v in registry[name].variants(L, cfg.budgets)]
    extra = all_variants(supplement, L, cfg.budgets)
    g_prompt, g_sample, g_est = (torch.Generator().manual_seed(cfg.seed * 3 + i) for i in range(3))
    streams = [(variants, g_est, registry), (extra, torch.Generator().manual_seed(SUPPLEMENT_SEED + cfg.seed),
                                             ESTIMATORS)]
    per_batch = max(1, cfg.batch_elements // (N * L * D))  # units per sampling batch
    done, reward_sum, seconds = 0, 0.0, {"sample": 0.0, **{key(v): 0.0 for v in variants + extra}}
    while done < cfg.units:
        nb = min(per_batch, cfg.units - done)
        B = nb * N
        t1 = time.perf_counter()
        idx = torch.randint(bed.prompts.shape[0], (B // G,), generator=g_prompt).repeat_interleave(G)
        rollout, rec = sample_paths(bed.law, tap, bed.prompts[idx], bed.prompt_mask[idx], bed.stop_ids, g_sample)
        rewards = bed.reward(idx, rollout).double()
        reward_sum += float(rewards.sum())
        adv = group_advantages(rewards, G, "group").adv.double()
        seq = torch.arange(B)
        bt = Batch(law=bed.law, tap=tap, rollout=rollout, record=rec, adv=adv, coef=adv / (N * L), unit=seq // N,
                   group=seq // G, n_units=nb, G=G, block_length=bed.block_length)
        score = rec.path_grad()  # [B, D]
        t = per_unit(bt, score)
        u = torch.zeros(nb, D, dtype=torch.float64).index_add_(0, bt.unit, score / (N * L))
        block = (done + torch.arange(nb)) % cfg.blocks
        sums.add_target(block, t, u)
        seconds["sample"] += time.perf_counter() - t1
        for vs, g, reg in streams:
            for v in vs:
                t1 = time.perf_counter()
                a, rows = reg[v.name].gradients(bt, v, g)
                sums.add(key(v), block, a, t, u, rows, block[bt.unit])
                seconds[key(v)] += time.perf_counter() - t1
        done += nb
    full = mc_stats.summary(sums, cfg.control_variate)
    info = {"cell": bed.name, "L": L, "units": done, "paths": done * N, "J": reward_sum / (done * N),
            "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0, "seconds_by_part": seconds}
    base = {**full, "estimators": {key(v): full["estimators"][key(v)] for v in variants}}
    base["rankings"] = rankings(sums, base, variants, cfg)
    base.update(info, variants={key(v): {"name": v.name, "label": v.label, "setting": v.setting} for v in variants})
    sup = None
    if supplement:
        sup = {**full, "rankings": rankings(sums, full, variants + extra, cfg), **info,
               "variants": {key(v): {"name": v.name, "label": v.label, "setting": v.setting}
                            for v in variants + extra},
               "supplement": {"estimators": list(supplement), "seed": SUPPLEMENT_SEED + cfg.seed}}
    log(f"{bed.name}: {done * N} paths in {info['seconds']:.0f} s (sampling {seconds['sample']:.0f} s), J = "
        f"{base['J']:.3f}, target MC error {base['target']['mc_rel_error']['value']:.3f}")
    return base, sup


def supplement_cell(bed: Bed, cfg: MCConfig, cached: dict, supplement: tuple[str, ...], log=print) -> dict:
    """A cached cell result (`run_cell`'s, as stored) with the `supplement` entries' rows added, measured on the
    same paths: the cell is measured again with the supplement (`measure_cell`), and its base result must equal
    `cached` exactly outside TIMING and `model` (the same paths, target and estimator rows, checked through the
    same JSON round trip as the cache) — otherwise the code or the config changed since the cell was cached and a
    ValueError says so. Returns the supplemented result with `cached`'s `model`."""
    import json

    base, sup = measure_cell(bed, cfg, supplement, log)
    same = lambda d: {k: v for k, v in json.loads(json.dumps(d, sort_keys=True, default=float)).items()  # noqa: E731
                      if k not in TIMING and k != "model"}
    if same(base) != same(cached):
        diff = sorted(k for k in same(base).keys() | same(cached).keys() if same(base).get(k) != same(cached).get(k))
        raise ValueError(f"{bed.name}: re-measuring the cached cell gave other numbers ({', '.join(diff)}): the "
                         "code or the config changed since it was cached; rerun the cell instead of supplementing.")
    return {**sup, "model": cached.get("model")}


def rankings(sums: mc_stats.Sums, summ: dict, variants: list[Variant], cfg: MCConfig) -> dict:
    """Per budget b: each estimator (row label) at its setting of lowest MSE among those whose measured rows fit
    b, the paired jackknife difference of every pair of them, and each one's rank interval
    (ladder_rank.rank_intervals: a rank moves only past estimators it is distinguishable from)."""
    from dllm_ais.analysis.ladder_rank import rank_intervals

    est = summ["estimators"]
    out = {}
    for b in cfg.budgets:
        chosen: dict[str, str] = {}
        for v in variants:
            k = key(v)
            if est[k]["rows"]["value"] <= b + 1e-9 and (
                    v.label not in chosen or est[k]["mse"]["value"] < est[chosen[v.label]]["mse"]["value"]):
                chosen[v.label] = k
        names = sorted(chosen)
        pairs = {}
        for i, a in enumerate(names):
            for c in names[i + 1:]:
                pairs[f"{a}|{c}"] = mc_stats.paired_mse_difference(sums, chosen[a], chosen[c], cfg.control_variate)

        def better(a: str, c: str, pairs=pairs) -> bool:  # a's MSE distinguishably below c's
            d = pairs.get(f"{a}|{c}")
            if d is not None:
                return d["value"] + d["half"] < 0
            d = pairs[f"{c}|{a}"]
            return d["value"] - d["half"] > 0

        ranks = rank_intervals({n: est[chosen[n]]["mse"]["value"] for n in names}, better)
        out[str(b)] = {"chosen": chosen, "pairs": pairs, "ranks": ranks}
    return out
