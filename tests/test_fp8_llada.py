"""The FP8 rollout copy of the real LLaDA module tree: what is quantised, how close it stays to BF16, sampling, sync.

Setup (fixed seeds): the tiny LLaDA `tiny_model(seed=0)` (d_model 128, 2 blocks, random N(0, 0.02²) weights) in
float32 and in bf16, its FP8 copy `quantize_model(model, backend="torch")`, a batch of B = 16 left-padded random
prompts (4–16 tokens) and L = 32-token completions sampled from the FP8 copy at temperature 1 (the tokens at which RL
evaluates log π_old − log μ). Sampler: blocks of 8, 16 steps.

mean |Δ log p| per token: log-softmax of the completion logits gathered at the completion tokens, BF16 model vs its
FP8 copy on the same input, averaged over the B·L tokens. Two inputs: every completion token masked (d1's one-step
estimator) and a random half masked (an ELBO draw; averaged over the masked tokens only). Measured (torch 2.13, CPU):
    float32  all masked 1.11e-2, half masked 1.05e-2;   bf16  all masked 1.15e-2, half masked 1.19e-2
(model seeds 0–3, both dtypes: 0.98e-2 – 1.31e-2). Bound DLOGP_MAX = 0.03. For scale: the bf16 cast of the float32
model alone gives 1.1e-3, and DLOGP_MIN = 2e-3 checks that the FP8 path is really in effect.

Temperature-0 agreement of the FP8 and BF16 completions (fraction of the B·L tokens equal), measured: float32 0.797,
bf16 0.744 (model seeds 0–3: 0.58–0.80). The random model's predictions are nearly uniform (mean −log p ≈ 4.87 vs
log 128 = 4.85), so near-ties flip, and one flipped token changes later decisions of its row (attention is
bidirectional): even the bf16 cast of the float32 model agrees with it on only 0.68–0.88 of the tokens. The
precision-only measure is the per-decision agreement: argmax of the FP8 copy vs BF16 at every still-masked
completion position of every canvas along the BF16 trajectory, measured float32 0.866, bf16 0.924 (seeds 0–3:
0.72–0.92; bf16 cast vs float32: 0.975–0.990). Bounds, below every measured value: AGREE_MIN = 0.55 (end to end, a
majority of tokens), DECISION_AGREE_MIN = 0.7.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dllm_ais.config import SamplerConfig
from dllm_ais.fp8 import FP8Linear, quantize_model, sync_weights
from dllm_ais.models.llada.fused_fp8 import FUSED_PARTS
from dllm_ais.models.llada.model import LORA_TARGETS
from dllm_ais.models.tiny import tiny_model
from dllm_ais.samplers.diffusion import diffusion_sample

MASK, EOS = 4, 1
B, P, L = 16, 16, 32
DLOGP_MAX = 0.03
DLOGP_MIN = 2e-3
AGREE_MIN = 0.55
DECISION_AGREE_MIN = 0.7
DTYPES = [torch.float32, torch.bfloat16]


def _prompts(seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts: ids [B, P] (character tokens 5..100, EOS padding), mask [B, P] bool."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 101, (B, P), generator=g)
    lengths = torch.randint(4, P + 1, (B,), generator=g)
    mask = torch.arange(P)[None, :] >= (P - lengths)[:, None]
    return torch.where(mask, ids, EOS), mask


def _sample(model, temperature: float, seed: int = 0):
    ids, mask = _prompts()
    cfg = SamplerConfig(gen_length=L, block_length=8, steps=16, temperature=temperature)
    return diffusion_sample(model, ids, mask, cfg, MASK, (EOS,), torch.Generator().manual_seed(seed))


@torch.no_grad()
def _completion_logprobs(model, completion: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """log p(completion_j | prompt, completion with `masked` positions replaced by MASK) -> [B, L] float32."""
    ids, mask = _prompts()
    x = torch.cat([ids, torch.where(masked, MASK, completion)], dim=1)  # [B, P + L]
    attn = torch.cat([mask, torch.ones_like(masked)], dim=1)
    logits = model(x, attention_mask=attn, positions=slice(P, None)).logits.float()  # [B, L, V]
    return logits.log_softmax(-1).gather(-1, completion[..., None]).squeeze(-1)


class _SideBySide:
    """A sampler 'model' that returns `ref`'s logits (so the trajectory is ref's) and counts how often `other`'s argmax
    agrees with ref's at the still-masked completion positions of every canvas."""

    def __init__(self, ref, other):
        self.ref, self.other, self.agree, self.total = ref, other, 0, 0

    def __call__(self, input_ids, attention_mask=None, positions=None):
        out = self.ref(input_ids, attention_mask=attention_mask, positions=positions)
        other = self.other(input_ids, attention_mask=attention_mask, positions=positions)
        masked = input_ids[:, positions] == MASK  # [B, L]
        same = out.logits.argmax(-1) == other.logits.argmax(-1)  # [B, L]
        self.agree += int(same[masked].sum())
        self.total += int(masked.sum())
        return out


