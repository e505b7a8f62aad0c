"""The fused SDAR rollout copy (models/sdar/fused_fp8.py: q/k/v with GQA stacked, gate/up stacked, per-head q/k RMSNorm
in the producers): equal to its torch twin — the per-Linear copy (fp8/quantize.py with an `exclude`; fp4/linear.py) —
in FP8 and emulated FP4, the BF16 fused copy equal to the master, the Triton producers (interpreter) equal to the
torch twins, synced in place after an optimizer step exactly as a fresh quantisation, KV cache windows, LoRA merged,
and SDAR's sampler (native KV cache) drawing the same tokens from the fused copy as from the per-Linear one.

Measured (torch 2.13 CPU, triton 3.9 interpreter): every logit comparison below is bit-equal in float32 and bf16,
with the torch and the Triton producers alike (the wider fused GEMM sums in the same order at these shapes); the
qk_norm_rope kernel alone is bit-equal to its twin in bf16 and within 4.8e-7 in float32 (its sum of squares runs in
another order than torch's mean). The norm weights are drawn away from 1 so that a copy that skipped or misplaced
q_norm / k_norm would differ.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dllm_ais.fp4.linear import FORMATS, FP4Linear
from dllm_ais.fp4.linear import quantize_model as quantize_fp4
from dllm_ais.fp8 import FP8Linear, available_backends, producers, quant, quantize_model, sync_weights
from dllm_ais.fp8.walker import canonical_name, linear_layers
from dllm_ais.models.gqa import rope_tables, rotate
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.sdar.fused_fp8 import FUSED_PARTS, FusedSDAR, build_fused_sdar, sync_per_tensor
from dllm_ais.models.sdar.model import SDARRMSNorm, lora_target_regex, two_stream_logits
from dllm_ais.models.sdar.tiny import tiny_sdar_model

DTYPES = [torch.float32, torch.bfloat16]
# q: 4 heads × 32 = 128 rows; k, v: 2 × 32 = 64 rows each (padded to 128 in the FP8 weight); h = 144 (ragged)
SHAPE = dict(hidden_size=128, intermediate_size=144, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def _master(dtype=torch.float32, seed=0, **kw):
    model = tiny_sdar_model(seed=seed, dtype=dtype, std=0.2, **{**SHAPE, **kw})
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if "norm" in name:  # every RMSNorm scale drawn away from 1 (q_norm / k_norm included)
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    return model


def _canvas():
    """Two rows, the first left-padded by one whole block (SDAR's batched layout), 12 positions."""
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[0, :4] = False
    return ids, keep


@torch.no_grad()
def _logits(model, ids, keep):
    return model(ids, keep).logits


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_fused_fp8_and_bf16_copies_equal_their_torch_twins(dtype):
    master = _master(dtype)
    ids, keep = _canvas()
    fused, unfused = quantize_model(master, "torch"), quantize_model(master, "torch", exclude=lambda n: False)
    assert isinstance(fused, FusedSDAR) and fused.variant == "fp8_producers" and fused.producers == "torch"
    assert sum(isinstance(m, FP8Linear) for m in fused.modules()) == 8 and not isinstance(unfused, FusedSDAR)
    assert fused.layers[0].qkv.out_features == 3 * 128  # q 128 + k, v padded from 64 to 128
    got, ref = _logits(fused, ids, keep), _logits(master, ids, keep)
    assert torch.equal(got, _logits(unfused, ids, keep))
    assert (got.float() - ref.float()).abs().max() > 1e-2  # the FP8 path is in effect
    assert torch.equal(_logits(build_fused_sdar(master, None), ids, keep), ref)  # BF16 fused copy = the master
    # the two-stream training forward (explicit 4-D mask, position ids: the ELBO and the mismatch ratio score with it)
    noisy = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(4)) < 0.5, master.mask_token_id,
                        ids)
    with torch.no_grad():
        two = [two_stream_logits(m, noisy, ids, keep, block_length=4, noisy_from=4) for m in (fused, unfused)]
    assert torch.equal(*two)


