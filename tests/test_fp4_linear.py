"""The emulated FP4 rollout copy: FP4Linear against its plain reference, which layers of the tiny LLaDA are
quantised, how far FP4 moves the log-probabilities compared with FP8, the in-place sync (with LoRA), dtype casts.

mean |Δ log p| per token (tiny LLaDA `tiny_model(seed)`, random N(0, 0.02²) weights; B = 16 left-padded random
prompts, L = 32 random completion tokens; log-softmax at the completion tokens, every completion token masked or a
random half; copy vs its master on the same input), measured on CPU (torch 2.13), seeds 0–3, float32 and bf16:
    FP8 (e4m3, 1×128 / 128×128)   0.98e-2 – 1.28e-2
    NVFP4                         3.43e-2 – 4.81e-2
    MXFP4                         4.02e-2 – 4.96e-2
Seed 0, float32, all masked: FP8 1.14e-2, NVFP4 4.50e-2, MXFP4 4.78e-2. The test asserts FP4 > 2 × FP8 (measured
ratio 3.1–4.5) and FP4 < 0.15. In training (`dllm-ais train --rollout-precision R [--fp4-format F] --steps 20`, the
tiny-cpu default after its SFT warm-up, means over the 20 steps): ais/divergence D = mean|ℓ|/L FP8 0.0087, NVFP4
0.042, MXFP4 0.039; mismatch/k3 FP8 0.0004, NVFP4 0.0106, MXFP4 0.0045; ais/lambda 0.56, 0.92, 0.91.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dllm_ais import metrics as M
from dllm_ais.config import FP4_FORMATS, TrainConfig
from dllm_ais.fp4 import FORMATS, FP4Linear, quantize_model, sync_weights
from dllm_ais.fp8 import quantize_model as quantize_model_fp8
from dllm_ais.models.llada.model import LORA_TARGETS, lora_target_regex
from dllm_ais.models.tiny import tiny_model
from dllm_ais.presets import get_preset
from dllm_ais.train.job import run_training
from dllm_ais.train.run_dir import RunDir

MASK, EOS = 4, 1
B, P, L = 16, 16, 32
FMTS = list(FORMATS)


def _prompts(seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts: ids [B, P] (character tokens 5..100, EOS padding), mask [B, P] bool."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 101, (B, P), generator=g)
    lengths = torch.randint(4, P + 1, (B,), generator=g)
    mask = torch.arange(P)[None, :] >= (P - lengths)[:, None]
    return torch.where(mask, ids, EOS), mask


@torch.no_grad()
def _completion_logprobs(model, completion: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """log p(completion_j | prompt, completion with `masked` positions replaced by MASK) -> [B, L] float32."""
    ids, mask = _prompts()
    x = torch.cat([ids, torch.where(masked, MASK, completion)], dim=1)  # [B, P + L]
    attn = torch.cat([mask, torch.ones_like(masked)], dim=1)
    logits = model(x, attention_mask=attn, positions=slice(P, None)).logits.float()  # [B, L, V]
    return logits.log_softmax(-1).gather(-1, completion[..., None]).squeeze(-1)


# ----------------------------------------------------------------------------------------------------------------------
# the layer


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("k,n,bias", [(64, 48, False), (40, 16, True), (7, 5, True)])
def test_fp4linear_equals_fake_quantised_operands(fmt, k, n, bias):
    g = torch.Generator().manual_seed(k + n)
    linear = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=g))
        if bias:
            linear.bias.copy_(torch.randn(n, generator=g))
    x = torch.randn(2, 3, k, generator=g)
    layer = FP4Linear.from_linear(linear, fmt)
    fmt_ = FORMATS[fmt]
    expected = fmt_.fake_act(x.reshape(-1, k)) @ fmt_.fake_weight(linear.weight).t()  # [6, n]
    if bias:
        expected = expected + linear.bias
    assert torch.equal(layer(x), expected.reshape(2, 3, n).detach())
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    # it really is lossy: not the exact linear
    assert not torch.allclose(layer(x), linear(x), rtol=1e-3, atol=1e-3)


def test_fp4linear_rejects_bad_inputs():
    with pytest.raises(ValueError, match="unknown FP4 format 'fp4'; known formats: nvfp4, mxfp4"):
        FP4Linear(16, 16, fmt="fp4")
    layer = FP4Linear(32, 16)
    with pytest.raises(ValueError, match=r"expected input \[..., 32\]"):
        layer(torch.zeros(2, 16))
    with pytest.raises(ValueError, match="weight must have shape"):
        layer.load_weight_(torch.zeros(16, 16))
    with pytest.raises(ValueError, match="bias mismatch"):
        layer.load_weight_(torch.zeros(16, 32), torch.zeros(16))


def test_dtype_casts_keep_the_fp32_buffers():
    model = quantize_model(tiny_model(seed=0), "nvfp4")
    before = model.model.transformer.blocks[0].q_proj.weight_dq.clone()
    model.bfloat16()
    layer = model.model.transformer.blocks[0].q_proj
    assert layer.weight_dq.dtype == torch.float32 and torch.equal(layer.weight_dq, before)
    assert model.model.transformer.wte.weight.dtype == torch.bfloat16  # everything else follows the cast


def test_config_and_module_agree_on_the_formats():
    assert tuple(FORMATS) == FP4_FORMATS
    assert TrainConfig(rollout_precision="fp4", fp4_format="mxfp4").fp4_format == "mxfp4"
    with pytest.raises(ValueError, match="fp4_format='int4': use one of nvfp4, mxfp4"):
        TrainConfig(fp4_format="int4")


# ----------------------------------------------------------------------------------------------------------------------
# the tiny LLaDA


@pytest.mark.parametrize("fmt", FMTS)
def test_block_linears_are_fp4_head_and_embeddings_stay(fmt):
    model = tiny_model(seed=0)
    fp4 = quantize_model(model, fmt)
    expected = {f"model.transformer.blocks.{i}.{name}" for i in range(model.config.n_layers) for name in LORA_TARGETS}
    assert {n for n, m in fp4.named_modules() if isinstance(m, FP4Linear)} == expected
    assert all(m.fmt == fmt for m in fp4.modules() if isinstance(m, FP4Linear))
    t = fp4.model.transformer
    assert type(t.ff_out) is nn.Linear and fp4.get_output_embeddings() is t.ff_out and type(t.wte) is nn.Embedding
    assert not any(isinstance(m, FP4Linear) for m in model.modules())
    fp4_state = fp4.state_dict()
    for name, tensor in model.state_dict().items():
        if name.removesuffix(".weight") not in expected:
            assert torch.equal(fp4_state[name], tensor), name
    assert not fp4.training and not any(p.requires_grad for p in fp4.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("masking", ["all", "half"])
def test_fp4_moves_log_probs_more_than_fp8(dtype, masking):
    model = tiny_model(seed=0, dtype=dtype)
    completion = torch.randint(5, 101, (B, L), generator=torch.Generator().manual_seed(5))
    if masking == "all":
        masked = torch.ones(B, L, dtype=torch.bool)
    else:
        masked = torch.rand(B, L, generator=torch.Generator().manual_seed(7)) < 0.5
    ref = _completion_logprobs(model, completion, masked)
    copies = {"fp8": quantize_model_fp8(model)} | {fmt: quantize_model(model, fmt) for fmt in FMTS}
    delta = {name: (_completion_logprobs(c, completion, masked) - ref).abs()[masked].mean().item()
             for name, c in copies.items()}
    for fmt in FMTS:
        assert 2 * delta["fp8"] < delta[fmt] < 0.15, delta


@pytest.mark.parametrize("fmt", FMTS)
def test_qwen_block_linears_are_fp4_and_the_head_stays(fmt):
    pytest.importorskip("transformers")
    from dllm_ais.models.qwen.model import tiny_qwen

    model = tiny_qwen(seed=0)
    fp4 = quantize_model(model, fmt)
    projections = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj")
    expected = {f"model.layers.{i}.{name}" for i in range(model.config.num_hidden_layers) for name in projections}
    assert {n for n, m in fp4.named_modules() if isinstance(m, FP4Linear)} == expected
    assert type(fp4.lm_head) is nn.Linear and fp4.get_output_embeddings() is fp4.lm_head
    ids = torch.randint(5, 101, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, out = model(ids).logits, fp4(ids).logits
    assert torch.isfinite(out).all() and not torch.allclose(out, ref, atol=1e-4)
    assert (out.log_softmax(-1) - ref.log_softmax(-1)).abs().mean() < 0.15


# ----------------------------------------------------------------------------------------------------------------------
# sync


def _train_step(master: nn.Module, seed: int) -> None:
    ids, mask = _prompts()
    x = torch.cat([ids, torch.full((B, L), MASK)], dim=1)
    attn = torch.cat([mask, torch.ones(B, L, dtype=torch.bool)], dim=1)
    target = torch.randint(5, 101, (B, L), generator=torch.Generator().manual_seed(seed))
    params = [p for p in master.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    master.train()
    logits = master(x, attention_mask=attn, positions=slice(P, None)).logits.float()
    nn.functional.cross_entropy(logits.transpose(1, 2), target).backward()
    optimizer.step()
    master.eval()


@pytest.mark.parametrize("fmt", FMTS)
def test_sync_from_a_lora_master_equals_a_fresh_quantisation_in_place(fmt):
    """Master = peft LoRA over the tiny LLaDA's block linears (as train_job makes it). After an optimizer step on the
    adapters, sync_weights refills the copy in place to exactly quantize_model(merge_and_unload(master))."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex())
    with torch.random.fork_rng(devices=[]):  # peft draws the adapters from the global RNG: fix them
        torch.manual_seed(0)
        master = peft.get_peft_model(tiny_model(seed=1), config)
    rollout = quantize_model(master, fmt)
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    stale = {n: t.clone() for n, t in rollout.state_dict().items()}
    _train_step(master, seed=3)  # lora_B moves away from 0: the merged weights change
    sync_weights(master, rollout)
    fresh = quantize_model(master.merge_and_unload(), fmt).state_dict()
    state = {n.removeprefix("base_model.model."): t for n, t in rollout.state_dict().items()}
    assert state.keys() == fresh.keys()
    for name, tensor in state.items():
        assert torch.equal(tensor, fresh[name]), name
    assert all(rollout.state_dict()[n].data_ptr() == p for n, p in ptrs.items()), "a buffer was reallocated"
    changed = [n for n, t in rollout.state_dict().items() if not torch.equal(t, stale[n])]
    assert any(n.endswith("weight_dq") for n in changed)


