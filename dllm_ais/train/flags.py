"""Checks on `dllm-ais train` flags, run before anything is written: combinations that cannot do what was typed,
what may change when a run is resumed, and the default number of CPU threads.

Pure functions over the flags the user typed (`{"--is-cap": 3.0, ...}`) and the resulting Preset; no torch import,
so a refused command fails in well under a second and leaves nothing on disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import fields, is_dataclass

from dllm_ais.config import Preset
from dllm_ais.families import get_family


def _mode(p: Preset) -> str:
    """The weight a correction applies at its full-IS end: the correction itself, or AIS's target."""
    c = p.correction
    return c.ais_target if c.correction == "ais" else c.correction


NEEDS: tuple[tuple[str, Callable[[Preset], bool], str], ...] = (
    ("--ais-target", lambda p: p.correction.correction == "ais", "--correction ais"),
    ("--is-cap", lambda p: p.correction.correction in ("tis", "mis", "ais"), "--correction tis, mis or ais"),
    ("--is-cap-min", lambda p: p.correction.correction != "none", "a --correction other than none"),
    ("--band", lambda p: _mode(p) == "band", "--correction band (or --correction ais --ais-target band)"),
    ("--dual-clip", lambda p: p.grpo.loss_type == "tbpo", "--loss-type tbpo"),
    ("--fp4-format", lambda p: p.train.rollout_precision == "fp4", "--rollout-precision fp4"),
    *((flag, lambda p: get_family(p.model.family).diffusion, "a diffusion (LLaDA or Dream) preset; autoregressive "
       "rollouts have no denoising canvas") for flag in ("--cache", "--threshold", "--mismatch-estimator",
                                                         "--trajectory-steps", "--policy-logprob",
                                                         "--max-commit-per-step")),
    ("--trajectory-merge", lambda p: p.train.policy_logprob == "trajectory", "--policy-logprob trajectory"),
    *((flag, lambda p: "trajectory" in (p.train.mismatch_estimator, p.train.policy_logprob),
       "--mismatch-estimator trajectory or --policy-logprob trajectory") for flag in ("--trajectory-steps",
                                                                                    "--trajectory-selection")),
    ("--elbo-draws", lambda p: p.train.policy_logprob in ("elbo", "spg", "ebpo"), "--policy-logprob elbo, spg or "
     "ebpo"),
    *((flag, lambda p: p.train.policy_logprob == "elbo", "--policy-logprob elbo")
      for flag in ("--elbo-scheme", "--elbo-ratio-level")),
    *((flag, lambda p: p.train.policy_logprob == "spg", "--policy-logprob spg")
      for flag in ("--spg-beta", "--spg-mix", "--spg-block-length")),
    *((flag, lambda p: p.train.policy_logprob == "coupled", "--policy-logprob coupled")
      for flag in ("--coupled-t-min", "--coupled-t-max")),
    *((flag, lambda p: p.train.policy_logprob == "mdpo", "--policy-logprob mdpo")
      for flag in ("--mdpo-steps", "--mdpo-confidence")),
    ("--dtreerpo-segments", lambda p: p.train.policy_logprob == "dtreerpo", "--policy-logprob dtreerpo"),
)
"""(flag, when the flag is read, what to add): a typed flag whose condition is false would be silently ignored."""

NO_MISMATCH_FLAGS = ("--correction", "--ais-target", "--ais-tau", "--ais-ema", "--ais-combiner", "--is-cap",
                     "--is-cap-min", "--band")
"""Flags that only shape the mismatch weights w = π_old/μ, which are all 1 when the rollouts are the BF16 master."""

RESUME_CHANGEABLE = ("--steps", "--save-every", "--save-every-minutes", "--keep-checkpoints", "--report-to",
                     "--threads", "--no-progress", "--out", "--resume")
"""Flags `--resume` applies: --steps, the checkpoint flags and --report-to are applied and recorded in config.json;
--threads and --no-progress do not belong to the run. Every other flag must repeat the run's value (or be left out)."""

TRACKER_PACKAGES = {"tensorboard": "'dllm-ais[tensorboard]'", "comet_ml": "comet-ml"}
"""pip name of a tracker's package where it is not the tracker's own name."""