def test_qk_norm_rope_twin_equals_sdar_q_norm_then_rotate():
    for dtype in DTYPES:
        g = torch.Generator().manual_seed(5)
        x = (torch.randn(2, 5, 3, 4, 32, generator=g) * 3).to(dtype)[:, :, 1]  # [B, T, H, D] strided view
        norm = SDARRMSNorm(32, 1e-6).to(dtype)
        norm.weight.data.copy_(1.0 + 0.3 * torch.randn(32, generator=g))
        cos, sin = rope_tables(torch.randint(0, 4000, (2, 5), generator=g), 32, 1e6, dtype)  # [B, 1, T, D]
        twin = producers.qk_norm_rope(x, norm.weight, 1e-6, cos[:, 0, :, :16], sin[:, 0, :, :16])
        assert torch.equal(twin, rotate(norm(x).transpose(1, 2), cos, sin))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_qk_norm_rope_kernel_equals_its_twin(dtype):
    if "triton" not in available_backends("cpu"):
        pytest.skip("triton (interpreter) is not available")
    from dllm_ais.fp8 import ops

    g = torch.Generator().manual_seed(6)
    for B, T, H, D in [(2, 5, 4, 32), (1, 37, 3, 16)]:  # 37: a partial block of positions
        x = (torch.randn(B, T, 3, H, D, generator=g) * 3).to(dtype)[:, :, 2]
        w = (1.0 + 0.3 * torch.randn(D, generator=g)).to(dtype)
        cos, sin = (t[:, 0, :, :D // 2].contiguous() for t in rope_tables(torch.randint(0, 4000, (B, T), generator=g),
                                                                          D, 1e6, dtype))
        got, twin = ops.qk_norm_rope(x, w, 1e-6, cos, sin), producers.qk_norm_rope(x, w, 1e-6, cos, sin)
        assert got.shape == (B, H, T, D) and got.is_contiguous()
        if dtype == torch.bfloat16:  # one bf16 ulp at most (measured: bit-equal)
            torch.testing.assert_close(got, twin, rtol=2.0**-7, atol=1e-2)
        else:  # the sum of squares in another order: a few fp32 ulps of values ≲ 8 (measured ≤ 4.8e-7)
            torch.testing.assert_close(got, twin, rtol=0, atol=2e-6)


def test_triton_producers_equal_torch_twins_in_the_fused_copy():
    """The fused FP8 copy on the torch GEMM with the Triton producers (interpreter; what every backend gets on CUDA)
    against the same copy on the torch twins, bf16, one layer of a ragged shape."""
    if "triton" not in available_backends("cpu"):
        pytest.skip("triton (interpreter) is not available")
    master = _master(torch.bfloat16, num_hidden_layers=1, hidden_size=80, intermediate_size=144,
                     num_attention_heads=5, num_key_value_heads=1, head_dim=16)
    ids, keep = _canvas()
    twin = _logits(build_fused_sdar(master, "torch", producers="torch"), ids, keep)
    kernels = build_fused_sdar(master, "torch", producers="triton")
    assert kernels.producers == "triton" and kernels.variant == "fp8_producers"
    got = _logits(kernels, ids, keep)
    # codes one e4m3 step at most apart (producer_kernels.py's bound): far below the FP8 error (measured: bit-equal)
    fp8_error = (twin.float() - _logits(master, ids, keep).float()).abs().mean()
    assert (got.float() - twin.float()).abs().mean() <= 0.1 * fp8_error


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fused_fp4_copy_equals_the_per_linear_copy(fmt):
    master = _master()
    ids, keep = _canvas()
    fused, unfused = quantize_fp4(master, fmt), quantize_fp4(master, fmt, exclude=lambda n: False)
    assert isinstance(fused, FusedSDAR) and fused.variant == "plain"
    assert sum(isinstance(m, FP4Linear) for m in fused.modules()) == 8 and not isinstance(unfused, FusedSDAR)
    layers = {canonical_name(n, False): m for n, m in linear_layers(master).items()}
    for i, layer in enumerate(fused.layers):  # each part quantised as its own matrix (NVFP4: the part's tensor scale)
        for part in FUSED_PARTS:
            for name, offset in layer.part_offsets(part):
                w = layers[f"model.layers.{i}.{name}"].weight
                assert torch.equal(getattr(layer, part).weight_dq[offset:offset + w.shape[0]],
                                   FORMATS[fmt].fake_weight(w)), name
    got = _logits(fused, ids, keep)
    assert torch.equal(got, _logits(unfused, ids, keep))
    assert (got - _logits(master, ids, keep)).abs().max() > 1e-2


def _step(master, ids, keep):
    """One AdamW step on a cross-entropy of the master's logits."""
    master.train()
    opt = torch.optim.AdamW(master.parameters(), lr=1e-2)
    target = torch.randint(5, 100, ids.shape, generator=torch.Generator().manual_seed(3))
    nn.functional.cross_entropy(master(ids, keep).logits.transpose(1, 2), target).backward()
    opt.step()
    master.eval()


