"""The model families, in one registry: a family is one folder, `models/<name>/`, and one line in `FAMILIES` below.

A family's folder holds what differs between families — its model, checkpoint reader, tiny built-in model,
sampler rule and selection law (where it has its own), fused FP8 rollout layer, trainer backend and plan shape — and
a `family.py` with one `Family` record. Job, plan, sample, eval and checkpoint code ask that record (what loads,
saves, samples and trains it; what it can and cannot do yet) instead of branching on family names.

The record is light (no torch): its entry points are `Hook`s, "module:function" names imported only when called, so
`dllm_ais.config` can validate a preset against the registry and each hook runs at the layer that calls it (a
family's `backend` hook, for example, is only called from train/). tests/test_layout.py holds every module of a
family folder to the layer its file name says (model.py: models/, sampler.py: samplers/, backend.py: train/ ...).
How to add a family: docs/layout.md ("Adding a model family").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    """A family's entry point, imported when it is first called: "dllm_ais.models.<family>.<module>:<function>"."""

    target: str
    """Dotted module path, a colon, and the function's name in that module."""

    def resolve(self) -> Callable:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class Family:
    """One model family: how it is recognised, loaded, saved, sampled and trained, and what it cannot do yet."""

    name: str
    """The registry key; `ModelConfig.family` and presets name the family by it."""
    title: str
    """The family's name in messages and help text ("LLaDA", "Dream", "Qwen")."""
    model_types: tuple[str, ...]
    """config.json `model_type` values that mean this family (checkpoint detection)."""
    architectures: tuple[str, ...]
    """config.json `architectures[0]` values, used when `model_type` is missing or unknown."""
    tiny: Hook
    """tiny(seed, dtype) -> the family's tiny built-in model (weights drawn from `seed`), for CPU runs and tests."""
    load: Hook
    """load(ModelConfig) -> (model in eval mode on cfg.device, tokenizer with left padding); the tiny built-in model
    when cfg.path is None."""
    load_dir: Hook
    """load_dir(directory, dtype, device) -> model: a checkpoint directory in the family's layout."""
    save: Hook
    """save(model, tokenizer, directory): the family's checkpoint layout, written atomically."""
    check_source: Hook
    """check_source(directory): parse and check the checkpoint's config files (no tensor read); raises one line."""
    lora_targets: Hook
    """lora_targets() -> peft `target_modules` covering every block linear."""
    backend: Hook
    """backend(SamplerConfig, model, tokenizer, TrainConfig | None) -> the trainer backend (train/backend.py's
    interface); TrainConfig None when only sampling."""
    diffusion: bool = True
    """A masked-diffusion family (--cache, --threshold, --remasking and the diffusion likelihoods apply); False: an
    autoregressive one."""
    fp8_copy: Hook | None = None
    """fp8_copy(model, backend, expected_m) -> the family's fused FP8 rollout copy, or None when `model` is not the
    family's (then fp8/quantize.py's per-Linear copy is used)."""
    fp4_copy: Hook | None = None
    """fp4_copy(model, make_linear) -> the family's fused emulated-FP4 rollout copy built with fp4/linear.py's
    `make_linear(in_features, out_features, device, name)`, or None when `model` is not the family's (then
    fp4/linear.py's per-Linear copy is used)."""
    bf16_sampling_copy: Hook | None = None
    """bf16_sampling_copy(model) -> the fused BF16 inference copy `dllm-ais sample` rolls out (same numbers, fewer
    kernels); None: the master samples."""
    resolve_sampler: Hook | None = None
    """resolve_sampler(Preset) -> (Preset, line, record): the sampler settings resolved against the checkpoint's own
    (Dream's generation_config.json alg) and checked before the run directory exists; the preset with what runs made
    explicit, one line saying what the checkpoint sets and what runs (printed at start), and both as a dict (written
    to config.json). None: nothing beyond SamplerConfig's own checks."""
    position_rules: tuple[str, ...] = ()
    """The sampler's named position rules (`--dream-alg`: Dream's `alg` values); empty: the flag is refused."""
    refusal: Callable | None = None
    """refusal(SamplerConfig, policy_logprob, mismatch_estimator, trajectory_steps) -> one line saying what the family
    cannot train yet with these settings, or None (Preset applies it before anything is written; a sampling-only
    caller passes "one_step", "elbo", None). A plain function of the family's family.py."""
    plan_config: Hook | None = None
    """plan_config(ModelConfig) -> (model config, where it came from) for `dllm-ais plan`; None: not modelled."""
    plan_shape: Hook | None = None
    """plan_shape(config, name) -> plan.shape.ModelShape, counted on the meta device."""
    plan_copy_bytes: Hook | None = None
    """plan_copy_bytes(config, precision, dtype, fp8_backend) -> bytes of the quantised rollout copy."""
    plan_commit_steps: Hook | None = None
    """plan_commit_steps(SamplerConfig) -> the sampler steps that commit a token in a sequence (what a trajectory
    replay scores per sequence); None: every step (LLaDA's schedule commits at each)."""
    plan_rollout_passes: Hook | None = None
    """plan_rollout_passes(Workload) -> [plan.workload.Pass]: the sampler's forwards per step, where the family's
    sampler is not the generic diffusion one (SDAR: one block against its native KV cache a step); None: the generic
    sampler's (plan/workload.py `rollout_passes`)."""
    native_kv_cache: bool = False
    """The family's sampler always keeps a KV cache of the canvas (SDAR's per-block cache): the plan counts it."""
    replay_step_canvases: int = 1
    """Full-canvas forwards one likelihood forward costs — a replayed step, or one mask draw of an ELBO-like
    likelihood (SDAR: one two-stream [x_t | x_0] forward of twice the canvas, 2); the plan multiplies the replayed
    steps (after `--trajectory-merge` grouped them) and the draws by it."""
    fused_producers: bool = False
    """The rollout copy runs the fused FP8 producers on CUDA (plan/memory.py counts their working set)."""
    graphed_sampling: bool = False
    """Sampler steps can be compiled / CUDA-graphed (prompts padded to the compile bucket)."""
    records_logp_mu: bool = True
    """The sampler records each token's log μ, so a trajectory policy's replay serves the trajectory mismatch ratio and
    that ratio replays π_old only; False (SDAR): the ratio replays the path law on π_old and on the rollout copy, and
    log μ is a replay too (plan/workload.py counts what runs)."""
    eval_block_length: Callable | None = None
    """eval_block_length(model, SamplerConfig) -> the block length evaluation samples with whatever the protocol's
    block (d1's 32), steps per token kept, or None for the protocol's: Dream's one block without a cache (its own
    generate has no blocks), SDAR's trained block (config block_size). None: always the protocol's."""
    eval_uses_rollout_sampler: bool = False
    """A trained checkpoint of this family is evaluated and sampled (`eval` strict, `sample --run`) with its preset's
    rollout sampler at temperature 0 — its own strategy, block and steps per token — instead of d1's LLaDA sampler
    (SDAR: d1's low-confidence blocks of 32 are not how a block-diffusion model decodes). `eval --protocol d1` keeps
    d1's sampler either way."""
    fsdp_fp8_refusal: str | None = None
    """Why FSDP with FP8 rollouts is refused for this family (None: supported)."""
    sampler_fields: tuple[str, ...] = ()
    """SamplerConfig fields only this family reads (e.g. SDAR's sdar_strategy): Preset refuses them, set, for any
    other family."""
    own_policy_logprobs: tuple[str, ...] = ()
    """`--policy-logprob` names only this family has (SDAR's ebpo): Preset refuses them for any other family."""
    plan_policy_rows: Hook | None = None
    """plan_policy_rows(TrainConfig, SamplerConfig) -> forward rows per sequence of one evaluation of one of
    `own_policy_logprobs` (what `dllm-ais plan` counts); None when the family owns none."""


