"""The fused LLaDA rollout copy (models/llada/fused_fp8.py): same log-probs as the unfused FP8 copy, sync = fresh
quantisation of the master (with LoRA) without reallocating, the BF16 fused copy, and torch.compile without graph
breaks.

Bounds: the fused and unfused copies run the same ops on the same codes; only the fp32 GEMM over a wider weight
(qkv [3d, d], gate_up [2h, d]) may sum in another order (CPU BLAS blocking), so log-probs agree to LOGP_ATOL = 1e-5
(measured: bit-equal at d = 128 in fp32 and bf16, 4.8e-7 at the ragged fp32 shape, bit-equal in bf16 there).
On a GPU the compiled producer kernels may move a value one bf16 ulp (test_fused_logprobs_equal_unfused_other_backends
then bounds the mean fused-vs-unfused difference by a tenth of the FP8-vs-BF16 difference; not measured here).
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from dllm_ais.fp8 import FP8Linear, available_backends, quant, quantize_model, sync_weights
from dllm_ais.models.llada.fused_fp8 import FUSED_PARTS, FusedLLaDA, build_fused_llada
from dllm_ais.models.llada.model import lora_target_regex
from dllm_ais.models.tiny import tiny_model

LOGP_ATOL = 1e-5
RAGGED = dict(d_model=80, n_heads=5, mlp_hidden_size=144)  # d, h not multiples of 128: padded parts
SHAPES = {"tiny": {}, "ragged": RAGGED}
B, T, P = 3, 20, 6


def _inputs(vocab: int = 100, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    attn = torch.ones(B, T, dtype=torch.bool)
    attn[0, :3] = False  # left padding
    return ids, attn


@torch.no_grad()
def _logp(model, ids, attn) -> torch.Tensor:
    return model(ids, attention_mask=attn, positions=slice(P, None)).logits.float().log_softmax(-1)  # [B, T-P, V]


def _unfused(model, backend: str):
    return quantize_model(model, backend, exclude=lambda name: False)  # an exclude keeps the per-Linear copy


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_logprobs_equal_unfused_torch_backend(shape, dtype):
    model = tiny_model(seed=0, dtype=dtype, **SHAPES[shape])
    fused, unfused = quantize_model(model, "torch"), _unfused(model, "torch")
    assert isinstance(fused, FusedLLaDA) and fused.variant == "fp8_producers" and not isinstance(unfused, FusedLLaDA)
    ids, attn = _inputs()
    a, b = _logp(fused, ids, attn), _logp(unfused, ids, attn)
    torch.testing.assert_close(a, b, atol=LOGP_ATOL, rtol=0)
    assert (a - _logp(model, ids, attn)).abs().max() > 1e-4  # the FP8 path is really in effect


@pytest.mark.parametrize(("backend", "producers"),
                         [("triton", "triton"), ("scaled_mm", None), ("scaled_mm", "triton"), ("torch", "triton")])
def test_fused_logprobs_equal_unfused_other_backends(backend, producers):
    """triton: producer kernels + Triton GEMM (interpreter on CPU); scaled_mm: producers that quantise per row (its
    row-wise scheme; torch twins, and the Triton row producers); torch GEMM fed by the Triton producers (what every
    backend gets on CUDA). bf16 model, ragged shape."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if backend not in available_backends(device) or (producers == "triton" and "triton" not in available_backends(
            device)):  # fmt: skip
        pytest.skip(f"backend {backend} / producers {producers} cannot run on {device}")
    model = tiny_model(seed=1, dtype=torch.bfloat16, **RAGGED).to(device)
    fused, unfused = build_fused_llada(model, backend, producers=producers), _unfused(model, backend)
    assert fused.variant == "fp8_producers"
    assert fused.producers == (producers or ("triton" if device == "cuda" else "torch"))
    ids, attn = (t.to(device) for t in _inputs())
    a, b = _logp(fused, ids, attn), _logp(unfused, ids, attn)
    if device == "cpu":
        torch.testing.assert_close(a, b, atol=LOGP_ATOL, rtol=0)
    else:  # compiled producers reduce in another order than torch (a value one bf16 ulp, a code one e4m3 step away):
        # the fused-vs-unfused difference must stay far below the FP8 error itself
        fp8_error = (b - _logp(model, ids, attn)).abs().mean()
        assert (a - b).abs().mean() <= 0.1 * fp8_error


def _lora(model):
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex(),
                                            init_lora_weights="gaussian"))


