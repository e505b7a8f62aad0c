"""Frozen configuration dataclasses (one per component) and named presets.

Every field has a docstring; `__post_init__` rejects bad values with a message that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

REMASKING = ("low_confidence", "random")
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how."""

    path: str | None = None
    """Local LLaDA checkpoint directory (official layout). None = the tiny built-in model."""
    dtype: str = "float32"
    """Parameter dtype of the BF16 trainer copy: one of float32, bfloat16, float16, float64."""
    device: str = "cpu"
    """torch device string, e.g. cpu or cuda."""
    seed: int = 0
    """Seed for the tiny model's random initialisation (ignored when `path` is set)."""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype={self.dtype!r}: use one of {', '.join(DTYPES)}.")


@dataclass(frozen=True)
class SamplerConfig:
    """Masked-diffusion sampling (LLaDA `generate` semantics)."""

    gen_length: int = 32
    """Completion length L (tokens appended as masks after the prompt)."""
    block_length: int = 32
    """Semi-autoregressive block size; gen_length must be a multiple of it. block_length = gen_length: one block."""
    steps: int = 16
    """Total denoising steps, split evenly over the blocks; must be a multiple of the number of blocks."""
    temperature: float = 0.0
    """Gumbel-max temperature (float64); 0 = argmax (deterministic)."""
    remasking: str = "low_confidence"
    """Which masked positions to commit each step: low_confidence (highest softmax prob first) or random."""
    cfg_scale: float = 0.0
    """Classifier-free guidance scale; 0 disables it (one forward per step instead of two)."""

    def __post_init__(self):
        if self.gen_length < 1 or self.block_length < 1 or self.steps < 1:
            raise ValueError("gen_length, block_length and steps must all be >= 1.")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length={self.gen_length} is not a multiple of block_length={self.block_length}; "
                             "change one of them.")
        num_blocks = self.gen_length // self.block_length
        if self.steps % num_blocks:
            raise ValueError(f"steps={self.steps} must be a multiple of the number of blocks ({num_blocks} = "
                             f"gen_length/block_length).")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0.")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking={self.remasking!r}: use one of {', '.join(REMASKING)}.")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} must be >= 0.")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length


@dataclass(frozen=True)
class Preset:
    """A named bundle of component configs."""

    name: str
    """Preset name used on the command line (--preset)."""
    description: str
    """One line shown by `dllm-ais --help`."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model to load."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Sampling settings for rollouts and `dllm-ais sample`."""


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny-cpu", "Tiny built-in LLaDA on CPU (seconds); the embedded default.",
               ModelConfig(), SamplerConfig(gen_length=16, block_length=8, steps=8)),
        Preset("llada-8b-instruct", "LLaDA-8B-Instruct from a local directory (--model DIR), bf16 on GPU.",
               ModelConfig(path="GSAI-ML/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda"),
               SamplerConfig(gen_length=256, block_length=32, steps=128)),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`, or an error listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}.")
    return PRESETS[name]


def override(cfg, **changes):
    """`dataclasses.replace` that ignores None values and names unknown fields clearly."""
    known = {f.name for f in fields(cfg)}
    bad = set(changes) - known
    if bad:
        raise ValueError(f"{type(cfg).__name__} has no field(s) {sorted(bad)}; known: {sorted(known)}.")
    return replace(cfg, **{k: v for k, v in changes.items() if v is not None})
