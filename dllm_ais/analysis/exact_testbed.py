"""The enumerable testbed of the exact-gradient analysis: a tiny small-vocabulary LLaDA (and Qwen), a shift task with
a reward on every completion, SFT checkpoints along the way, and the rollout copies μ.

Vocabulary: V_c content tokens 0 … V_c − 1, plus (LLaDA) the mask token V_c. A prompt is P content tokens; a
completion is L content tokens, so there are V_c^L completions per prompt (4^4 = 256 at the defaults) and every one
of them can be enumerated. The task is the digits study's shift: the answer at completion position t is
(x_{t mod P} + 1) mod V_c, and the reward is the fraction of the L positions right, in {0, 1/L, …, 1} — defined on
every completion (no format to get wrong), with L + 1 levels so group advantages have a closed form.

Rollout copies μ of a model (the "BF16" master π_old here is the fp32 tiny model, as on every CPU testbed):
`fp8` (e4m3 W8A8, blockwise, torch reference backend), `nvfp4`, `mxfp4` (emulated W4A4), and the synthetic
`mxfp4-w-α`: the master with every block linear's weight moved to W + α (Q(W) − W), Q = MXFP4 quantise-dequantise,
activations untouched — a weight-only perturbation whose size α scales (α = 1: the MXFP4 weights; α > 1 extrapolates).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import torch

from dllm_ais.models.tiny import tiny_model


@dataclass(frozen=True)
class TestbedConfig:
    """The enumerable task and model."""

    __test__ = False  # not a pytest class

    vocab: int = 4
    """V_c: content tokens (the LLaDA mask token is V_c itself). Completions per prompt: V_c ** gen_length."""
    prompt_len: int = 4
    """P: content tokens per prompt (the one-step surrogate enumerates all 2^P prompt masks)."""
    gen_length: int = 4
    """L: completion tokens; the sampler commits one per step (steps = L, one block)."""
    num_prompts: int = 4
    """Prompts of the analysis (drawn once, uniformly from the V_c^P possible ones, without repeats)."""
    d_model: int = 64
    """Width of the tiny models (a multiple of 16, as the FP8 copy needs)."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads."""
    mlp: int = 128
    """MLP hidden width (multiple of 16)."""
    seed: int = 0
    """Seeds the weights, the prompt draw and the SFT batches."""

    def __post_init__(self):
        if self.vocab < 2 or self.prompt_len < 1 or self.gen_length < 1:
            raise ValueError(f"TestbedConfig: vocab={self.vocab} must be >= 2, prompt_len={self.prompt_len} and "
                             f"gen_length={self.gen_length} >= 1.")
        if self.num_prompts > self.vocab ** self.prompt_len:
            raise ValueError(f"TestbedConfig.num_prompts={self.num_prompts} exceeds the {self.vocab ** self.prompt_len}"
                             " distinct prompts; lower it or raise prompt_len.")
        if self.d_model % 16 or self.mlp % 16:
            raise ValueError(f"TestbedConfig: d_model={self.d_model} and mlp={self.mlp} must be multiples of 16 "
                             "(the FP8 copy's layer shapes).")

    @property
    def mask_id(self) -> int:
        return self.vocab


def all_sequences(vocab: int, length: int) -> torch.Tensor:
    """Every sequence of `length` tokens over range(vocab), [vocab ** length, length] long; row k is k written in base
    `vocab` with position 0 the least significant digit."""
    rows = list(itertools.product(range(vocab), repeat=length))  # last position varies fastest
    return torch.tensor([r[::-1] for r in rows], dtype=torch.long).reshape(-1, length)