FAMILY_MODULES = (
    "dllm_ais.models.llada.family",
    "dllm_ais.models.qwen.family",
    "dllm_ais.models.dream.family",
    "dllm_ais.models.sdar.family",
)
"""The registry: one line per family, the module holding its `FAMILY` record (in the order help text lists them)."""

FAMILIES: dict[str, Family] = {f.name: f for f in (importlib.import_module(m).FAMILY for m in FAMILY_MODULES)}
"""Every family by name."""


def get_family(name: str) -> Family:
    """The family called `name`; an unknown name is refused in one line listing the known ones."""
    if name not in FAMILIES:
        raise ValueError(f"model family {name!r} is unknown; use one of {', '.join(FAMILIES)}.")
    return FAMILIES[name]


def foreign_sampler_setting(family: Family, sampler) -> str | None:
    """One line naming a SamplerConfig setting another family owns that `sampler` sets for `family` — Dream's position
    rule (`position_rules`) or a field in another family's `sampler_fields` — or None."""
    if not family.position_rules and (sampler.dream_alg, sampler.dream_alg_temp) != (None, None):
        return (f"--dream-alg / --dream-alg-temp set Dream's position rule; {family.title}'s sampler has none: drop "
                "them.")
    for owner in FAMILIES.values():
        for name in owner.sampler_fields:
            if name not in family.sampler_fields and getattr(sampler, name, None) is not None:
                return (f"SamplerConfig.{name} is {owner.title}'s sampler setting; a {family.title} model has none: "
                        "drop it.")
    return None


def foreign_policy_logprob(family: Family, name: str) -> str | None:
    """One line when `--policy-logprob name` belongs to another family (`own_policy_logprobs`), or None."""
    for owner in FAMILIES.values():
        if owner is not family and name in owner.own_policy_logprobs:
            return (f"--policy-logprob {name} is built for {owner.title} models only; a {family.title} model does not "
                    "have it: pick another --policy-logprob.")
    return None


def family_of_config(data: dict) -> Family | None:
    """The family a config.json's fields name (`model_type`, then `architectures`), or None."""
    model_type, archs = data.get("model_type"), data.get("architectures") or []
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    for family in FAMILIES.values():
        if any(a in family.architectures for a in archs):
            return family
    return None


def family_of_model(model) -> Family | None:
    """The family of a loaded model (plain or peft-wrapped), from its config's `model_type`; None if unknown."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    return next((f for f in FAMILIES.values() if model_type in f.model_types), None)