@pytest.mark.parametrize("precision", ["fp8", "nvfp4"])
def test_sync_after_an_optimizer_step_is_in_place_and_a_fresh_quantisation(precision):
    master = _master()
    build = (lambda m: quantize_model(m, "torch")) if precision == "fp8" else (lambda m: quantize_fp4(m, "nvfp4"))
    rollout, by_tensor = build(master), build(master)
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    ids, keep = _canvas()
    stale = _logits(rollout, ids, keep)
    _step(master, ids, keep)
    sync_weights(master, rollout)  # the one-pass SyncPlan
    sync_per_tensor(master, by_tensor)  # the per-tensor path (FSDP's)
    fresh = build(master)
    synced = _logits(rollout, ids, keep)
    assert torch.equal(synced, _logits(fresh, ids, keep)) and not torch.equal(synced, stale)
    fresh_state, tensor_state = fresh.state_dict(), by_tensor.state_dict()
    for name, t in rollout.state_dict().items():
        assert torch.equal(t.view(torch.uint8), fresh_state[name].view(torch.uint8)), name
        assert torch.equal(t.view(torch.uint8), tensor_state[name].view(torch.uint8)), name
        assert t.data_ptr() == ptrs[name], f"{name} was reallocated"
    if precision == "fp8":  # every part slice: quant.quantize_weight of the master's tensor
        layer = rollout.layers[1].qkv
        k = master.model.layers[1].self_attn.k_proj.weight
        q, s = quant.quantize_weight(k)
        assert torch.equal(layer.weight_q[128:128 + 64].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(layer.weight_scale[1:2], s) and (layer.weight_q[192:256].float() == 0).all()


def test_kv_cache_windows_equal_the_block_causal_canvas():
    """Block by block against the native cache (each window's keys cut at its end, as the sampler marks them): the
    logits of the whole block-causal canvas."""
    rollout = build_fused_sdar(_master(), "torch")
    ids, keep = _canvas()
    cache = KVCache.for_model(rollout, *ids.shape)
    assert cache.k[0].shape[1] == 2  # [B, Hkv, T, D] per layer
    col = torch.arange(ids.shape[1])
    with torch.no_grad():
        full = rollout(ids, keep).logits
        blocks = [rollout(ids[:, s:s + 4], keep & (col < s + 4), kv_cache=cache, window_start=s).logits
                  for s in (0, 4, 8)]
    torch.testing.assert_close(torch.cat(blocks, 1)[keep], full[keep], rtol=0, atol=1e-5)


def test_fused_copy_of_a_lora_master_merges_the_adapters():
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(_master(), LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex()))
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    copy = quantize_model(wrapped, "torch")
    assert isinstance(copy, FusedSDAR)
    ids, keep = _canvas()
    assert torch.equal(_logits(copy, ids, keep), _logits(build_fused_sdar(wrapped.merge_and_unload(), "torch"), ids,
                                                         keep))


def test_sampler_runs_on_the_fused_copy():
    """sdar_sample (native per-block KV cache, T = 1 draws from one generator) on the fused FP8 copy and on the
    per-Linear FP8 copy: the same tokens and commit steps (their logits are equal), not the master's."""
    from dllm_ais.models.sdar.sampler import SDARSamplerConfig, sdar_sample

    master = _master()
    config = SDARSamplerConfig(gen_length=8, block_length=4, denoising_steps=2, strategy="low_confidence_dynamic",
                               threshold=0.5, temperature=1.0, cuda_graphs="off")
    prompt = torch.randint(5, 100, (3, 6), generator=torch.Generator().manual_seed(1))
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    pmask[1, :3] = False

    def run(model):
        return sdar_sample(model, prompt, pmask, config, master.mask_token_id, [],
                           generator=torch.Generator().manual_seed(7))

    fused = run(quantize_model(master, "torch"))
    unfused = run(quantize_model(master, "torch", exclude=lambda n: False))
    assert torch.equal(fused.completion_ids, unfused.completion_ids)
    assert torch.equal(fused.commit_step, unfused.commit_step)
    assert torch.equal(fused.completion_mask, unfused.completion_mask) and fused.completion_mask.sum() >= 3 * 8
    assert (fused.completion_ids[fused.completion_mask.bool()] != master.mask_token_id).all()  # every slot committed


def test_build_refuses_other_models():
    with pytest.raises(TypeError, match="SDARModel"):
        build_fused_sdar(nn.Linear(16, 16), "torch")
    with pytest.raises(ValueError, match="not both"):
        FusedSDAR(_master().config, "torch", "cpu", torch.float32,
                  make_linear=lambda k, n, d, name: FP4Linear(k, n, device=d))


def test_bench_script_quick_times_the_three_copies(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_sdar_fused.py"
    spec = importlib.util.spec_from_file_location("bench_sdar_fused", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ms = bench.main(["--quick"])
    assert set(ms) == {"sdar fused", "sdar per-Linear", "llada fused"} and all(t > 0 for t in ms.values())
    assert "per-Linear / fused (SDAR)" in capsys.readouterr().out
