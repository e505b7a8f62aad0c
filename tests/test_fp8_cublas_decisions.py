"""cuBLAS blockwise: whether a GEMM shape runs cuBLAS is decided eagerly and recorded (fp8/backends.py
cublas_accepts / prepare_gemm_shapes), never by catching an error inside a compiled step; and the sampler names
every activation row count it will use (samplers/diffusion.py forward_rows) so a compiled rollout can be prepared.

On CPU cuBLAS cannot run, so these tests stand in a fake `torch._scaled_mm` that rejects some M (as a device might)
and otherwise computes the dequantised reference; the real call is covered by the GPU tests of
test_fp8_cublas_auto.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dllm_ais.config import SamplerConfig
from dllm_ais.fp8 import backends, quant
from dllm_ais.fp8.linear import FP8Linear


@pytest.fixture
def fake_cublas(monkeypatch):
    """cuBLAS 'available' on CPU; its _scaled_mm rejects M % 4 != 0; calls and Triton fallbacks are counted."""
    calls = {"scaled_mm": [], "triton": []}

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):  # a [M, K], b [K, N] (a transposed [N, K])
        m = a.shape[0]
        calls["scaled_mm"].append(m)
        if m % 4:
            raise RuntimeError(f"fake cuBLAS: M={m} is not a multiple of 4")
        return quant.fp8_gemm_reference(a, scale_a, b.t(), scale_b.t(), out_dtype=torch.float32).to(out_dtype)

    def triton_gemm(xq, xs, wq, ws):
        calls["triton"].append(xq.shape[0])
        return quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32).to(torch.bfloat16)

    real_unavailable = backends._unavailable
    monkeypatch.setattr(backends, "_unavailable", lambda name, dev: None if name == "cublas" else
                        real_unavailable(name, dev))  # fmt: skip
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    from dllm_ais.fp8 import kernels

    monkeypatch.setattr(kernels, "fp8_gemm", triton_gemm)
    monkeypatch.setattr(backends, "_CUBLAS_DECIDED", {})
    return calls


def _layer(n: int = 256, k: int = 384, seed: int = 0) -> FP8Linear:
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(k, n, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
    return FP8Linear.from_linear(linear, backend="torch")


def _gemm(layer: FP8Linear, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cublas gemm output, dequantised reference) for a random [m, K] input."""
    x = torch.randn(m, layer.in_features, generator=torch.Generator().manual_seed(m))
    xq, xs = quant.quantize_act(x)
    ref = quant.fp8_gemm_reference(xq, xs, layer.weight_q, layer.weight_scale, out_dtype=torch.float32)
    return backends.BACKENDS["cublas"].gemm(xq, xs, layer), ref


def test_prepare_records_accepted_rows_on_each_layer(fake_cublas):
    model = nn.Sequential(_layer(seed=1), _layer(512, 256, seed=2))
    for layer in model:
        layer.backend = "cublas"
    rejected = backends.prepare_gemm_shapes(model, [8, 6, 8, 12])
    assert rejected == {"256x384": [6], "512x256": [6]}
    assert all(layer.cublas_rows == frozenset({8, 12}) for layer in model)
    # one probe per (device, M, N, K): the second layer shape probed again, repeated M did not
    assert sorted(fake_cublas["scaled_mm"]) == [6, 6, 8, 8, 12, 12]
    assert backends.cublas_fallbacks() == {("cpu", 6, 256, 384), ("cpu", 6, 512, 256)}
    assert backends.cublas_decisions()[("cpu", 8, 256, 384)] is True


def test_gemm_follows_the_record_and_probes_only_eagerly(fake_cublas, monkeypatch):
    layer = _layer()
    layer.backend = "cublas"
    backends.prepare_gemm_shapes(layer, [8, 6])
    fake_cublas["scaled_mm"].clear()
    y, ref = _gemm(layer, 8)  # prepared and accepted: cuBLAS
    assert fake_cublas["scaled_mm"] == [8] and fake_cublas["triton"] == []
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    _gemm(layer, 6)  # prepared and rejected: Triton, no second probe
    assert fake_cublas["scaled_mm"] == [8] and fake_cublas["triton"] == [6]
    _gemm(layer, 16)  # eager and undecided: probed once, recorded on the layer, then cuBLAS
    assert fake_cublas["scaled_mm"] == [8, 16, 16] and 16 in layer.cublas_rows

    monkeypatch.setattr(backends, "_tracing", lambda: True)  # as inside torch.compile / CUDA-graph capture
    fake_cublas["scaled_mm"].clear(), fake_cublas["triton"].clear()
    y, ref = _gemm(layer, 20)  # undecided while tracing: no probe, no try/except, the Triton GEMM
    assert fake_cublas["scaled_mm"] == [] and fake_cublas["triton"] == [20]
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    _gemm(layer, 16)  # decided before tracing: cuBLAS
    assert fake_cublas["scaled_mm"] == [16]
    with pytest.raises(backends.FP8BackendError, match="prepare_gemm_shapes"):
        backends.cublas_accepts(24, 256, 384, "cpu")