# ----------------------------------------------------------------------------------------------------------------------
# training


GRADED_REWARD = (
    "def reward(prompts, completions, **columns):\n"
    "    texts = [c if isinstance(c, str) else c[0]['content'] for c in completions]  # TRL: chat form\n"
    "    return [sum(ch.isdigit() for ch in c) / 4 for c in texts]\n"  # graded: groups have spread
)


@pytest.mark.parametrize("preset,fmt", [("tiny-cpu", "nvfp4"), ("tiny-cpu", "mxfp4"), ("tiny-qwen", "mxfp4")])
def test_three_steps_of_training_with_fp4_rollouts(tmp_path, monkeypatch, preset, fmt):
    name = f"graded_reward_fp4_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(GRADED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    p = get_preset(preset)
    train = replace(p.train, steps=3, prompts_per_step=2, sft_steps=3, sft_batch_size=8, mismatch_num_draws=2,
                    rollout_precision="fp4", fp4_format=fmt, reward_fn=f"{name}:reward")
    run = tmp_path / "run"
    run_training(replace(p, train=train, grpo=replace(p.grpo, num_generations=4)), run, progress=False)
    rows = M.read_metrics(run)
    assert [r[M.STEP] for r in rows] == [0, 1, 2]
    for row in rows:
        for key in (M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.MISMATCH_KL, M.REWARD_MEAN):
            assert isinstance(row[key], float) and math.isfinite(row[key]), key
    assert any(r[M.AIS_DIVERGENCE] > 0 for r in rows)  # the rollout policy really differs from the master
    start = load_file(str(run / "sft" / "model.safetensors"))
    end = load_file(str(RunDir(run).latest() / "model" / "model.safetensors"))
    weights = [k for k in start if start[k].dim() == 2]  # linears and embeddings
    assert len(weights) >= 16 and all(not torch.equal(start[k], end[k]) for k in weights)


def test_cli_flags(capsys):
    from dllm_ais.cli import _train_preset, build_parser, main

    args = build_parser().parse_args(["train", "--rollout-precision", "fp4", "--fp4-format", "mxfp4"])
    train = _train_preset(args).train
    assert (train.rollout_precision, train.fp4_format) == ("fp4", "mxfp4")
    assert _train_preset(build_parser().parse_args(["train"])).train.fp4_format == "nvfp4"
    assert main(["sample", "--fp4", "--fp4-format", "mxfp4", "--prompt", "1+1=", "--gen-length", "8",
                 "--steps", "4"]) == 0
    assert "### 1+1=" in capsys.readouterr().out
    assert main(["sample", "--fp4", "--fp8"]) == 2
    assert "not both" in capsys.readouterr().err
