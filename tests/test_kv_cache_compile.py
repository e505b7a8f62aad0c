"""The compiled dual-cache window step writes only the window's slots of the per-layer KV cache (models/kv_cache.py).

Inductor (CPU) compiles one window step of a tiny 2-layer LLaDA; its generated code is read back
(`run_and_get_code`) and checked: no buffer of a cache layer's shape [B, H, T, D] (or the whole cache's
[L, B, H, T, D]) is allocated, and every kernel that receives a cache tensor is the fused `index_copy` slot write or
the attention that reads it — no kernel copies a cache tensor. The logits equal eager's.

The counter-example is the old layout (one [L, B, H, T, D] buffer per kind whose per-layer views take `index_copy_`,
rebuilt here as `OneBuffer`): functionalisation turns each write into a select_scatter of the whole buffer, and the
generated code allocates cache-layer-sized temporaries (8 at L = 2, measured with torch 2.13) and copies the whole
buffer back at the end (`cpp_fused_copy_`). That test is marked slow (a second ~60 s compile).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch
from torch._inductor.utils import fresh_inductor_cache, run_and_get_code

from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.tiny import tiny_model

B, T, TW, START = 3, 40, 8, 24  # batch, canvas, window (one block), the window's first canvas position
MASK = 4


@dataclass
class OneBuffer:
    """The old single-buffer layout (the counter-example only): k, v [L, B, H, T, D], layer(i) = views."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[3]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]


def _step(model, window, attn, start, cache):
    return model(input_ids=window, attention_mask=attn, kv_cache=cache, window_start=start).logits


def _compile_window_step(layout: str):
    """(compiled logits, eager logits, generated code, per-layer cache shape, model) for one dual-cache step."""
    model = tiny_model(seed=0, n_layers=2, d_model=32, n_heads=2, mlp_hidden_size=64).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(5, 100, (B, T), generator=g)
    x[:, START:] = MASK
    attn = torch.ones(B, T, dtype=torch.bool)
    attn[0, :5] = False  # left padding
    with torch.no_grad():
        cache = KVCache.for_model(model, B, T)
        model(input_ids=x, attention_mask=attn, kv_cache=cache, window_start=0)  # the block's refresh
        eager_cache = KVCache([k.clone() for k in cache.k], [v.clone() for v in cache.v])
        window = x[:, START:START + TW].clone()
        window[:, :3] = torch.randint(5, 100, (B, 3), generator=g)  # tokens committed since the refresh
        start = torch.tensor(START)
        eager = _step(model, window, attn, start, eager_cache)
        if layout == "one":
            cache = OneBuffer(torch.stack(cache.k), torch.stack(cache.v))
        torch._dynamo.reset()
        try:
            with fresh_inductor_cache():
                compiled, codes = run_and_get_code(torch.compile(_step, backend="inductor", dynamic=False), model,
                                                   window, attn, start, cache)
        finally:
            torch._dynamo.reset()
    for i in range(2):  # the compiled step wrote the window's slots as eager did
        torch.testing.assert_close(cache.layer(i)[0], eager_cache.k[i], atol=1e-6, rtol=0)
        torch.testing.assert_close(cache.layer(i)[1], eager_cache.v[i], atol=1e-6, rtol=0)
    return compiled, eager, "\n".join(codes), tuple(eager_cache.k[0].shape)


def cache_traffic(code: str, layer_shape: tuple[int, ...], n_layers: int) -> tuple[list[str], list[str]]:
    """From inductor's generated code: (allocations of a cache layer's or the whole cache's shape, calls that pass a
    cache tensor to anything but an index_copy slot write or the attention)."""
    shapes = {", ".join(map(str, layer_shape)), ", ".join(map(str, (n_layers, *layer_shape)))}
    allocs = [m for m in re.findall(r"empty_strided_\w+\(\(([^)]*)\)", code) if m in shapes]
    cache_args = set(re.findall(r"assert_size_stride\((arg\d+_1), \((" + "|".join(map(re.escape, shapes)) + r")\)",
                                code))
    names = {a for a, _ in cache_args}
    copies = []
    for line in code.splitlines():
        call = re.match(r"\s*(?:\w+ = )?([\w.]+)\((.*)\)\s*$", line)
        if not call or call.group(1) == "assert_size_stride" or "assert_" in call.group(1):
            continue
        args = set(re.findall(r"arg\d+_1", call.group(2)))
        if args & names and "index_copy" not in call.group(1) and "scaled_dot_product" not in call.group(1):
            copies.append(call.group(1))
    assert names, "the cache tensors were not found among the graph's inputs: the check would be vacuous"
    return allocs, copies


def test_compiled_window_step_allocates_and_copies_no_cache_sized_buffer():
    compiled, eager, code, layer_shape = _compile_window_step("per-layer")
    # measured: max |compiled − eager| 7.5e-8 at |logits| ≤ 0.2 (fp32)
    torch.testing.assert_close(compiled, eager, atol=1e-5 * eager.abs().max().item(), rtol=0)
    allocs, copies = cache_traffic(code, layer_shape, 2)
    assert allocs == [], f"cache-sized temporaries allocated: {allocs}"
    assert copies == [], f"kernels that copy a cache tensor: {copies}"
    assert "index_copy" in code  # the slot writes are fused into a kernel that writes the cache in place


@pytest.mark.slow
def test_old_single_buffer_layout_copies_the_cache():
    """The check above fails on the old layout: it is not vacuous."""
    compiled, eager, code, layer_shape = _compile_window_step("one")
    torch.testing.assert_close(compiled, eager, atol=1e-5 * eager.abs().max().item(), rtol=0)
    allocs, copies = cache_traffic(code, layer_shape, 2)
    assert len(allocs) >= 4 and copies, (allocs, copies)