def test_ragged_layers_never_probe(fake_cublas):
    layer = _layer(144, 272)  # not whole 128-blocks
    layer.backend = "cublas"
    assert backends.prepare_gemm_shapes(layer, [8]) == {"144x272": []}
    _gemm(layer, 8)
    assert fake_cublas["scaled_mm"] == [] and fake_cublas["triton"] == [8]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_forward_rows_are_the_rows_the_sampler_calls_the_model_with(cache):
    """forward_rows(B, P, config) is exactly the set of B × T of every model call of one rollout."""
    from dllm_ais.models.tiny import tiny_config, tiny_model
    from dllm_ais.samplers.diffusion import diffusion_sample, forward_rows

    model = tiny_model(seed=0, dtype=torch.float32)
    seen: set[int] = set()
    real = model.forward

    def forward(input_ids, *args, **kwargs):
        seen.add(input_ids.shape[0] * input_ids.shape[1])
        return real(input_ids, *args, **kwargs)

    model.forward = forward
    cfg = tiny_config()
    config = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0, cache=cache)
    B, P = 3, 5
    ids = torch.randint(5, cfg.vocab_size, (B, P), generator=torch.Generator().manual_seed(0))
    diffusion_sample(model, ids, torch.ones(B, P, dtype=torch.bool), config, cfg.mask_token_id, (cfg.eos_token_id,))
    assert seen == set(forward_rows(B, P, config))


def test_a_prepared_layer_traces_in_one_graph(fake_cublas):
    """torch.compile(fullgraph=True) through the cublas gemm: the recorded decision is read at trace time, with no
    probe, no try/except and no graph break, for an accepted and for a rejected M (the Triton GEMM)."""
    layer = _layer()
    layer.backend = "cublas"
    backends.prepare_gemm_shapes(layer, [8, 6])
    fake_cublas["scaled_mm"].clear()
    torch._dynamo.reset()
    for m, path in ((8, "scaled_mm"), (6, "triton")):
        x = torch.randn(m, layer.in_features, generator=torch.Generator().manual_seed(m))
        xq, xs = quant.quantize_act(x)
        compiled = torch.compile(lambda a, b: backends.BACKENDS["cublas"].gemm(a, b, layer), backend="eager",
                                 fullgraph=True)  # fmt: skip
        y = compiled(xq, xs)
        ref = quant.fp8_gemm_reference(xq, xs, layer.weight_q, layer.weight_scale, out_dtype=torch.float32)
        torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
        assert m in fake_cublas[path]
    assert fake_cublas["scaled_mm"].count(6) == 0  # the rejected M was never offered to cuBLAS again
    torch._dynamo.reset()


def test_the_compiler_sees_one_opaque_cublas_op(fake_cublas):
    """Inside torch.compile the cuBLAS GEMM is the custom op dllm_ais::cublas_blockwise_gemm, never an aten
    _scaled_mm that inductor would lower and autotune (which failed for blockwise scales on torch 2.11)."""
    layer = _layer()
    layer.backend = "cublas"
    backends.prepare_gemm_shapes(layer, [8])
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(8, layer.in_features, generator=torch.Generator().manual_seed(8))
    xq, xs = quant.quantize_act(x)
    y = torch.compile(lambda a, b: backends.BACKENDS["cublas"].gemm(a, b, layer), backend=capture, fullgraph=True)(
        xq, xs)  # fmt: skip
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("cublas_blockwise_gemm" in t for t in targets), targets
    assert not any("_scaled_mm" in t for t in targets), targets
    ref = quant.fp8_gemm_reference(xq, xs, layer.weight_q, layer.weight_scale, out_dtype=torch.float32)
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    torch._dynamo.reset()
