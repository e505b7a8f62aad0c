"""A plan: memory and time of one RL step of a preset on a GPU kind, whether it fits, and what fixes it.

`make_plan` puts the pieces together (shape.py from meta-device models, workload.py, memory.py, flops.py, rates.py);
`fixes` re-plans with changes (more micro-batches, gradient checkpointing, LoRA, FP8 instead of FP4 rollouts, FSDP
over more GPUs; alone, else combined) and keeps those that fit; `speedups` re-plans with BF16 rollouts on a GPU without
FP8 and with Fast-dLLM's dual cache. report.py renders a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dllm_ais.families import get_family

from .flops import PassCost, pass_cost
from .memory import GiB, MemoryPlan, predict_memory
from .rates import GPUS, SYNC_OVER_FLOOR, Rates, rates, usable_bytes
from .shape import ModelShape, model_shape, rollout_copy_bytes
from .workload import Workload, step_passes, workload_from_preset


@dataclass(frozen=True)
class Fix:
    """One change that brings the predicted peak under the usable memory."""

    flag: str
    """What to pass or set (the `dllm-ais plan` flag that models it, and where it lives for `train`)."""
    peak_gib: float
    """Predicted peak per GPU with the change."""
    seconds_per_step: float
    """Predicted seconds per step with the change."""


@dataclass(frozen=True)
class Plan:
    """Everything `dllm-ais plan` prints."""

    preset: str
    """Preset name."""
    gpu: str
    """GPU kind (h100, h200, a100)."""
    shape: ModelShape
    """The model, from its meta-device build."""
    workload: Workload
    """What one step runs on one GPU."""
    memory: MemoryPlan
    """Bytes per GPU by part."""
    costs: tuple[PassCost, ...]
    """FLOPs of every pass of the step."""
    rates: Rates
    """FLOP/s and bytes/s used, with their source."""
    seconds: dict
    """Seconds per step by phase: rollout, likelihood, train, optimizer, sync."""
    usable_gib: float
    """Memory a run may use on this GPU (rates.usable_bytes)."""
    notes: tuple[str, ...]
    """Caveats specific to this plan."""
    device: str = "cuda"
    """The code path planned: cuda (compiled sampler, fused FP8 copy) or cpu (the tests' measurements)."""

    @property
    def fits(self) -> bool:
        return self.memory.peak <= self.usable_gib * GiB

    @property
    def seconds_per_step(self) -> float:
        return sum(self.seconds.values())


def pass_rate(model: str, w: Workload, r: Rates) -> float:
    """FLOP/s of a pass on `model`: the rollout copy's precision for the rollout policy, else the BF16 master's."""
    return r.rollout[w.rollout_precision] if model == "rollout" else r.master


def _seconds(shape: ModelShape, w: Workload, costs: list[PassCost], r: Rates) -> dict:
    out = {"rollout": 0.0, "likelihood": 0.0, "train": 0.0}
    for c in costs:
        out[c.passes.phase] += c.flops / pass_rate(c.passes.model, w, r)
    trained = shape.lora_params(w.lora_r) if w.lora_r else shape.params_total
    shard = w.gpus if w.fsdp else 1
    per_param = 28 + (12 if (not w.lora_r and w.param_bytes < 4 and not w.fsdp) else 0)  # AdamW (+ fp32 copies)
    out["optimizer"] = w.num_iterations * trained * per_param / shard / r.hbm
    out["sync"] = 0.0 if w.rollout_precision == "bf16" else sync_bytes(shape, w.lora_r) / r.hbm * SYNC_OVER_FLOOR
    return out


def sync_bytes(shape: ModelShape, lora_r: int = 0, master_bytes: int = 2) -> float:
    """Bytes one BF16 → FP8 sync of the fused copy moves: each block linear read (and with LoRA merged: written and
    read once more) and written as e4m3 codes; embeddings, norms and LM head copied (read + write)."""
    linear = shape.params_block_linear * (master_bytes + 1 + (2 * master_bytes if lora_r else 0))
    rest = (shape.params_total - shape.params_block_linear) * 2 * master_bytes
    return linear + rest


def _notes(shape: ModelShape, w: Workload, costs: list[PassCost], r: Rates) -> list[str]:
    notes = list(r.notes)
    if w.threshold is not None:
        notes.append("--threshold: NFE depends on the model's confidence; the fixed schedule's steps bound it (time "
                     "is an upper bound for the rollout).")
    if w.rollout_precision == "fp4":
        notes.append("fp4 rollouts are emulated (fp32 matmuls): no speedup without Blackwell FP4 tensor cores.")
    small = [c.passes.what for c in costs if c.passes.rows * c.passes.tokens < 2048]
    if small:
        notes.append(f"GEMMs of fewer than 2048 rows ({', '.join(dict.fromkeys(small))}) run below the measured "
                     "shape's efficiency: their time is a lower bound.")
    if shape.params_total < 1e8:
        notes.append("a model this small is bound by kernel launches and Python, not FLOPs: its seconds mean "
                      "nothing (its memory does).")
    if w.fsdp and not w.lora_r:
        notes.append("FSDP2 full fine-tuning: fp32 sharded master, bf16 compute (pass --dtype float32 and "
                     "mixed_precision bf16: 16-bit shards are refused); while the FP8 copy is made, before sharding, "
                     "every GPU holds the whole fp32 master for a moment.")
    if w.gpus > 1:
        notes.append("communication between GPUs (gradient all-reduce, FSDP gathers) is not modelled.")
    if w.gradient_checkpointing:
        notes.append("gradient checkpointing: modelled as models/llada/model.py does it; `dllm-ais train` has no flag "
                     "for it yet.")
    return notes


def make_plan(preset, gpu: str = "h100", gpus: int = 1, *, prompt_len: int | None = None, fsdp: bool | None = None,
              gradient_checkpointing: bool = False, device: str = "cuda", root=None) -> Plan:
    """The plan of one RL step of `preset` on `gpus` GPUs of kind `gpu` (h100, h200, a100). device "cpu" plans the
    CPU code path (no compiled sampler, the master's working set for the rollout copy) for the tests' measurements;
    root: where the benchmark rows live (default benchmarks/gpu/)."""
    if gpu not in GPUS:
        raise ValueError(f"--gpu {gpu}: use one of {', '.join(GPUS)}.")
    shape = model_shape(preset.model)
    w = workload_from_preset(preset, prompt_len=prompt_len, gpus=gpus, fsdp=fsdp,
                             gradient_checkpointing=gradient_checkpointing, device=device)
    return _plan(preset, gpu, shape, w, device, root)


def _plan(preset, gpu: str, shape: ModelShape, w: Workload, device: str = "cuda", root=None) -> Plan:
    # the copy keeps embeddings, norms and LM head in the master's stored dtype (fp32 shards under FSDP)
    stored = {4: "float32", 8: "float64"}.get(w.param_bytes, preset.model.dtype)
    copy = rollout_copy_bytes(replace(preset.model, dtype=stored), w.rollout_precision, preset.train.fp8_backend)
    memory = predict_memory(shape, w, copy, fused_copy=device == "cuda" and get_family(shape.family).fused_producers)
    costs = [pass_cost(shape, p, w) for p in step_passes(w)]
    r = rates(gpu) if root is None else rates(gpu, root)
    return Plan(preset.name, gpu, shape, w, memory, tuple(costs), r, _seconds(shape, w, costs, r),
                usable_bytes(GPUS[gpu]) / GiB, tuple(_notes(shape, w, costs, r)), device)


def _replan(plan: Plan, preset, **workload) -> Plan:
    """`plan` again for a changed preset and workload options (the same prompt length and code path)."""
    w = plan.workload
    kw = dict(prompt_len=w.prompt_len, gpus=w.gpus, fsdp=w.fsdp, gradient_checkpointing=w.gradient_checkpointing)
    kw.update(workload)
    new = workload_from_preset(preset, device=plan.device, **kw)
    return _plan(preset, plan.gpu, plan.shape, new, plan.device)


def _state_changes(plan: Plan, preset) -> list[tuple[str, object, dict]]:
    """Changes of what the GPU holds besides activations: none, LoRA (for full fine-tuning or a high rank), FP8
    instead of emulated FP4 rollouts, FSDP2 over more GPUs (fp32 shards for full fine-tuning)."""
    w, tc = plan.workload, preset.train
    out = [("", preset, {})]
    for r in ((128, 64) if w.lora_r == 0 else (w.lora_r // 2,) if w.lora_r > 64 else ()):
        out.append((f"--lora-r {r}", replace(preset, train=replace(tc, lora_r=r)), {"fsdp": False}))
    if w.rollout_precision == "fp4":
        out.append(("--rollout-precision fp8", replace(preset, train=replace(tc, rollout_precision="fp8")), {}))
    for n in (2, 4, 8):
        if n > w.gpus:
            model = replace(preset.model, dtype="float32") if not w.lora_r else preset.model
            how = "--dtype float32, " if not w.lora_r else ""
            out.append((f"FSDP2 over {n} GPUs (--gpus {n}: accelerate launch with docs/accelerate/fsdp2.yaml, {how}"
                        f"num_processes {n})", replace(preset, model=model), {"gpus": n, "fsdp": True}))
    return out


def fixes(plan: Plan, preset, most: int = 4) -> list[Fix]:
    """Changes that make `plan` fit, each re-planned in full. The fewest changes win (single ones when any fits
    alone); among those, the fastest of each kind (the state change of `_state_changes`, in its order — the least
    change to the algorithm first — with or without more micro-batches, with or without checkpointing)."""
    w = plan.workload
    micro = [None, *(m for m in sorted({2, 4, 8, 16, w.rows}) if w.micro_batches < m <= w.rows)]
    found: list[tuple[int, int, Fix]] = []
    for order, (state, changed, kw) in enumerate(_state_changes(plan, preset)):
        for m in micro:
            for ckpt in (False, True) if not w.gradient_checkpointing else (False,):
                parts = [state] * bool(state) + [f"--micro-batches {m}"] * (m is not None)
                parts += ["--gradient-checkpointing"] * ckpt
                if not parts:
                    continue
                p = changed if m is None else replace(changed, train=replace(changed.train,
                                                                               gradient_accumulation_steps=m))
                other = _replan(plan, p, **kw, **({"gradient_checkpointing": True} if ckpt else {}))
                if other.fits:
                    kind = (order, m is not None, ckpt)  # which kinds of change, whatever their values
                    found.append((len(parts), kind, Fix(" + ".join(parts), other.memory.peak / GiB,
                                                        other.seconds_per_step)))
    if not found:
        return []
    fewest = min(n for n, _, _ in found)
    best: dict[tuple, Fix] = {}
    for _, kind, fix in sorted((f for f in found if f[0] == fewest), key=lambda f: f[2].seconds_per_step):
        best.setdefault(kind, fix)
    return [best[k] for k in sorted(best)][:most]


FIX_NOTES = {
    "--micro-batches": "TrainConfig.gradient_accumulation_steps (no `train` flag yet: set it in the preset)",
    "--gradient-checkpointing": "models/llada/model.py supports it; `dllm-ais train` does not switch it on yet",
}
"""What the plan's own flags mean for a run, printed once under the fixes that use them."""


def speedups(plan: Plan, preset) -> list[Fix]:
    """Faster settings worth knowing, kept when the re-plan is faster: BF16 rollouts on a GPU without FP8 tensor
    cores; Fast-dLLM's dual cache with the trajectory estimator replaying one step per block (Horvitz–Thompson
    subsampling: unbiased, noisier) when the sampler runs several steps per block at T > 0."""
    w, tc = plan.workload, preset.train
    tries = []
    if w.rollout_precision == "fp8" and GPUS[plan.gpu].fp8_tflops is None:
        tries.append(("--rollout-precision bf16", replace(preset, train=replace(tc, rollout_precision="bf16"))))
    blocks = w.gen_length // w.block_length
    if w.cache == "none" and w.sampler_steps // blocks >= 2 and preset.sampler.temperature > 0:
        try:
            tries.append((f"--cache dual --mismatch-estimator trajectory --trajectory-steps {blocks} (Fast-dLLM's "
                          "dual cache; the ELBO cannot see a cache)",
                          replace(preset, sampler=replace(preset.sampler, cache="dual"),
                                  train=replace(tc, mismatch_estimator="trajectory", trajectory_steps=blocks))))
        except ValueError:  # the family refuses it (SDAR: its per-block cache is native): no speedup to offer
            pass
    out = []
    for flag, changed in tries:
        other = _replan(plan, changed)
        if other.seconds_per_step < 0.9 * plan.seconds_per_step:
            out.append(Fix(flag, other.memory.peak / GiB, other.seconds_per_step))
    return out