@pytest.fixture(scope="module", params=DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def pair(request):
    """(BF16-side model in the given dtype, its FP8 copy)."""
    model = tiny_model(seed=0, dtype=request.param)
    return model, quantize_model(model, backend="torch")


@pytest.fixture(scope="module")
def rollouts(pair):
    """Completions of the BF16 model at T = 0 and of its FP8 copy at T = 0 and T = 1 (same prompts), and the
    per-decision agreement."""
    model, fp8 = pair
    side = _SideBySide(model, fp8)
    out = {("bf16", 0.0): _sample(side, 0.0), ("fp8", 0.0): _sample(fp8, 0.0), ("fp8", 1.0): _sample(fp8, 1.0)}
    return out, side.agree / side.total  # side's trajectory is BF16's own (it returns the BF16 logits)


# ----------------------------------------------------------------------------------------------------------------------
# structure


def test_block_linears_are_fp8_head_and_embeddings_stay(pair):
    """The copy is the fused rollout model (models/llada/fused_fp8.py): per block qkv [3d, d], attn_out, gate_up [2h,
    d] and ff_out are FP8Linears; embeddings, norms and the LM head keep the master's dtype and values. (Adapted from
    the unfused structure, where each of the 7 block linears was its own FP8Linear.)"""
    model, fp8 = pair
    assert len(LORA_TARGETS) == 7
    expected = {f"blocks.{i}.{name}" for i in range(model.config.n_layers) for name in FUSED_PARTS}
    assert {n for n, m in fp8.named_modules() if isinstance(m, FP8Linear)} == expected
    assert type(fp8.lm_head) is nn.Linear and fp8.get_output_embeddings() is fp8.lm_head  # the LM head
    assert type(fp8.wte) is nn.Embedding
    assert not any(isinstance(m, FP8Linear) for m in model.modules())  # the master is untouched
    t = model.model.transformer
    pairs = [(fp8.wte.weight, t.wte.weight), (fp8.ln_f.weight, t.ln_f.weight), (fp8.lm_head.weight, t.ff_out.weight)]
    for block, master_block in zip(fp8.blocks, t.blocks, strict=True):
        pairs += [(block.attn_norm.weight, master_block.attn_norm.weight),
                  (block.ff_norm.weight, master_block.ff_norm.weight)]
    for copied, source in pairs:
        assert copied.dtype == source.dtype and torch.equal(copied, source)
    d, h = model.config.d_model, model.config.mlp_hidden_size
    blk = fp8.blocks[0]
    assert blk.qkv.weight_q.dtype == torch.float8_e4m3fn and (blk.qkv.out_features, blk.qkv.in_features) == (3 * d, d)
    assert (blk.gate_up.out_features, blk.gate_up.in_features) == (2 * h, d)
    assert (blk.ff_out.out_features, blk.ff_out.in_features) == (d, h)


# ----------------------------------------------------------------------------------------------------------------------
# closeness of the log-probabilities


@pytest.mark.parametrize("masking", ["all", "half"])
def test_mean_abs_logprob_difference_per_token(pair, rollouts, masking):
    model, fp8 = pair
    completion = rollouts[0]["fp8", 1.0].completion_ids  # [B, L], μ's own samples
    if masking == "all":
        masked = torch.ones(B, L, dtype=torch.bool)
    else:
        masked = torch.rand(B, L, generator=torch.Generator().manual_seed(7)) < 0.5
    delta = (_completion_logprobs(model, completion, masked) - _completion_logprobs(fp8, completion, masked)).abs()
    mean_abs = delta[masked].mean().item()
    assert DLOGP_MIN < mean_abs < DLOGP_MAX, f"mean |Δ log p| per token = {mean_abs:.3e}"


# ----------------------------------------------------------------------------------------------------------------------
# sampling end to end


def test_fp8_copy_samples_end_to_end(rollouts):
    out = rollouts[0]
    ref = out["bf16", 0.0]
    for temperature in (1.0, 0.0):
        fp8 = out["fp8", temperature]
        for field in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "commit_step"):
            assert getattr(fp8, field).shape == getattr(ref, field).shape, field
        assert fp8.completion_ids.shape == (B, L) and fp8.num_steps == ref.num_steps == 16
        assert (fp8.commit_step >= 0).all()  # every completion position was committed
        # No mask token is left. At T = 1 the random model itself samples the mask id now and then (p ≈ 1/V; a trained
        # LLaDA never proposes it and the sampler does not forbid it), so there a few committed ones may appear.
        left = (fp8.completion_ids == MASK).float().mean().item()
        assert left == 0.0 if temperature == 0 else left < 0.01
    assert not (ref.completion_ids == MASK).any() and (ref.commit_step >= 0).all()


