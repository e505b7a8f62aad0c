"""Non-GEMM, non-attention bytes of one eager rollout layer at LLaDA-8B shape [32, 320] (fp8/traffic.py, meta
tensors, no GPU): the FP8 copy as it runs on CUDA (Triton producers with every GEMM backend) moves at most 1.05× the
fused BF16 copy's bytes, for every backend. Also: the counter itself charges what it says (a hand-counted op), and
the torch-twin producers (the old CUDA path of cublas / auto) would fail the bound — the test can fail."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import traffic

pytest.importorskip("dllm_ais.fp8.producer_kernels", reason="the Triton producer ops need triton")

FP8_BACKENDS = ["torch", "triton", "cublas", "torchao", "scaled_mm"]
BOUND = 1.05


@pytest.fixture(scope="module")
def bf16_bytes() -> int:
    return traffic.layer_traffic(None).total


@pytest.mark.parametrize("backend", FP8_BACKENDS)
def test_fp8_layer_moves_no_more_than_bf16(backend, bf16_bytes):
    counter = traffic.layer_traffic(backend, producers="triton")
    ratio = counter.total / bf16_bytes
    print(f"{backend}: {counter.total / 1e9:.2f} GB vs bf16 {bf16_bytes / 1e9:.2f} GB ({ratio:.2f}x)")
    assert ratio <= BOUND, dict(counter.by_op.most_common(6))
    assert not any(name.startswith("aten::constant_pad") for name in counter.by_op)  # no F.pad on the CUDA path
    custom = sum(n for name, n in counter.calls.items() if name.startswith("dllm_ais::"))
    assert custom == 6  # one op each: 2 RMSNorm→quant, SiLU·up→quant, attn-out→quant, 2 RoPE


def test_torch_twin_producers_would_fail_the_bound(bf16_bytes):
    """The twins (CPU producers; on CUDA the old path of cublas / auto) move > 2× the BF16 bytes: the bound bites."""
    assert traffic.layer_traffic("cublas", producers="torch").total > 2 * bf16_bytes


def test_counter_charges_inputs_and_outputs_and_skips_views_gemms_attention():
    a = torch.empty(4, 8, device="meta", dtype=torch.bfloat16)
    b = torch.empty(8, 16, device="meta", dtype=torch.bfloat16)
    counter = traffic.TrafficCounter()
    with counter:
        c = a + a  # 3 tensors × 64 bytes
        _ = c.t().reshape(-1)  # views: free (reshape of a transposed view copies: aten::clone is charged)
        _ = a @ b  # a GEMM: free
        with counter.excluded():
            _ = a * 2
    assert counter.by_op["aten::add"] == 3 * 4 * 8 * 2
    assert "aten::mm" not in counter.by_op and "aten::mul" not in counter.by_op
    assert set(counter.by_op) <= {"aten::add", "aten::clone", "aten::_unsafe_view"}
