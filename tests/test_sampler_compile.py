"""SamplerConfig.compile: the sampler's compiled per-step forward (CUDA only; ignored on CPU).

The compiled step takes the block's positions as an index tensor (one graph, and one CUDA graph, for every block);
on CPU we check that this index path gives the slice path's logits bit for bit and that compile=True changes nothing.
On a GPU the compiled rollout is compared with the eager one at T = 0.
"""

from __future__ import annotations

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.fp8.fused_llada import build_fused_llada
from dllm_ais.models.tiny import tiny_model
from dllm_ais.samplers import diffusion

MASK, EOS = 4, 1


def _prompts(device="cpu"):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 6), generator=g)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, :2] = False
    return ids.to(device), mask.to(device)


def test_compile_defaults_on_and_is_ignored_on_cpu():
    assert SamplerConfig().compile is True
    model = tiny_model(seed=0)
    ids, mask = _prompts()
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=1.0)
    runs = [diffusion.diffusion_sample(model, ids, mask, SamplerConfig(**{**cfg.__dict__, "compile": c}), MASK,
                                       (EOS,), torch.Generator().manual_seed(1)) for c in (True, False)]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].commit_step, runs[1].commit_step)


@pytest.mark.parametrize("fused", [False, True], ids=["master", "fused-bf16"])
def test_index_positions_equal_slice(fused):
    model = tiny_model(seed=1, dtype=torch.bfloat16)
    if fused:
        model = build_fused_llada(model, None)
    ids, mask = _prompts()
    x = torch.cat([ids, torch.full((3, 16), MASK)], dim=1)
    attn = torch.cat([mask, torch.ones(3, 16, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        by_slice = diffusion._logits(model, x, attn, 14, 22)
        positions = torch.arange(14, 22).expand(3, -1)
        by_index = diffusion._step(model, x, attn, positions).float()
    assert by_slice.shape == (3, 8, 128) and torch.equal(by_slice, by_index)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sampler compiles on CUDA only")
def test_compiled_step_matches_eager_on_cuda():
    """The compiled step's logits vs eager (inductor may skip an intermediate bf16 rounding: bf16-level bound), and a
    whole compiled rollout completes (every position committed, same shapes as eager)."""
    model = build_fused_llada(tiny_model(seed=2, dtype=torch.bfloat16).cuda(), None)
    ids, mask = _prompts("cuda")
    x = torch.cat([ids, torch.full((3, 16), MASK, device="cuda")], dim=1)
    attn = torch.cat([mask, torch.ones(3, 16, dtype=torch.bool, device="cuda")], dim=1)
    with torch.no_grad():
        for lo in (6, 14):  # two blocks: the same compiled graph serves both
            eager = diffusion._logits(model, x, attn, lo, lo + 8)
            compiled = diffusion._logits(model, x, attn, lo, lo + 8, compiled=True)
            torch.testing.assert_close(compiled, eager, atol=3e-2, rtol=3e-2)
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=1.0, compile=True)
    out = diffusion.diffusion_sample(model, ids, mask, cfg, MASK, (EOS,), torch.Generator("cuda").manual_seed(0))
    assert out.completion_ids.shape == (3, 16) and (out.commit_step >= 0).all()