def _assert_fresh_quantisation(rollout: FusedLLaDA, master) -> None:
    """Every part slice of every fused FP8 weight equals quant.quantize_weight of the master's merged tensor; padding
    rows hold zero codes."""
    from dllm_ais.fp8.walker import canonical_name, effective_weight
    from dllm_ais.fp8.walker import linear_layers as _linear_layers

    layers = {canonical_name(n, True): m for n, m in _linear_layers(master).items()}
    for i, block in enumerate(rollout.blocks):
        for fused in FUSED_PARTS:
            layer = getattr(block, fused)
            covered = torch.zeros(layer.out_features, dtype=torch.bool)
            for name, offset in block.part_offsets(fused):
                weight, _ = effective_weight(layers[f"model.transformer.blocks.{i}.{name}"])
                q, s = quant.quantize_weight(weight)
                n = weight.shape[0]
                assert torch.equal(layer.weight_q[offset:offset + n].view(torch.uint8), q.view(torch.uint8)), name
                assert torch.equal(layer.weight_scale[offset // 128:offset // 128 + s.shape[0]], s), name
                covered[offset:offset + n] = True
            assert (layer.weight_q[~covered].float() == 0).all()  # padding rows (inside each part's last block)


def test_sync_with_lora_is_fresh_quantisation_in_place():
    master = _lora(tiny_model(seed=2, dtype=torch.bfloat16, **RAGGED))
    rollout = quantize_model(master, "torch")
    assert isinstance(rollout, FusedLLaDA)
    _assert_fresh_quantisation(rollout, master)
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    ids, attn = _inputs()
    stale = _logp(rollout, ids, attn)

    optimizer = torch.optim.SGD([p for p in master.parameters() if p.requires_grad], lr=1.0)
    master.train()
    master(ids, attention_mask=attn).logits.float().logsumexp(-1).mean().backward()
    optimizer.step()  # moves the LoRA adapters only
    with torch.no_grad():
        master.base_model.model.model.transformer.ln_f.weight.mul_(1.5)  # and a non-LoRA tensor
    master.eval()

    sync_weights(master, rollout)
    _assert_fresh_quantisation(rollout, master)
    fresh = quantize_model(master, "torch")
    fresh_state = fresh.state_dict()
    for name, tensor in rollout.state_dict().items():
        assert torch.equal(tensor.view(torch.uint8), fresh_state[name].view(torch.uint8)), name
        assert tensor.data_ptr() == ptrs[name], f"{name} was reallocated"
    synced = _logp(rollout, ids, attn)
    assert torch.equal(synced, _logp(fresh, ids, attn)) and not torch.equal(synced, stale)
    torch.testing.assert_close(synced, _logp(_unfused(master, "torch"), ids, attn), atol=LOGP_ATOL, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_fused_copy_matches_master(shape):
    """backend None: the same fused structure in the master's dtype; fp32 model: only GEMM summation order differs."""
    model = tiny_model(seed=3, dtype=torch.float32, **SHAPES[shape])
    fused = build_fused_llada(model, None)
    assert not any(isinstance(m, FP8Linear) for m in fused.modules()) and fused.variant == "plain"
    ids, attn = _inputs()
    torch.testing.assert_close(_logp(fused, ids, attn), _logp(model, ids, attn), atol=LOGP_ATOL, rtol=0)
    ptr = fused.blocks[0].qkv.weight.data_ptr()
    with torch.no_grad():
        model.model.transformer.blocks[0].k_proj.weight.add_(0.01)
    sync_weights(model, fused)
    d = model.config.d_model
    assert torch.equal(fused.blocks[0].qkv.weight[d:2 * d], model.model.transformer.blocks[0].k_proj.weight)
    assert fused.blocks[0].qkv.weight.data_ptr() == ptr


def _compile_reason() -> str | None:
    import shutil

    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "torch.compile on CPU needs a C++ compiler (none on PATH)"
    return None


@pytest.mark.skipif(_compile_reason() is not None, reason=str(_compile_reason()))
@pytest.mark.parametrize("backend", ["torch", None, "triton"], ids=["fp8-torch", "bf16", "fp8-triton"])
def test_compile_fullgraph_no_graph_breaks(backend):
    """dynamo traces the whole fused forward as one graph with no break (torch._dynamo.explain), and for FP8-torch
    torch.compile(fullgraph=True) (which raises on any break) runs it through inductor to the eager result.
    fp8-triton: the producer ops and the GEMM as torch.library ops (on CPU the interpreter's custom_op registration,
    producer_kernels._register; on a GPU triton_op), traced only (inductor cannot compile interpreter kernels)."""
    import torch._dynamo

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if backend is not None and backend not in available_backends(device):
        pytest.skip(f"backend {backend} cannot run on {device}")
    model = tiny_model(seed=4, dtype=torch.bfloat16).to(device)
    rollout = build_fused_llada(model, backend)
    ids, attn = (t.to(device) for t in _inputs())
    torch._dynamo.reset()
    explained = torch._dynamo.explain(rollout)(ids, attention_mask=attn, positions=slice(P, None))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    if backend != "torch":
        return  # the inductor run below is the slow part (~1 min on a loaded 2-core CPU): once is enough
    compiled = torch.compile(rollout, fullgraph=True)
    got = _logp(compiled, ids, attn)
    ref = _logp(rollout, ids, attn)
    # inductor may fuse / reorder fp32 math before a bf16 rounding or an e4m3 code: a few values one step off
    assert got.shape == ref.shape and (got - ref).abs().mean() < 1e-2
