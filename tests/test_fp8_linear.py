"""FP8Linear, quantize_model and sync_weights on small LLaDA-shaped toy models (CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dllm_ais.fp8 import (
    BACKENDS,
    FP8BackendError,
    FP8LayerError,
    FP8Linear,
    available_backends,
    quantize_model,
    sync_weights,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
RUNNABLE = available_backends(DEVICE)
# FP8Linear vs nn.Linear on the seeded data below, measured on CPU: 1×128/128×128 blocks 29.1 dB (fp32 and bf16
# inputs), row-wise scaled_mm 28.8 dB (no outlier rows or channels here, so the coarser scheme loses little).
SNR_FLOOR_DB = {"torch": 27.0, "triton": 27.0, "torchao": 27.0, "cublas": 27.0, "auto": 27.0, "scaled_mm": 26.0}
# Block backends vs the torch reference layer, fp32 output. CPU (interpreter): same fp32 sums in another order, ≤ 1e-6.
# CUDA: Hopper's FP8 tensor cores accumulate each 128-wide K block's dot with reduced precision (measured 5e-5 …
# 1.2e-4 relative on an H100, DESIGN.md §7; the kernel sums blocks in fp32 so it does not grow with K): 1e-3.
# bf16 outputs (torchao, cublas): bf16 rounding, 2**-8 relative per entry.
BLOCK_FP32_TOL = 1e-3 if DEVICE.type == "cuda" else 1e-5
MODEL_SNR_FLOOR_DB = 20.0  # logits of the whole bf16 toy model vs its FP8 copy: measured 24.6 dB (torch), 25.7 (row)


def snr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    ref, approx = ref.float(), approx.float()
    return 10 * torch.log10(ref.pow(2).sum() / (ref - approx).pow(2).sum()).item()


def _skip_unless_runnable(backend: str) -> None:
    if backend not in RUNNABLE:
        pytest.skip(f"backend {backend!r} cannot run on {DEVICE}: {BACKENDS[backend].unavailable(DEVICE)}")


class Block(nn.Module):
    """LLaDA block naming: q/k/v_proj, attn_out, ff_proj (gate), up_proj, ff_out (down); bidirectional attention."""

    def __init__(self, d: int, hidden: int, in_features_of_q: int | None = None) -> None:
        super().__init__()
        self.attn_norm, self.ff_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q_proj = nn.Linear(in_features_of_q or d, d, bias=False)
        self.k_proj, self.v_proj, self.attn_out = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.ff_proj, self.up_proj = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.ff_out = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, T, d]
        h = self.attn_norm(x)
        x = x + self.attn_out(F.scaled_dot_product_attention(self.q_proj(h), self.k_proj(h), self.v_proj(h)))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class ToyLM(nn.Module):
    """model.transformer.{wte, blocks, ln_f, ff_out}: the LM head is `transformer.ff_out`, like LLaDA's."""

    def __init__(self, vocab: int = 100, d: int = 64, hidden: int = 192, layers: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, d),
            "blocks": nn.ModuleList(Block(d, hidden) for _ in range(layers)),
            "ln_f": nn.RMSNorm(d),
            "ff_out": nn.Linear(d, vocab, bias=False),
        })  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (0.02 if p.dim() > 1 else 1.0) + (p.dim() == 1))

    def get_output_embeddings(self) -> nn.Module:
        return self.transformer.ff_out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [B, T] -> logits [B, T, vocab]
        x = self.transformer.wte(ids)
        for block in self.transformer.blocks:
            x = block(x)
        return self.transformer.ff_out(self.transformer.ln_f(x))


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")
EXPECTED_FP8 = {f"transformer.blocks.{i}.{p}" for i in range(2) for p in PROJECTIONS}


