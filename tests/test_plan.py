"""`dllm-ais plan` from meta-device models: LLaDA-8B's parameter and FLOP counts against the analytic formula (and
torch's own FLOP counter), a preset that cannot fit on one H100, the command's output on h100 / h200 / a100, the
rates' sources, and `predict_quick` against the H200 rows under benchmarks/gpu/."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest
import torch

from dllm_ais.cli import main
from dllm_ais.models.llada.model import LLaDAConfig, LLaDAModelLM
from dllm_ais.plan import fixes, make_plan, predict_quick
from dllm_ais.plan.flops import forward_flops
from dllm_ais.plan.rates import BENCHMARKS, rates
from dllm_ais.plan.shape import model_shape
from dllm_ais.presets import get_preset

D, LAYERS, HEADS, MLP, VOCAB = 4096, 32, 32, 12288, 126464  # DESIGN.md §6
D1 = "llada-8b-gsm8k"


def _analytic_forward(tokens: int, head: int) -> int:
    """One row: the block linears (4d² + 3dh per layer) twice per token, QKᵀ and A·V, the LM head over `head`."""
    return (2 * tokens * LAYERS * (4 * D * D + 3 * D * MLP) + 4 * tokens * tokens * D * LAYERS
            + 2 * head * D * VOCAB)


def test_the_8b_shape_is_the_models_config_and_its_parameters_the_analytic_count():
    config = LLaDAConfig()
    assert (config.d_model, config.n_layers, config.n_heads, config.mlp_hidden_size, config.embedding_size) == (
        D, LAYERS, HEADS, MLP, VOCAB)
    shape = model_shape(get_preset(D1).model)
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.mlp_hidden, shape.vocab) == (D, LAYERS, HEADS, MLP,
                                                                                          VOCAB)
    per_layer = 4 * D * D + 3 * D * MLP + 2 * D  # q, k, v, attn_out, gate, up, down; two RMSNorms
    assert shape.params_total == 2 * VOCAB * D + LAYERS * per_layer + D == 8_015_581_184
    assert shape.params_block_linear == LAYERS * (4 * D * D + 3 * D * MLP)
    assert shape.lora_params(128) == 128 * LAYERS * (4 * 2 * D + 3 * (D + MLP))


def test_lora_parameters_are_what_peft_adds():
    from peft import LoraConfig, get_peft_model

    from dllm_ais.models.llada.model import lora_target_regex
    from dllm_ais.models.tiny import tiny_model

    model = get_peft_model(tiny_model(0), LoraConfig(r=8, lora_alpha=16.0, target_modules=lora_target_regex()))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == model_shape(get_preset("tiny-cpu").model).lora_params(8)


def test_8b_forward_flops_match_the_formula_and_torchs_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    shape = model_shape(get_preset(D1).model)
    B, T, head = 2, 64, 32
    with torch.device("meta"):
        model = LLaDAModelLM(LLaDAConfig())
        ids = torch.zeros(B, T, dtype=torch.long)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, positions=slice(T - head, None))
    assert forward_flops(shape, B, T, T, head) == B * _analytic_forward(T, head) == counter.get_total_flops()
    # the shape gpu_check measures: [32, 320], logits of one 32-token block
    assert forward_flops(shape, 32, 320, 320, 32) / 1e12 == pytest.approx(145.7, abs=0.05)


def test_a_preset_that_cannot_fit_on_one_h100_says_by_how_much_and_what_fixes_it(capsys):
    full = replace(get_preset(D1), train=replace(get_preset(D1).train, lora_r=0))
    plan = make_plan(full, "h100")
    assert not plan.fits and plan.memory.peak_phase == "train"
    found = fixes(plan, full)
    assert found and found[0].flag == "--lora-r 128"
    assert all(f.peak_gib <= plan.usable_gib for f in found)
    assert make_plan(replace(full, train=replace(full.train, lora_r=128)), "h100").fits  # what the fix promised
    assert main(["plan", "--preset", D1, "--lora-r", "0"]) == 0
    out = capsys.readouterr().out
    over = plan.memory.peak / 2**30 - plan.usable_gib
    assert f"DOES NOT FIT: over by {over:.1f} GiB" in out and "--lora-r 128: peak" in out


def test_full_fine_tuning_of_the_instruct_preset_needs_changes_combined():
    plan = make_plan(get_preset("llada-8b-instruct"), "h100")
    found = fixes(plan, get_preset("llada-8b-instruct"))
    assert not plan.fits and found and all(" + " in f.flag for f in found)  # no single change fits 64 rows
    assert all(f.peak_gib <= plan.usable_gib for f in found)


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100"])
def test_plan_prints_sensible_numbers_for_the_d1_gsm8k_preset(gpu, capsys):
    assert main(["plan", "--preset", D1, "--gpu", gpu, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    memory = data["memory_gib"]
    assert memory["master"] == pytest.approx(8_015_581_184 * 2 / 2**30)
    assert 8.3 < memory["rollout_copy"] < 8.6  # the fused FP8 copy: e4m3 linears, bf16 embeddings and head
    assert 30 < data["peak_gib"] < 60 and data["fits"]
    assert data["passes"][0]["calls"] == 128 and data["passes"][0]["rows"] == 6  # NFE × (1 prompt × G = 6)
    assert data["seconds"]["rollout"] > data["seconds"]["train"] > 0  # 128 sampler forwards of 6 × 512 tokens
    assert data["seconds_per_step"] > 0 and data["rates"]["source"].startswith("measured" if gpu == "h200" else
                                                                              "datasheet")
    if gpu == "a100":
        assert any("no FP8 tensor cores" in n for n in data["notes"])
        assert data["speedups"][0]["flag"] == "--rollout-precision bf16"


def test_plan_refuses_what_train_would_refuse(capsys):
    assert main(["plan", "--preset", "tiny-qwen"]) == 2
    assert "LLaDA" in capsys.readouterr().err
    assert main(["plan", "--preset", D1, "--cache", "dual"]) == 2  # the ELBO cannot see a cache, as in train
    assert "--mismatch-estimator trajectory" in capsys.readouterr().err


def test_plan_imports_no_torch_until_it_runs():
    import subprocess

    code = "import dllm_ais.plan, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_rates_come_from_rows_of_the_same_gpu_kind_else_the_datasheet(tmp_path):
    rows = [json.loads(line) for line in (BENCHMARKS / "nvidia-h200-20261126" / "rollout-eager.jsonl").open()]
    h100 = tmp_path / "nvidia-h100-20990101"
    h100.mkdir()
    slower = [{**r, "device": "NVIDIA H100 80GB HBM3", "step_ms": r.get("step_ms", 0) * 2} for r in rows]
    (h100 / "rollout-eager.jsonl").write_text("\n".join(json.dumps(r) for r in slower))
    measured, own = rates("h200"), rates("h100", root=tmp_path)
    assert own.source.startswith("measured: benchmarks/gpu/nvidia-h100-20990101")
    assert own.master == pytest.approx(measured.master / 2)  # twice the step time: half the FLOP/s
    assert rates("h100").source.startswith("datasheet") and "H200" in rates("h100").source
    empty = tmp_path / "none"
    empty.mkdir()
    assert "an assumption" in rates("h100", root=empty).source


def test_predict_quick_keys_units_and_sources():
    keys = ("forward_ms_bf16", "forward_ms_fp8", "peak_gib_bf16_master", "peak_gib_fp8_copy",
            "peak_gib_rl_microbatch", "sync_ms_floor", "sync_ms_floor_linears")
    for gpu in ("h100", "h200", "a100"):
        q = predict_quick(gpu)
        assert all(isinstance(q[k], float) and q[k] > 0 for k in keys) and set(keys) <= set(q["sources"])
    h100 = predict_quick("h100")
    # bench_fp8.py's floor: 7.0e9 linear parameters × 3 bytes at 3.35 TB/s
    assert h100["sync_ms_floor_linears"] == pytest.approx(6_979_321_856 * 3 / 3.35e12 * 1e3)
    assert h100["forward_ms_fp8"] < h100["forward_ms_bf16"] and "datasheet" in h100["sources"]["forward_ms_bf16"]


def test_predict_quick_matches_the_h200_rows_peak_memory():
    """The rollout rows of benchmarks/gpu/nvidia-h200-20261126 (batch 32, gen 256): peak memory of the BF16 master
    and of the FP8 (cublas) copy, each alone on the GPU. Measured 21.23 and 14.74 GiB."""
    rows = [json.loads(line) for line in (BENCHMARKS / "nvidia-h200-20261126" / "rollout-eager.jsonl").open()]
    bf16 = next(r for r in rows if r["precision"] == "bf16" and r["model"] == "master")
    fp8 = next(r for r in rows if r.get("backend") == "cublas")
    q = predict_quick("h200")
    assert q["peak_gib_bf16_master"] == pytest.approx(bf16["peak_mem_gib"], rel=0.02)
    assert q["peak_gib_fp8_copy"] == pytest.approx(fp8["peak_mem_gib"], rel=0.02)
    assert q["forward_ms_bf16"] == pytest.approx(bf16["step_ms"], rel=1e-6)  # its own rows set the rate


def test_fsdp_shards_master_gradients_and_optimizer_but_not_the_copy_or_the_activations():
    preset = get_preset("llada-8b-instruct")
    fp32 = replace(preset, model=replace(preset.model, dtype="float32"))
    one, eight = make_plan(fp32, "h100"), make_plan(preset, "h100", 8)
    P = one.shape.params_total
    assert eight.workload.fsdp and not one.workload.fsdp
    assert eight.memory.master == one.memory.master / 8 == P * 4 / 8
    assert eight.memory.optimizer == one.memory.optimizer / 8 and eight.memory.gradients == one.memory.gradients / 8
    assert eight.memory.rollout_copy == one.memory.rollout_copy  # whole on every GPU, made from the fp32 master
    assert eight.workload.rows == one.workload.rows  # every process rolls out its own prompts
    assert any("--dtype float32" in n for n in eight.notes)


def test_each_likelihood_row_says_which_model_it_is(capsys):
    """The coupled mismatch ELBO is two passes on the same draws, one per model: the table names them π_old and μ
    (two identical "mismatch ELBO (4 draws)" rows said neither)."""
    assert main(["plan", "--preset", D1, "--gpu", "h100", "--json"]) == 0
    names = [p["what"] for p in json.loads(capsys.readouterr().out)["passes"] if p["phase"] == "likelihood"]
    assert len(names) == len(set(names)), names
    assert any("ELBO of π_old" in n for n in names) and any("ELBO of μ" in n for n in names), names


def test_plan_applies_the_policy_likelihood_flags(capsys):
    """--policy-logprob, --elbo-draws and --beta reach the plan (before, the plan ignored --policy-logprob): K draws
    multiply π_old, log μ and the update, the update is checkpointed, and β 0 drops the reference."""
    def passes(*flags):
        assert main(["plan", "--preset", D1, "--json", *flags]) == 0
        data = json.loads(capsys.readouterr().out)
        return {p["what"]: p for p in data["passes"]}, data["seconds_per_step"]

    one, t_one = passes()
    elbo, t_elbo = passes("--policy-logprob", "elbo", "--elbo-draws", "4", "--beta", "0")
    assert one["π_old (one-step)"]["calls"] == 12 and elbo["π_old (elbo)"]["calls"] == 12 * 4
    assert elbo["forward + backward (elbo)"]["calls"] == 4 * one["forward + backward (one-step)"]["calls"]
    assert not any("reference" in w for w in elbo) and any("reference" in w for w in one)
    assert t_elbo > t_one
    assert main(["plan", "--preset", D1, "--policy-logprob", "spg"]) == 2  # spg needs β = 0, as train says