def test_temperature_zero_agreement(rollouts):
    out, decision_agreement = rollouts
    agreement = (out["fp8", 0.0].completion_ids == out["bf16", 0.0].completion_ids).float().mean().item()
    assert agreement >= AGREE_MIN, f"T=0 token agreement {agreement:.3f}"
    assert decision_agreement >= DECISION_AGREE_MIN, f"per-decision argmax agreement {decision_agreement:.3f}"


# ----------------------------------------------------------------------------------------------------------------------
# weight sync


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_sync_after_an_optimizer_step_equals_a_fresh_quantisation(dtype):
    master = tiny_model(seed=2, dtype=dtype)
    rollout = quantize_model(master, backend="torch")
    buffers = dict(rollout.named_buffers())
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    ids, mask = _prompts()
    x = torch.cat([ids, torch.full((B, L), MASK)], dim=1)
    attn = torch.cat([mask, torch.ones(B, L, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        stale = rollout(x, attention_mask=attn).logits

    g = torch.Generator().manual_seed(3)
    target = torch.randint(5, 101, (B, L), generator=g)
    master.train()
    optimizer = torch.optim.AdamW(master.parameters(), lr=1e-3)
    logits = master(x, attention_mask=attn, positions=slice(P, None)).logits.float()  # [B, L, V]
    nn.functional.cross_entropy(logits.transpose(1, 2), target).backward()
    optimizer.step()
    master.eval()

    sync_weights(master, rollout)
    fresh = quantize_model(master, backend="torch")
    with torch.no_grad():
        synced, expected = rollout(x, attention_mask=attn).logits, fresh(x, attention_mask=attn).logits
    assert torch.equal(synced, expected)
    assert not torch.equal(synced, stale)
    fresh_state = fresh.state_dict()
    for name, tensor in rollout.state_dict().items():  # codes, scales, embeddings, norms and head: bit-equal
        assert torch.equal(tensor.view(torch.uint8), fresh_state[name].view(torch.uint8)), name
        assert tensor.data_ptr() == ptrs[name], f"{name} was reallocated"
    assert dict(rollout.named_buffers()).keys() == buffers.keys()
