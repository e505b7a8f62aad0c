"""The one-pass sync of the fused rollout copy (fp8/fused_sync.py, fp8/grouped_quant.py): the grouped Triton weight
quantiser equals quant.quantize_weight bit for bit (ragged shapes, zero blocks, moved sources); a sync through it
leaves exactly the buffers of the per-tensor sync (plain and LoRA masters, BF16 copy); the name maps are built once;
one launch per sync (one per block with LoRA). Kernels run under the Triton interpreter (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from dllm_ais.fp8 import fused_sync, quant, quantize_model, sync_weights
from dllm_ais.fp8.walker import effective_weight
from dllm_ais.models.llada.fused_fp8 import FusedLLaDA, build_fused_llada, sync_per_tensor
from dllm_ais.models.llada.model import lora_target_regex
from dllm_ais.models.tiny import tiny_model

pytest.importorskip("dllm_ais.fp8.kernels", reason="the grouped quantiser is a Triton kernel")
from dllm_ais.fp8.grouped_quant import GroupedWeightQuant  # noqa: E402

RAGGED = dict(d_model=80, n_heads=5, mlp_hidden_size=144)  # parts that are not whole 128-blocks


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _destinations(shapes):
    """Code views at 16-aligned offsets of one flat buffer (as the fused buffers' row slices are) + scale tensors."""
    flat = torch.zeros(sum(n * k + 16 for n, k in shapes), dtype=torch.float8_e4m3fn)
    codes, offset = [], 0
    for n, k in shapes:
        codes.append(flat[offset:offset + n * k].view(n, k))
        offset += -(-(n * k) // 16) * 16
    return codes, [torch.full((quant.num_blocks(n), quant.num_blocks(k)), -1.0) for n, k in shapes]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_grouped_quantiser_equals_the_reference_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    shapes = [(256, 128), (144, 208), (16, 16), (130, 400)]  # whole blocks, ragged, one tiny, ragged rows and cols
    big = (torch.randn(600, 512, generator=g) * 5).to(dtype)
    sources = [(torch.randn(n, k, generator=g) * 3).to(dtype) for n, k in shapes[:3]]
    sources.append(big[32:162, 48:448])  # a strided view (row stride 512, offset 32·512 + 48 elements)
    sources[1][:128, :128] = 0  # an all-zero block: scale 1, zero codes
    sources[2][0, 0] = 1e4  # saturates at ±448 after scaling (exactly 448 · scale)
    codes, scales = _destinations(shapes)
    group = GroupedWeightQuant(codes, scales)
    group(sources)
    for w, q, s in zip(sources, codes, scales, strict=True):
        ref_q, ref_s = quant.quantize_weight(w)
        assert torch.equal(_u8(q), _u8(ref_q)) and torch.equal(s, ref_s)
    assert scales[1][0, 0] == 1.0
    moved = [(w * 2).contiguous() for w in sources]  # new tensors: the source table is rebuilt
    group(moved)
    for w, q, s in zip(moved, codes, scales, strict=True):
        ref_q, ref_s = quant.quantize_weight(w)
        assert torch.equal(_u8(q), _u8(ref_q)) and torch.equal(s, ref_s)


def test_grouped_quantiser_refuses_misfits():
    codes, scales = _destinations([(128, 128)])
    group = GroupedWeightQuant(codes, scales)
    with pytest.raises(ValueError, match="does not fit"):
        group([torch.zeros(128, 144)])
    with pytest.raises(ValueError, match="one scales tensor per codes"):
        GroupedWeightQuant(codes, [])


@pytest.fixture
def grouped_on_cpu(monkeypatch):
    """Syncs on CPU use the grouped Triton quantiser (interpreter); launches are counted."""
    monkeypatch.setattr(fused_sync, "GROUPED_DEVICES", {"cuda", "cpu"})
    launches = []
    real = GroupedWeightQuant.__call__

    def counted(self, sources):
        launches.append(len(sources))
        return real(self, sources)

    monkeypatch.setattr(GroupedWeightQuant, "__call__", counted)
    return launches


def _master(shape: dict, lora: bool):
    model = tiny_model(seed=0, dtype=torch.bfloat16, **shape)
    if lora:
        model = get_peft_model(model, LoraConfig(r=4, target_modules=lora_target_regex(), init_lora_weights=False))
    return model


@torch.no_grad()
def _step(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(0.01 * torch.randn(p.shape, generator=g).to(p.dtype))


@pytest.mark.slow  # two interpreted syncs per case (≈ 20 s of CPU each on a loaded machine)
@pytest.mark.parametrize(("shape", "lora"), [({}, False), (RAGGED, True)], ids=["tiny", "ragged-lora"])
def test_one_pass_sync_equals_per_tensor_sync(grouped_on_cpu, shape, lora):
    master = _master(shape, lora)
    rollout, reference = quantize_model(master, "triton"), quantize_model(master, "triton")
    assert isinstance(rollout, FusedLLaDA)
    ptrs = {k: v.data_ptr() for k, v in rollout.state_dict().items()}
    _step(master, 1)
    grouped_on_cpu.clear()
    sync_weights(master, rollout)  # the one-pass sync
    sync_per_tensor(master, reference)
    got, want = rollout.state_dict(), reference.state_dict()
    assert all(torch.equal(_u8(got[k]), _u8(want[k])) for k in want)
    assert {k: v.data_ptr() for k, v in got.items()} == ptrs  # in place
    n_layers = master.config.n_layers
    assert grouped_on_cpu == ([7] * n_layers if lora else [7 * n_layers])  # one launch (one per block with LoRA)
    block = rollout.blocks[0]  # and a fresh quantisation of the master, e.g. the fused gate-up's up part
    up = dict(master.named_modules())[next(n for n, _ in master.named_modules() if n.endswith("blocks.0.up_proj"))]
    ref_q, ref_s = quant.quantize_weight(effective_weight(up)[0])
    off = block.part_offsets("gate_up")[1][1]
    assert torch.equal(_u8(block.gate_up.weight_q[off:off + block.h]), _u8(ref_q))
    assert torch.equal(block.gate_up.weight_scale[off // 128:off // 128 + ref_s.shape[0]], ref_s)


def test_name_maps_are_built_once_and_later_steps_still_arrive(grouped_on_cpu, monkeypatch):
    master = _master({}, lora=False)
    rollout = quantize_model(master, "triton")
    builds = []
    real = fused_sync.linear_layers
    monkeypatch.setattr(fused_sync, "linear_layers", lambda m: builds.append(1) or real(m))
    fused_sync._PLANS.pop(rollout, None)
    per_sync = []
    for step in (1, 2):
        _step(master, step)
        before = len(builds)
        sync_weights(master, rollout)
        per_sync.append(len(builds) - before)
        reference = quantize_model(master, "torch")
        got, want = rollout.state_dict(), reference.state_dict()
        assert all(torch.equal(_u8(got[k]), _u8(want[k])) for k in want), step
    assert per_sync == [1, 0]  # the maps of the first sync serve the second


def test_bf16_copy_syncs_through_the_plan():
    master = _master({}, lora=False)
    rollout = build_fused_llada(master, None)
    _step(master, 3)
    sync_weights(master, rollout)
    reference = build_fused_llada(master, None)
    got, want = rollout.state_dict(), reference.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