def _toy(dtype: torch.dtype = torch.bfloat16, **kwargs) -> ToyLM:
    """A ToyLM with fixed weights: nn.Linear initialises from torch's global RNG, so draw it under a forked,
    seeded RNG (restored afterwards) — unseeded, the SNR checks below were flaky."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ToyLM(**kwargs)
    return model.to(device=DEVICE, dtype=dtype)


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _fp8_names(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, FP8Linear)}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert x.dtype == y.dtype and torch.equal(x, y), name


def _train_step(model: nn.Module, seed: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    ids = _ids(seed)
    loss = F.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------------------------------------------------
# FP8Linear


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("bias", [False, True])
def test_fp8linear_matches_linear(backend, bias):
    _skip_unless_runnable(backend)
    g = torch.Generator().manual_seed(2)
    linear = nn.Linear(272, 144, bias=bias).to(DEVICE)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(144, 272, generator=g) * 0.05)
    x = (torch.randn(3, 11, 272, generator=g) * torch.logspace(-1, 1, 272)).to(DEVICE)
    layer = FP8Linear.from_linear(linear, backend=backend)
    assert layer.weight_q.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    with torch.no_grad():
        ref = linear(x)
        for dtype in (torch.float32, torch.bfloat16):
            y = layer(x.to(dtype))
            assert y.shape == (3, 11, 144) and y.dtype == dtype
            assert snr_db(ref, y) > SNR_FLOOR_DB[backend] - (1.0 if dtype == torch.bfloat16 else 0.0)


@pytest.mark.parametrize("out_features", [160, 256])  # ragged (cublas falls back to Triton) and whole 128-blocks
def test_block_backends_agree_with_the_reference(out_features):
    """triton (interpreter on CPU), torchao, cublas (GPU) and auto compute what the torch reference computes, up to
    summation order, Hopper's FP8 accumulation (BLOCK_FP32_TOL) and bf16 output rounding."""
    g = torch.Generator().manual_seed(4)
    linear = nn.Linear(384, out_features, bias=False).to(DEVICE)
    x = torch.randn(37, 384, generator=g).to(DEVICE)
    ref_layer = FP8Linear.from_linear(linear, backend="torch")
    ref = ref_layer(x)
    for backend in ("triton", "torchao", "cublas", "auto"):
        if backend in RUNNABLE:
            layer = FP8Linear.from_linear(linear, backend=backend)
            _assert_same_tensors(dict(layer.named_buffers()), dict(ref_layer.named_buffers()))
            with torch.no_grad():  # the backend's own output dtype (FP8Linear would cast bf16 back to x's fp32)
                y = BACKENDS[backend].forward(x, layer)
            tol = BLOCK_FP32_TOL if y.dtype == torch.float32 else 1e-2
            torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_fp8linear_rejects_bad_shapes_and_inputs():
    with pytest.raises(FP8LayerError, match=r"'proj'.*in_features=20.*multiples of 16.*exclude"):
        FP8Linear(20, 64, name="proj")
    layer = FP8Linear(64, 32)
    with pytest.raises(ValueError, match=r"expected input \[\.\.\., 64\]"):
        layer(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="weight must have shape"):
        layer.load_weight_(torch.zeros(64, 32))


def test_dtype_casts_keep_the_fp8_buffers():
    layer = FP8Linear(32, 48, bias=True)
    layer.to(torch.float16).float()
    assert layer.weight_q.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    assert layer.bias.dtype == torch.float32


# ----------------------------------------------------------------------------------------------------------------------
# quantize_model


@pytest.mark.parametrize("backend", ["torch", "scaled_mm"])
def test_quantize_model_replaces_exactly_the_projections(backend):
    _skip_unless_runnable(backend)
    master = _toy()
    before = {n: t.clone() for n, t in _state(master).items()}
    rollout = quantize_model(master, backend=backend)

    assert _fp8_names(rollout) == EXPECTED_FP8  # block-level ff_out replaced, the head transformer.ff_out kept
    assert type(rollout.transformer.ff_out) is nn.Linear and type(rollout.transformer.wte) is nn.Embedding
    assert all(m.backend == backend for m in rollout.modules() if isinstance(m, FP8Linear))
    assert not any(isinstance(m, FP8Linear) for m in master.modules())  # the master is untouched …
    _assert_same_tensors(_state(master), before)
    master_ptrs = {t.data_ptr() for t in _state(master).values()}
    assert not master_ptrs & {t.data_ptr() for t in _state(rollout).values()}  # … and shares no memory with the copy
    assert not any(p.requires_grad for p in rollout.parameters()) and not rollout.training

    with torch.no_grad():
        assert snr_db(master(_ids()), rollout(_ids())) > MODEL_SNR_FLOOR_DB


def test_quantize_model_exclude_predicate_and_models_without_a_head_method():
    master = _toy()
    rollout = quantize_model(master, exclude=lambda name: name.endswith("attn_out") or ".1." in name)
    assert _fp8_names(rollout) == {f"transformer.blocks.0.{p}" for p in PROJECTIONS if p != "attn_out"}

    class Bare(nn.Module):  # no get_output_embeddings: every linear is quantised, the head too
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(32, 32), nn.Linear(32, 48)

    assert _fp8_names(quantize_model(Bare())) == {"body", "head"}


def test_quantize_model_errors_name_the_layer_and_the_alternatives():
    master = _toy()
    master.transformer.blocks[1].q_proj = nn.Linear(20, 64, bias=False)  # in_features not a multiple of 16
    with pytest.raises(FP8LayerError, match=r"'transformer\.blocks\.1\.q_proj'.*exclude=lambda"):
        quantize_model(master)
    rollout = quantize_model(master, exclude=lambda name: name == "transformer.blocks.1.q_proj")
    assert "transformer.blocks.1.q_proj" not in _fp8_names(rollout)

    with pytest.raises(FP8BackendError, match=r"unknown FP8 backend 'fp4'; known backends: torch, triton"):
        quantize_model(_toy(), backend="fp4")
    if DEVICE.type == "cpu":
        expected = r"'torchao' cannot run on cpu: .*CUDA.*Backends that run on cpu: torch"
        with pytest.raises(FP8BackendError, match=expected):
            quantize_model(_toy(), backend="torchao")


