"""Rung 2's cells (issue 40): which trained model, sampler and length each Monte-Carlo cell measures, and the run
over them (mc_ground_truth.run_cell per cell; results into one JSON document).

A cell = family × checkpoint (sft, rl; ladder_models.py) × completion length L × sampler (`GRID`):
- LLaDA `low_confidence` (one block, steps = L), `low_confidence-blocks` (`blocks` blocks of L / blocks tokens,
  steps = L), `threshold` (one block, τ = `threshold`, Fast-dLLM's rule without a cache);
- Dream `entropy` and `maskgit_plus` (Dream's uncached `diffusion_generate`, steps = L, one block: Dream's threshold
  and blocks exist only with Fast-dLLM's cache, whose path law the package scores from the sampler's record, without
  a gradient — not measurable here);
- SDAR `low_confidence_static` and `low_confidence_dynamic` (models/sdar/sampler.py with its native per-block KV
  cache, exact: causal across blocks; blocks of 4, steps = L, τ = `threshold`; its law mc_sdar.py, its
  likelihoods mc_sdar_estimators.py).
Every sampler samples at T = 1. Prompts: `prompts` held-out digits problems of the model's length (test split,
fixed), each group's prompt uniform among them; the reward is the digits task's own (partial credit per digit) on
the decoded completion up to its first EOS.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dllm_ais.analysis import ladder_models as LM
from dllm_ais.analysis.mc_ground_truth import Bed, MCConfig, measure_cell, supplement_cell

LLADA_SAMPLERS = ("low_confidence", "low_confidence-blocks", "threshold")
DREAM_SAMPLERS = ("entropy", "maskgit_plus")
SDAR_SAMPLERS = ("low_confidence_static", "low_confidence_dynamic")
SAMPLERS = {"llada": LLADA_SAMPLERS, "dream": DREAM_SAMPLERS, "sdar": SDAR_SAMPLERS}


GRID = (("llada", "low_confidence", (8, 16, 32, 64)), ("llada", "low_confidence-blocks", (8, 16, 32, 64)),
        ("llada", "threshold", (8, 16, 32, 64)), ("dream", "entropy", (8, 16, 32, 64)),
        ("dream", "maskgit_plus", (8, 16, 32, 64)), ("sdar", "low_confidence_static", (8, 16, 32, 64)),
        ("sdar", "low_confidence_dynamic", (8, 16, 32, 64)))
"""The full grid's cells (family, sampler, lengths) — every checkpoint of each (Dream's models are trained with the
entropy rule; maskgit_plus samples the same models; SDAR's with low_confidence_dynamic, static samples the same):
every sampler at every length the issue names. A cell's cache key does not depend on the grid (`_cell_cache`), so
adding a family's rows leaves every other cell's key unchanged."""


@dataclass(frozen=True)
class Rung2Config:
    """The grid and the sampling effort (defaults: the committed full run)."""

    grid: tuple = GRID
    """(family, sampler, lengths) triples; samplers: LLADA_SAMPLERS / DREAM_SAMPLERS."""
    checkpoints: tuple[str, ...] = LM.CHECKPOINTS
    """Checkpoints of every model (ladder_models.CHECKPOINTS)."""
    mc: MCConfig = MCConfig(blocks=8)
    """Per-cell sampling and estimators (its `units` is replaced by `paths`)."""
    paths: tuple = ((8, 2048), (16, 1024), (32, 1024), (64, 1024))
    """(L, paths per cell): units = paths / N."""
    threshold: float = 0.9
    """τ of the LLaDA threshold sampler."""
    blocks: int = 4
    """Blocks of the `low_confidence-blocks` sampler."""
    prompts: int = 64
    """Held-out prompts of a cell."""
    models: LM.LadderModelConfig = LM.LadderModelConfig()

    def __post_init__(self):
        for f, smp, _ in self.grid:
            if smp not in SAMPLERS.get(f, ()):
                raise ValueError(f"Rung2Config.grid: sampler {smp!r} of family {f!r} unknown; use one of "
                                 f"{SAMPLERS.get(f, ())}.")
        missing = {L for _, _, Ls in self.grid for L in Ls} - dict(self.paths).keys()
        if missing:
            raise ValueError(f"Rung2Config.paths has no entry for L in {sorted(missing)}.")

    def units(self, L: int) -> int:
        return max(2 * self.mc.blocks, dict(self.paths)[L] // self.mc.N)


def sampler_law(family: str, sampler: str, L: int, cfg: Rung2Config, mask_id: int):
    """The mc_paths law of a named sampler at length L (T = 1)."""
    from dllm_ais.analysis.mc_paths import LAWS

    return LAWS[family].named(sampler, L, mask_id, cfg.threshold, cfg.blocks)


def digits_bed(family: str, checkpoint: str, L: int, sampler: str, cfg: Rung2Config, directory: Path) -> Bed:
    """The cell of a trained checkpoint on held-out digits prompts (module doc)."""
    from dllm_ais.models.load import encode_prompts
    from dllm_ais.models.tiny import tiny_tokenizer
    from dllm_ais.tasks import digits

    model = LM.load(family, directory)
    tok = tiny_tokenizer()
    rows = digits.load("test", limit=cfg.prompts, seed=cfg.models.seed,
                       config=digits.DigitsConfig(op="shift", length=LM.digits_length(L)))
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], chat=False)
    answers = [r["answer"] for r in rows]
    law, block = sampler_law(family, sampler, L, cfg, model.config.mask_token_id)

    def reward(idx: torch.Tensor, rollout) -> torch.Tensor:
        texts = [tok.decode(c[k], skip_special_tokens=True)
                 for c, k in zip(rollout.completion_ids, rollout.completion_mask, strict=True)]
        return torch.tensor([digits.score(t, answers[i]) for t, i in zip(texts, idx.tolist(), strict=True)],
                            dtype=torch.float64)

    return Bed(name=f"{family}/{checkpoint}/L{L}/{sampler}", model=model, law=law, prompts=ids, prompt_mask=mask,
               reward=reward, stop_ids=(tok.eos_token_id,), block_length=block)


def cells(cfg: Rung2Config) -> list[tuple[str, str, int, str]]:
    """(family, checkpoint, L, sampler) of every cell, in run order (by L, so short cells finish first)."""
    out = [(f, c, L, s) for f, s, Ls in cfg.grid for L in Ls for c in cfg.checkpoints]
    return sorted(out, key=lambda x: (x[2], x[0], x[1], x[3]))


CELL_VERSION = 1
"""Bumped whenever a cell's computation changes: cached cells of another version are recomputed."""