def check_trackers(report_to: list[str]) -> None:
    """Refuse (one ImportError line) a --report-to tracker whose package is not installed, before anything is
    written; the import name is the tracker's (accelerate's own availability check), without importing it."""
    import importlib.util

    for name in report_to:
        if importlib.util.find_spec(name) is None and not (name == "tensorboard" and importlib.util.find_spec(
                "tensorboardX")):
            raise ImportError(f"--report-to {name} needs the {name} package: pip install "
                              f"{TRACKER_PACKAGES.get(name, name)}, or drop {name} from --report-to.")


def check_combinations(typed: dict[str, object], preset: Preset) -> None:
    """Raise ValueError (one line, naming the flags) for typed flags that the preset would ignore or contradict."""
    threads = typed.get("--threads")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: must be >= 1 (leave it out for the default).")
    if preset.train.rollout_precision == "bf16":
        idle = [f for f in NO_MISMATCH_FLAGS if f in typed and not (f == "--correction" and typed[f] == "none")]
        if idle:
            raise ValueError(f"{' / '.join(idle)} with --rollout-precision bf16: the rollout policy is the BF16 "
                             "master itself, so every weight is 1 (ω ≡ 1) and the correction changes nothing; roll "
                             "out in fp8 or fp4, or drop the correction flags.")
    check_cuda_graphs(preset)
    for flag, used, needs in NEEDS:
        if flag in typed and not used(preset):
            raise ValueError(f"{flag} has no effect here: it needs {needs}; drop {flag} or add that.")
    from dllm_ais.rl.config import TRL_ALIASES

    alias, level = typed.get("--correction"), typed.get("--correction-level")
    if alias in TRL_ALIASES and level is not None and level != TRL_ALIASES[alias][1]:
        raise ValueError(f"--correction {alias} is TRL's name for --correction {TRL_ALIASES[alias][0]} "
                         f"--correction-level {TRL_ALIASES[alias][1]}; it contradicts --correction-level {level}. "
                         f"Drop one of them.")


def check_cuda_graphs(preset: Preset) -> None:
    """Refuse --cuda-graphs on for rollouts that do not run on CUDA (one ValueError line, before anything is written;
    the sampler refuses the same at its start, samplers/cuda_graphs.use_graphs). auto / off pass everywhere."""
    device = preset.model.device
    if preset.sampler.cuda_graphs == "on" and not str(device).startswith("cuda"):
        raise ValueError(f"--cuda-graphs on needs CUDA rollouts but --device is {device}; use --cuda-graphs auto "
                         "(graphs on CUDA, eager elsewhere) or off, or --device cuda.")


def _leaves(obj, prefix: str = "") -> dict[str, object]:
    """{"TrainConfig.steps": 200, ...} for every field of the preset's component configs."""
    out: dict[str, object] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.update(_leaves(value))
        elif prefix or type(obj).__name__ != "Preset":
            out[f"{type(obj).__name__}.{f.name}"] = value
    return out


def resume_changes(saved: Preset, wanted: Preset, field_flags: dict[str, str]) -> tuple[list[str], list[str]]:
    """(flags applied on resume, flags refused): the fields where `wanted` (the saved preset with the typed flags
    applied) differs from `saved`, named by their flag (`field_flags`, the CLI's FIELD_FLAGS)."""
    old, new = _leaves(saved), _leaves(wanted)
    changed = [field_flags.get(k, k) for k in old if old[k] != new[k]]
    changed = list(dict.fromkeys(changed))
    return [f for f in changed if f in RESUME_CHANGEABLE], [f for f in changed if f not in RESUME_CHANGEABLE]


def check_device(device: str | None) -> None:
    """Refuse a --device torch cannot use here (cuda on a CPU-only build or machine, mps off Apple silicon) with one
    line, instead of a traceback or a silent fallback. Imports torch: call it after the torch-free checks."""
    if device is None:
        return
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__}); use "
                           "--device cpu, or a machine with a GPU and a CUDA build of torch.")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise RuntimeError(f"--device {device}: MPS is not available here; use --device cpu.")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's or taskset's limit), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS, Windows)
        return os.cpu_count() or 1


def default_threads(cores: int) -> int:
    """Torch threads when --threads is not given: the usable cores minus one, at least 1. OpenMP threads spin-wait
    for each other at every parallel region, so when another process keeps a core busy, a thread per core makes
    every step wait for the descheduled one (measured on 2 cores: 13x slower per step); one core left free absorbs
    one busy neighbour at a cost of 1.7x when the machine is idle (docs/cpu.md, "Threads")."""
    return max(1, cores - 1)