# ----------------------------------------------------------------------------------------------------------------------
# sync_weights


@pytest.mark.parametrize("backend", ["torch", "scaled_mm"])
def test_sync_after_an_optimizer_step_equals_a_fresh_quantisation_in_place(backend):
    _skip_unless_runnable(backend)
    master = _toy()
    rollout = quantize_model(master, backend=backend)
    stale = {n: t.clone() for n, t in _state(rollout).items()}
    ptrs = {n: t.data_ptr() for n, t in _state(rollout).items()}

    _train_step(master, seed=3)
    sync_weights(master, rollout)

    _assert_same_tensors(_state(rollout), _state(quantize_model(master, backend=backend)))
    assert {n: t.data_ptr() for n, t in _state(rollout).items()} == ptrs  # nothing reallocated
    same = {n for n, t in _state(rollout).items() if torch.equal(t.view(torch.uint8), stale[n].view(torch.uint8))}
    changed = set(stale) - same
    assert "transformer.blocks.0.q_proj.weight_q" in changed and "transformer.wte.weight" in changed


def test_sync_rejects_mismatched_models():
    rollout = quantize_model(_toy())
    with pytest.raises(KeyError, match="no linear layer"):
        sync_weights(_toy(layers=1), rollout)


def test_sync_from_a_lora_master():
    """Master = peft LoRA over the toy model (LoRA on q/v/ff_out, which also hits the LM head). The rollout copy,
    made from the plain model or from the peft model, syncs to exactly quantize_model(merge_and_unload(master))."""
    peft = pytest.importorskip("peft")
    base = _toy()
    rollout_plain = quantize_model(base)  # before LoRA is injected into `base`
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "ff_out"], init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):  # peft draws the adapters from the global RNG: fix them
        torch.manual_seed(1)
        master = peft.get_peft_model(base, config)
    rollout_peft = quantize_model(master)
    assert {n.removeprefix("base_model.model.") for n in _fp8_names(rollout_peft)} == EXPECTED_FP8
    head = rollout_peft.base_model.model.transformer.ff_out
    assert not isinstance(head, FP8Linear) and hasattr(head, "lora_A")  # the LoRA head stays BF16 with its adapter
    ptrs = {n: t.data_ptr() for n, t in _state(rollout_plain).items()}

    _train_step(master, seed=5)  # updates only the adapters
    before = {n: t.clone() for n, t in _state(master).items()}
    sync_weights(master, rollout_plain)
    sync_weights(master, rollout_peft)
    _assert_same_tensors(_state(master), before)  # nothing merged into the master
    assert not any(m.merged for m in master.modules() if hasattr(m, "merged"))

    expected = _state(quantize_model(copy.deepcopy(master).merge_and_unload()))
    _assert_same_tensors(_state(rollout_plain), expected)
    assert {n: t.data_ptr() for n, t in _state(rollout_plain).items()} == ptrs
    from_peft = {n.removeprefix("base_model.model."): t for n, t in _state(rollout_peft).items()}
    shared = [n for n in expected if n != "transformer.ff_out.weight"]  # all but the head, which stays LoRA there
    _assert_same_tensors({n: from_peft[n] for n in shared}, {n: expected[n] for n in shared})
    master_head = {n: t for n, t in _state(master).items() if ".transformer.ff_out." in n}
    _assert_same_tensors({n: t for n, t in _state(rollout_peft).items() if n in master_head}, master_head)
    with torch.no_grad():
        logits = master(_ids())
        assert snr_db(logits, rollout_plain(_ids())) > MODEL_SNR_FLOOR_DB
        assert snr_db(rollout_plain(_ids()), rollout_peft(_ids())) > 40.0  # merged vs runtime LoRA head, both BF16


def test_bench_script_smoke_sync(tmp_path):
    """scripts/bench_fp8.py --smoke --bench sync writes JSON lines with the environment and the metrics."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_fp8.py"
    spec = importlib.util.spec_from_file_location("bench_fp8", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "fp8.jsonl"
    bench.main(["--smoke", "--bench", "sync", "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["metric"] for r in records} == {"copy_bandwidth_GBps", "floor_ms", "quantize_model_ms", "sync_weights_ms"}
    assert all(
        r["status"] == "ok" and r["value"] > 0 and {"device", "torch", "git_sha", "shape"} <= r.keys() for r in records
    )