def sequence_index(seqs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Inverse of `all_sequences`: [..., L] tokens -> [...] row index Σ_t y_t · vocab^t."""
    powers = vocab ** torch.arange(seqs.shape[-1], device=seqs.device)
    return (seqs * powers).sum(-1)


def answers(prompts: torch.Tensor, gen_length: int, vocab: int) -> torch.Tensor:
    """The shift task's answer: y*_t = (x_{t mod P} + 1) mod V_c. prompts [n, P] -> [n, L]."""
    P = prompts.shape[1]
    return (prompts[:, torch.arange(gen_length) % P] + 1) % vocab


def rewards(prompts: torch.Tensor, completions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Fraction of positions equal to the answer: prompts [n, P], completions [K, L] -> [n, K] float64."""
    target = answers(prompts, completions.shape[1], vocab)  # [n, L]
    return (completions[None] == target[:, None]).double().mean(-1)


def draw_prompts(cfg: TestbedConfig) -> torch.Tensor:
    """[num_prompts, P]: distinct prompts drawn with the config's seed."""
    g = torch.Generator().manual_seed(cfg.seed)
    pick = torch.randperm(cfg.vocab ** cfg.prompt_len, generator=g)[: cfg.num_prompts]
    return all_sequences(cfg.vocab, cfg.prompt_len)[pick]


def make_llada(cfg: TestbedConfig):
    """The tiny LLaDA over V_c + 1 tokens (the last is the mask), fp32, eval mode."""
    V = cfg.vocab + 1
    return tiny_model(seed=cfg.seed, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                      mlp_hidden_size=cfg.mlp, vocab_size=V, embedding_size=V, max_sequence_length=64,
                      mask_token_id=cfg.mask_id, eos_token_id=0, pad_token_id=0, bos_token_id=0, eot_token_id=0)


def make_dream(cfg: TestbedConfig):
    """The tiny Dream over V_c + 1 tokens (the last is the mask; shifted logits), fp32, eval mode."""
    from dllm_ais.models.tiny import tiny_dream_model

    return tiny_dream_model(seed=cfg.seed, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                            num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                            intermediate_size=cfg.mlp, vocab_size=cfg.vocab + 1, max_position_embeddings=64,
                            mask_token_id=cfg.mask_id, eos_token_id=0, pad_token_id=0, bos_token_id=0)


SDAR_BLOCK = 2
"""Block length of the tiny SDAR (L must be a multiple of it); its sampler runs steps = L, one commit per step."""


class PrefixedSDAR(torch.nn.Module):
    """The testbed's SDAR: one fixed content token (`prefix`, 0) before every prompt, so that [prefix, x] (P = 1)
    fills SDAR's first block of 2 and the completion's blocks are whole blocks of the canvas (SDAR's blocks count
    from column 0, generate.py:79-93). Every analysis call passes [n, P + L] rows and positions from P, as for LLaDA;
    the prefix is added here and the positions moved by one. `inner` is the SDARModel (the sampler's model)."""

    shifted_logits = False

    def __init__(self, inner, prefix: int = 0):
        super().__init__()
        self.inner, self.prefix = inner, prefix

    @property
    def config(self):
        return self.inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def with_prefix(self, ids: torch.Tensor) -> torch.Tensor:
        """[n, P] prompts -> [n, 1 + P] (the sampler's prompts)."""
        return torch.cat([ids.new_full((ids.shape[0], 1), self.prefix), ids], 1)

    def forward(self, input_ids: torch.Tensor, positions=None, **kwargs):
        if kwargs.get("attention_mask") is not None or kwargs.get("kv_cache") is not None:
            raise ValueError("PrefixedSDAR takes whole unpadded canvases; sample with `.inner` and `with_prefix`.")
        if isinstance(positions, slice):
            positions = slice(None if positions.start is None else positions.start + 1,
                              None if positions.stop is None else positions.stop + 1)
        elif positions is not None:
            positions = positions + 1
        return self.inner(input_ids=self.with_prefix(input_ids), positions=positions)


def make_sdar(cfg: TestbedConfig):
    """The tiny SDAR over V_c + 1 tokens (the last is the mask; unshifted logits, block-causal attention in blocks of
    SDAR_BLOCK), behind the one-token prefix of `PrefixedSDAR`, fp32, eval mode. Needs prompt_len = 1 (the prefix
    and the prompt fill one block) and L a multiple of SDAR_BLOCK."""
    from dllm_ais.models.sdar.tiny import tiny_sdar_model

    if cfg.prompt_len + 1 != SDAR_BLOCK or cfg.gen_length % SDAR_BLOCK:
        raise ValueError(f"the SDAR testbed needs prompt_len = {SDAR_BLOCK - 1} and gen_length a multiple of "
                         f"{SDAR_BLOCK} (prompt_len={cfg.prompt_len}, gen_length={cfg.gen_length}).")
    inner = tiny_sdar_model(seed=cfg.seed, vocab_size=cfg.vocab + 1, hidden_size=cfg.d_model,
                            intermediate_size=cfg.mlp, num_hidden_layers=cfg.n_layers,
                            num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                            head_dim=cfg.d_model // cfg.n_heads, max_position_embeddings=64, block_size=SDAR_BLOCK,
                            mask_token_id=cfg.mask_id, eos_token_id=0, pad_token_id=0, bos_token_id=0)
    return PrefixedSDAR(inner).eval()


def make_qwen(cfg: TestbedConfig):
    """The tiny Qwen3 over the V_c content tokens only (no BOS: the prompt's first token starts the sequence)."""
    from dllm_ais.models.qwen.model import tiny_qwen

    return tiny_qwen(seed=cfg.seed, vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.mlp,
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                     head_dim=cfg.d_model // cfg.n_heads, max_position_embeddings=64, pad_token_id=0, eos_token_id=0,
                     bos_token_id=0)


def _diffusion_sft_loss(model, prompts, targets, mask_id, g):
    from dllm_ais.train.sft import sft_loss

    return sft_loss(model, prompts, torch.ones_like(prompts, dtype=torch.bool), targets, mask_id, g)


def _ar_sft_loss(model, prompts, targets, mask_id, g):
    ids = torch.cat([prompts, targets], 1)
    logits = model(input_ids=ids).logits[:, prompts.shape[1] - 1:-1]  # [B, L, V] predicting each target token
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _sdar_sft_loss(model, prompts, targets, mask_id, g):
    from dllm_ais.models.sdar.likelihood import sft_loss

    x = model.with_prefix(prompts)
    return sft_loss(model.inner, x, torch.ones_like(x, dtype=torch.bool), targets, mask_id, SDAR_BLOCK, g)


SFT_LOSSES = {"llada": _diffusion_sft_loss, "dream": _diffusion_sft_loss, "qwen": _ar_sft_loss,
              "sdar": _sdar_sft_loss}


def sft_checkpoints(model, cfg: TestbedConfig, steps: tuple[int, ...], family: str = "llada", lr: float = 3e-3,
                    batch_size: int = 64, lengths: tuple[int, ...] | None = None) -> dict[int, dict]:
    """Supervised fine-tuning on the shift task over all V_c^P prompts (AdamW, constant lr), with a state_dict copy
    at each step in `steps` (0 = the random initialisation). `lengths`: completion lengths drawn per batch (one model
    for the length sweep); default (cfg.gen_length,). The model is left at the last checkpoint, in eval mode."""
    lengths = lengths or (cfg.gen_length,)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    prompts = all_sequences(cfg.vocab, cfg.prompt_len)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    out = {}
    model.train()
    for step in range(max(steps) + 1):
        if step in steps:
            out[step] = copy.deepcopy(model.state_dict())
        if step == max(steps):
            break
        rows = prompts[torch.randint(len(prompts), (batch_size,), generator=g)]
        L = lengths[int(torch.randint(len(lengths), (1,), generator=g))]
        loss = SFT_LOSSES[family](model, rows, answers(rows, L, cfg.vocab), cfg.mask_id, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return out


def synthetic_mxfp4(model, alpha: float):
    """The labelled synthetic μ_α: a copy whose block linears have W + α (Q(W) − W) (Q = MXFP4 round trip), LM head,
    embeddings and norms unchanged, activations unquantised. α = 0 is the master itself."""
    from dllm_ais.fp4.linear import FORMATS
    from dllm_ais.fp8.walker import quantizable_layers

    mu = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.no_grad():
        for _, layer in quantizable_layers(mu).items():
            w = layer.weight
            w.add_(alpha * (FORMATS["mxfp4"].fake_weight(w.float()).to(w.dtype) - w))
    return mu


def rollout_copy(model, precision: str):
    """μ for a precision name: fp8 | nvfp4 | mxfp4 | mxfp4-w-<α> (synthetic) | bf16 (the master itself)."""
    if precision == "bf16":
        return model
    if precision == "fp8":
        from dllm_ais.fp8.quantize import quantize_model

        return quantize_model(model, backend="torch")
    if precision in ("nvfp4", "mxfp4"):
        from dllm_ais.fp4.linear import quantize_model

        return quantize_model(model, fmt=precision)
    if precision.startswith("mxfp4-w-"):
        return synthetic_mxfp4(model, float(precision.removeprefix("mxfp4-w-")))
    raise ValueError(f"unknown rollout precision {precision!r}: use bf16, fp8, nvfp4, mxfp4 or mxfp4-w-<alpha>.")