def _cell_cache(cfg: Rung2Config, root: Path, cell: tuple) -> Path:
    """Where a finished cell's result is kept (under the gitignored models root), keyed by the whole config."""
    import hashlib
    import json

    own = {"mc": asdict(replace(cfg.mc, units=cfg.units(cell[2]))), "models": asdict(cfg.models),
           "threshold": cfg.threshold, "blocks": cfg.blocks, "prompts": cfg.prompts}  # all that shapes this cell
    blob = json.dumps({"cfg": own, "cell": cell, "version": CELL_VERSION}, sort_keys=True, default=str)
    return root / "cells" / f"{'-'.join(map(str, cell))}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}.json"


SUPPLEMENT_VERSION = 1
"""Bumped whenever a supplement's computation changes (mc_estimators.RecordedCanvas, measure_cell's supplement)."""


def _supplement_cache(cache: Path, names: tuple[str, ...]) -> Path:
    """Where a cell's supplemented result is kept: beside the cell, named by the entries and SUPPLEMENT_VERSION."""
    return cache.with_name(f"{cache.stem}+{'+'.join(names)}-v{SUPPLEMENT_VERSION}.json")


def run(cfg: Rung2Config, root: Path = Path("runs/ladder"), log=print, supplement: tuple[str, ...] = ()) -> dict:
    """Measure every cell, training (or reusing) each model when its first cell comes; a finished cell is cached
    under root/cells (an interrupted run resumes there): {"config", "cells": {name: result}, "timing"}.

    supplement: mc_estimators entries added to every cell on its own sampled paths (e.g. SUPPLEMENT_ESTIMATORS): a
    cached cell is measured again with them and must reproduce its cached numbers (mc_ground_truth.supplement_cell).
    It is kept out of the cells' cache keys and of `config` (so cached cells stay valid; each supplemented cell says
    what was added in its `supplement` field) and cached beside the cell."""
    import json

    from dllm_ais.analysis.mc_estimators import ESTIMATORS
    from dllm_ais.atomic import atomic_write_text

    bad = [n for n in supplement if n not in ESTIMATORS or n in cfg.mc.estimators]
    if bad:
        raise ValueError(f"supplement {bad}: name mc_estimators entries ({', '.join(ESTIMATORS)}) that the cells do "
                         "not measure already (MCConfig.estimators).")

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    t_models, models, out = 0.0, {}, {}
    def write(path: Path, res: dict) -> dict:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(res, sort_keys=True, default=float))
        return json.loads(path.read_text())  # the same values whether computed now or read back

    for cell in cells(cfg):
        f, c, L, s = cell
        cache = _cell_cache(cfg, root, cell)
        sup_cache = _supplement_cache(cache, supplement) if supplement else None
        done = sup_cache or cache  # the result this run wants
        if done.is_file():
            res = json.loads(done.read_text())
            out[res["cell"]] = res
            log(f"{res['cell']}: cached ({done})")
            continue
        if (f, L) not in models:
            t1 = time.perf_counter()
            models[(f, L)] = LM.checkpoints(f, L, cfg.models, root, log)
            t_models += time.perf_counter() - t1
        bed = digits_bed(f, c, L, s, cfg, models[(f, L)][c])
        mc = replace(cfg.mc, units=cfg.units(L))
        if cache.is_file():  # cached without the supplement: measured again on the same paths, checked
            res = write(sup_cache, supplement_cell(bed, mc, json.loads(cache.read_text()), supplement, log))
            out[bed.name] = res
            continue
        res, sup = measure_cell(bed, mc, supplement, log)
        res["model"] = {"family": f, "checkpoint": c, "sampler": s, "train": LM.train_info(models[(f, L)][c])}
        out[bed.name] = write(cache, res)
        if sup is not None:
            out[bed.name] = write(sup_cache, {**sup, "model": res["model"]})
    return {"config": asdict(cfg), "cells": out,
            "timing": {"models_seconds": t_models, "cells_seconds": time.perf_counter() - t0 - t_models}}
