"""The host-cheap eager path of the FP8 ops (fp8/eager.py): outside torch.compile each public op function launches its
kernel directly, bit-identical to the torch.library registration it skips; while anything traces (torch.compile, a
TorchDispatchMode, eager.registered_ops()) the registration is called, so compiled graphs still hold the op.

Kernels run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1) at small, ragged shapes."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dllm_ais.fp8 import backends, eager, quant

pytest.importorskip("dllm_ais.fp8.producer_kernels", reason="the Triton producer ops need triton")
from dllm_ais.fp8 import ops  # noqa: E402


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cases():
    """(name, public function, args) at small ragged shapes: M = 6 rows, widths that are not multiples of 128."""
    g = _gen(0)
    x = torch.randn(6, 200, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(200, generator=g)).to(torch.bfloat16)
    gu = torch.randn(6, 2 * 144, generator=g).to(torch.bfloat16)  # fused gate-up output: slices with row stride 288
    att = torch.randn(2, 4, 3, 32, generator=g).to(torch.bfloat16)  # [B, H, T, D]
    qkv = torch.randn(2, 3, 3 * 4 * 32, generator=g).to(torch.bfloat16).view(2, 3, 3, 4, 32)[:, :, 0]  # [B,T,H,D] view
    cos, sin = torch.randn(2, 3, 16, generator=g), torch.randn(2, 3, 16, generator=g)
    xq, xs = quant.quantize_act(torch.randn(6, 256, generator=g))
    wq, ws = quant.quantize_weight(torch.randn(144, 256, generator=g))
    return [
        ("rmsnorm_quant", ops.rmsnorm_quant, (x, w, 1e-5)),
        ("rmsnorm_quant fp32", ops.rmsnorm_quant, (x.float(), w.float(), 1e-5)),
        ("silu_mul_quant", ops.silu_mul_quant, (gu[:, :144], gu[:, 144:])),
        ("attn_out_quant", ops.attn_out_quant, (att,)),
        ("attn_out_quant strided", ops.attn_out_quant, (att.transpose(1, 2).contiguous().transpose(1, 2),)),
        ("rope", ops.rope, (qkv, cos, sin)),
        ("rmsnorm_rowquant", ops.rmsnorm_rowquant, (x, w, 1e-5)),
        ("silu_mul_rowquant", ops.silu_mul_rowquant, (gu[:, :144], gu[:, 144:])),
        ("attn_out_rowquant", ops.attn_out_rowquant, (att,)),
        ("quantize_act", ops.quantize_act, (x,)),
        ("fp8_gemm", ops.fp8_gemm, (xq, xs, wq, ws, torch.bfloat16)),
    ]


def _bits(out) -> list[torch.Tensor]:
    outs = out if isinstance(out, tuple) else (out,)
    return [t.reshape(-1).contiguous().view(torch.uint8) for t in outs]


@pytest.mark.parametrize("case", range(len(_cases())), ids=[c[0] for c in _cases()])
def test_direct_path_is_bit_identical_to_the_registered_op(case):
    name, fn, args = _cases()[case]
    direct = fn(*args)  # eager: the direct launch
    with eager.registered_ops():
        registered = fn(*args)
    via_op = fn.op(*args)
    for a, b, c in zip(_bits(direct), _bits(registered), _bits(via_op), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), name
    # and the scales keep the layout the GEMMs read (K-major for block producers)
    if isinstance(direct, tuple):
        assert [t.stride() for t in direct] == [t.stride() for t in via_op], name


def _dispatched_ops(fn, args) -> list[str]:
    """Op names the profiler records for one call (a torch.library op shows up by its qualified name)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*args)
    return [e.name for e in prof.events()]


@pytest.mark.parametrize("case", [0, 2, 3, 5, 6, 9, 10], ids=lambda i: _cases()[i][0])
def test_eager_calls_skip_the_torch_library_dispatch(case):
    name, fn, args = _cases()[case]
    assert not [n for n in _dispatched_ops(fn, args) if n.startswith("dllm_ais::")], name
    with eager.registered_ops():
        assert any(n.startswith("dllm_ais::") for n in _dispatched_ops(fn, args)), name


class _Names(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_the_registered_op():
    """TorchDispatchModes (traffic counting, FakeTensorMode, make_fx) get the op, never the raw kernel launch."""
    _, fn, args = _cases()[0]
    with _Names() as mode:
        fn(*args)
    assert any("dllm_ais.rmsnorm_quant" in n or "dllm_ais::rmsnorm_quant" in n for n in mode.names), mode.names


def test_eager_or_op_picks_by_tracing_state():
    calls = []
    fn = eager.eager_or_op(lambda a: calls.append(("op", a)), lambda a: calls.append(("direct", a)))
    fn(1)
    with eager.registered_ops():
        fn(2)
        with eager.registered_ops():
            fn(3)
        fn(4)
    fn(5)
    with _Names():
        fn(6)
    assert calls == [("direct", 1), ("op", 2), ("op", 3), ("op", 4), ("direct", 5), ("op", 6)]


def test_cublas_gemm_eagerly_calls_scaled_mm_directly(monkeypatch):
    """cuBLAS's GEMM (no blockwise _scaled_mm on CPU: a stand-in with the reference's numbers) eagerly is one
    torch._scaled_mm call without the custom op; under registered_ops() the op wraps the same call, same bits."""
    seen = []

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):  # a [M, K], b [K, N]
        seen.append((a.shape[0], scale_a.stride()))
        return quant.fp8_gemm_reference(a, scale_a, b.t(), scale_b.t(), out_dtype=torch.float32).to(out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    g = _gen(3)
    xq, xs = quant.quantize_act(torch.randn(8, 256, generator=g))
    wq, ws = quant.quantize_weight(torch.randn(128, 256, generator=g))
    direct = backends.cublas_blockwise_gemm(xq, xs, wq, ws)
    assert not [n for n in _dispatched_ops(backends.cublas_blockwise_gemm, (xq, xs, wq, ws))
                if n.startswith("dllm_ais::")]  # fmt: skip
    with eager.registered_ops():
        via_op = backends.cublas_blockwise_gemm(xq, xs, wq, ws)
    assert torch.equal(direct.view(torch.int16), via_op.view(torch.int16))
    assert seen[0] == (8, (1, 8))  # scales passed outer-dim-major, as cuBLAS's 1×128 mode needs
