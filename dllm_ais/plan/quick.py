"""The plan's predictions of what `scripts/gpu_check.sh --quick` measures, to print next to the measurements.

`predict_quick(gpu)` -> a dict of floats (units in the key) and `sources` (one note per key: measured rows or datasheet,
and the shape assumed). All at the LLaDA-8B shape (LLaDAConfig defaults), built on the meta device:
  forward_ms_bf16        one BF16 eager forward of the master at [batch, prompt_len + gen_length], logits of one
                         block (what one sampler step runs; scripts/bench_rollout.py's step_ms)
  forward_ms_fp8         the same forward on the fused FP8 copy (the fastest FP8 backend measured, else datasheet)
  peak_gib_bf16_master   peak memory of BF16 master rollouts at that shape: weights + the sampler's largest moment
                         (bench_rollout's peak_mem_gib of the bf16 master row: only the measured model is resident)
  peak_gib_fp8_copy      the same for the FP8 rollout copy alone
  peak_gib_rl_microbatch the master (bf16) with LoRA r=lora_r, its AdamW states and gradients, and the activations
                         of one training micro-batch of micro_rows rows (the one-step estimator, forward + backward)
  sync_ms_floor          bytes one BF16 → FP8 sync of the fused copy moves (block linears read, codes written;
                         embeddings, norms, LM head copied) / HBM bandwidth
  sync_ms_floor_linears  the same for the block linears only (scripts/bench_fp8.py's floor definition)
"""

from __future__ import annotations

from dataclasses import replace

from .flops import forward_flops
from .memory import GiB, fused_working_set, master_working_set, sampling_tail_bytes, train_bytes
from .rates import GPUS, rates
from .workload import Workload

GPU_CHECK_SHAPE = dict(batch=32, prompt_len=64, gen_length=256, block_length=32)
"""The shape gpu_check's forward and rollout sections use (batch 32, canvas 320, block 32)."""


def predict_quick(gpu: str, *, batch: int = 32, prompt_len: int = 64, gen_length: int = 256, block_length: int = 32,
                  temperature: float = 1.0, lora_r: int = 128, micro_rows: int = 3, root=None) -> dict:
    """Predictions for gpu_check --quick on GPU kind `gpu` (h100, h200, a100); module docstring for each key.
    micro_rows: rows of the RL micro-batch (3 = the d1 presets: 1 prompt × 6 generations over 2 micro-batches),
    whose canvas is prompt_len + gen_length."""
    from dllm_ais.config import ModelConfig

    from .predict import sync_bytes
    from .shape import model_shape, rollout_copy_bytes

    if gpu not in GPUS:
        raise ValueError(f"gpu {gpu!r}: use one of {', '.join(GPUS)}.")
    model = ModelConfig(path="GSAI-ML/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda")
    shape = model_shape(model)
    r = rates(gpu) if root is None else rates(gpu, root)
    T = prompt_len + gen_length
    flops = forward_flops(shape, batch, T, T, block_length)
    tail = batch * block_length * shape.vocab * sampling_tail_bytes(temperature, "low_confidence", 2)
    master = shape.params_total * 2
    copy = rollout_copy_bytes(model, "fp8", "cublas")
    rollout_bf16 = max(tail, batch * T * master_working_set(shape, 2))
    rollout_fp8 = max(tail, batch * T * fused_working_set(shape, 2))
    w = Workload(rows=micro_rows, prompt_len=prompt_len, rollout_prompt_len=prompt_len, gen_length=gen_length,
                 block_length=block_length, sampler_steps=gen_length // 2, cache="none", threshold=None, cfg=False,
                 temperature=temperature, remasking="low_confidence", rollout_precision="fp8", param_bytes=2,
                 act_bytes=2, lora_r=lora_r, micro_batches=1, num_iterations=1, beta=0.0, mismatch="elbo",
                 mismatch_draws=4, trajectory_steps=None, bypass=False, gpus=1, fsdp=False,
                 gradient_checkpointing=False, train_steps=1)
    lora = shape.lora_params(lora_r)
    microbatch = master + lora * (4 + 8 + 4) + train_bytes(shape, w, checkpointed=False)
    linears_only = replace(shape, params_total=shape.params_block_linear)
    shape_note = f"LLaDA-8B at [{batch}, {T}], logits of {block_length} positions"
    peak_note = f"{shape_note}, T = {temperature}, low-confidence remasking; memory.py's model (no rates)"
    return {
        "gpu": gpu, "gpu_name": GPUS[gpu].name,
        "forward_ms_bf16": flops / r.master * 1e3, "forward_ms_fp8": flops / r.rollout["fp8"] * 1e3,
        "peak_gib_bf16_master": (master + rollout_bf16) / GiB, "peak_gib_fp8_copy": (copy + rollout_fp8) / GiB,
        "peak_gib_rl_microbatch": microbatch / GiB,
        "sync_ms_floor": sync_bytes(shape) / r.hbm * 1e3,
        "sync_ms_floor_linears": sync_bytes(linears_only) / r.hbm * 1e3,
        "sources": {
            "forward_ms_bf16": f"{flops / 1e12:.1f} TFLOP ({shape_note}) / BF16 eager rate; rates: {r.source}",
            "forward_ms_fp8": f"{flops / 1e12:.1f} TFLOP / FP8 rollout rate; rates: {r.source}",
            "peak_gib_bf16_master": f"bf16 weights {master / GiB:.2f} GiB + sampler {rollout_bf16 / GiB:.2f} GiB "
                                    f"({peak_note})",
            "peak_gib_fp8_copy": f"fused FP8 copy {copy / GiB:.2f} GiB (meta build) + sampler {rollout_fp8 / GiB:.2f} "
                                 f"GiB ({peak_note})",
            "peak_gib_rl_microbatch": f"bf16 master + LoRA r={lora_r} (fp32 adapters, gradients, AdamW) + one "
                                      f"micro-batch of {micro_rows} rows × {T} tokens (head over {gen_length}), "
                                      "no checkpointing; memory.py's model (no rates)",
            "sync_ms_floor": f"{sync_bytes(shape) / 1e9:.1f} GB moved / HBM {r.hbm / 1e12:.2f} TB/s (datasheet)",
            "sync_ms_floor_linears": f"{sync_bytes(linears_only) / 1e9:.1f} GB moved / HBM {r.hbm / 1e12:.2f} "
                                     "TB/s (datasheet)",
        },
    }
