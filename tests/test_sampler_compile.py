"""SamplerConfig.compile: the sampler's compiled per-step forward (CUDA only; ignored on CPU).

The compiled step takes the block's positions as an index tensor (one graph, and one CUDA graph, for every block);
on CPU we check that this index path gives the slice path's logits bit for bit and that compile=True changes nothing.
On a GPU the compiled rollout is compared with the eager one at T = 0.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.llada.fused_fp8 import build_fused_llada
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


def _batch(P: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (2, P), generator=g)
    mask = torch.ones(2, P, dtype=torch.bool)
    mask[0, :2] = False
    return ids, mask


@pytest.fixture
def compile_on_cpu(monkeypatch):
    """DLLM_AIS_COMPILE_CPU=1 (inductor on CPU, mode="default"), with dynamo's caches and counters fresh."""
    monkeypatch.setenv("DLLM_AIS_COMPILE_CPU", "1")
    monkeypatch.setattr(diffusion, "_GAVE_UP", set())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    diffusion._compiled_step.cache_clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()
    diffusion._compiled_step.cache_clear()


def test_pad_prompts_to_bucket():
    ids, mask = _batch(5, 0)
    pids, pmask = diffusion.pad_prompts_to_bucket(ids, mask, pad_id=4)
    assert pids.shape == (2, 64) and torch.equal(pids[:, -5:], ids) and torch.equal(pmask[:, -5:], mask)
    assert not pmask[:, :59].any() and (pids[:, :59] == 4).all()
    same = diffusion.pad_prompts_to_bucket(*_batch(64, 0), pad_id=4)
    assert same[0].shape == (2, 64)


@pytest.mark.slow
def test_compiled_sampler_does_not_recompile_across_prompt_lengths_and_warns_when_dynamo_gives_up(compile_on_cpu):
    """Two batches with prompt lengths 5 and 9 share one bucket (64): the second compiles nothing (no new frame, no
    new graph) and equals eager sampling; a third batch in another bucket with recompile_limit 1 makes dynamo give
    up, which warns and falls back to eager (same tokens) instead of failing or going quiet."""
    counters = compile_on_cpu
    model = tiny_model(seed=0, n_layers=1)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.0, compile=True)
    eager_cfg = SamplerConfig(**{**cfg.__dict__, "compile": False})
    first = diffusion.diffusion_sample(model, *_batch(5, 0), cfg, MASK, (EOS,))
    frames, graphs = counters["frames"]["total"], counters["stats"]["unique_graphs"]
    assert frames >= 1 and graphs >= 1
    second = diffusion.diffusion_sample(model, *_batch(9, 1), cfg, MASK, (EOS,))
    assert counters["frames"]["total"] == frames and counters["stats"]["unique_graphs"] == graphs, "recompiled"
    for out, batch in ((first, _batch(5, 0)), (second, _batch(9, 1))):
        eager = diffusion.diffusion_sample(model, *batch, eager_cfg, MASK, (EOS,))
        assert torch.equal(out.completion_ids, eager.completion_ids)
        assert out.prompt_ids.shape == batch[0].shape  # the bucket padding is not returned
        torch.testing.assert_close(out.logp_rollout, eager.logp_rollout, atol=1e-5, rtol=0)
    with torch._dynamo.config.patch(recompile_limit=1), pytest.warns(RuntimeWarning, match="gave up"):
        third = diffusion.diffusion_sample(model, *_batch(70, 2), cfg, MASK, (EOS,))
    assert counters["stats"]["unique_graphs"] == graphs
    eager = diffusion.diffusion_sample(model, *_batch(70, 2), eager_cfg, MASK, (EOS,))
    assert torch.equal(third.completion_ids, eager.completion_ids)


@pytest.mark.slow
def test_compiled_prefix_cache_keeps_one_graph_per_window_shape(compile_on_cpu):
    """The prefix cache needs a refresh graph and one window graph per block (the window shrinks block by block):
    with recompile_limit 1 the sampler's scaled limit still compiles them all without giving up, the second prompt
    length compiles nothing, and tokens / NFE / log-probs equal eager sampling."""
    counters = compile_on_cpu
    model = tiny_model(seed=0, n_layers=1)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, compile=True, cache="prefix", threshold=0.3)
    eager_cfg = SamplerConfig(**{**cfg.__dict__, "compile": False})
    with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        outs = [diffusion.diffusion_sample(model, *_batch(P, P), cfg, MASK, (EOS,)) for P in (5, 9)]
    assert counters["stats"]["unique_graphs"] == 3  # refresh + the windows of blocks 0 and 1
    for out, P in zip(outs, (5, 9), strict=True):
        eager = diffusion.diffusion_sample(model, *_batch(P, P), eager_cfg, MASK, (EOS,))
        assert torch.equal(out.completion_ids, eager.completion_ids) and out.nfe == eager.nfe
        torch.testing.assert_close(out.logp_rollout, eager.logp_rollout, atol=1e-5, rtol=0)
