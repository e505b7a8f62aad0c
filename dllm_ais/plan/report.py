"""A Plan as text (what `dllm-ais plan` prints) and as JSON-ready data (`--json`)."""

from __future__ import annotations

from dataclasses import asdict

from .memory import GiB
from .predict import FIX_NOTES, Plan, fixes, pass_rate, speedups
from .rates import GPUS


def plan_dict(plan: Plan, preset) -> dict:
    """The plan as JSON-ready data: memory in GiB, seconds, FLOPs (TFLOP), rates and their source, fixes."""
    m = plan.memory
    return {
        "preset": plan.preset, "gpu": plan.gpu, "gpu_name": GPUS[plan.gpu].name, "gpus": plan.workload.gpus,
        "model": asdict(plan.shape), "workload": asdict(plan.workload),
        "memory_gib": {k: v / GiB for k, v in asdict(m).items() if isinstance(v, float)},
        "phase_peak_gib": {k: v / GiB for k, v in m.phases.items()}, "peak_gib": m.peak / GiB,
        "peak_phase": m.peak_phase, "usable_gib": plan.usable_gib, "fits": plan.fits,
        "over_by_gib": max(0.0, m.peak / GiB - plan.usable_gib),
        "passes": [{**asdict(c.passes), "forward_tflop": c.forward_flops / 1e12,
                    "backward_tflop": c.backward_flops / 1e12} for c in plan.costs],
        "seconds": plan.seconds, "seconds_per_step": plan.seconds_per_step,
        "run_hours": plan.seconds_per_step * plan.workload.train_steps / 3600,
        "rates": {"master_tflops": plan.rates.master / 1e12,
                  "rollout_tflops": {k: v / 1e12 for k, v in plan.rates.rollout.items()},
                  "hbm_tbps": plan.rates.hbm / 1e12, "source": plan.rates.source},
        "fixes": [asdict(f) for f in ([] if plan.fits else fixes(plan, preset))],
        "speedups": [asdict(f) for f in speedups(plan, preset)], "notes": list(plan.notes),
    }


def _unit(plan: Plan) -> tuple[str, float]:
    """GiB, or MiB for a plan that peaks under 1 GiB (the tiny model)."""
    return ("GiB", GiB) if plan.memory.peak >= GiB else ("MiB", 2**20)


def _memory_lines(plan: Plan) -> list[str]:
    m, w = plan.memory, plan.workload
    unit, size = _unit(plan)
    stored = {2: "bf16", 4: "fp32", 8: "fp64"}[w.param_bytes]
    shard = f", 1/{w.gpus} shard" if w.fsdp else ""
    ref = "β > 0 with LoRA: the adapter-free base, no copy" if (w.beta > 0 and w.lora_r) else "β = 0: none"
    rows = [
        (f"master weights ({stored}{shard})", m.master, ""),
        ("fp32 copies of the trained weights", m.fp32_master_copy,
         "train/master_weights.py" if m.fp32_master_copy else "none: LoRA, fp32 or FSDP"),
        ("LoRA adapters (fp32)", m.lora, f"r = {w.lora_r}" if w.lora_r else "full fine-tuning"),
        ("AdamW states (fp32 m, v)", m.optimizer, ""),
        ("reference model (KL)", m.reference, "" if m.reference else ref),
        (f"{w.rollout_precision.upper()} rollout copy", m.rollout_copy, "" if m.rollout_copy else "bf16: the master"),
        ("gradients (during updates)", m.gradients, "with their fp32 copies" if m.fp32_master_copy else ""),
        ("KV cache (rollout)", m.kv_cache, "" if m.kv_cache else "no cache"),
        ("rollout activations", m.rollout_activations, f"{w.rows} rows, forward or float64 sampling tail"),
        ("likelihood passes (no grad)", m.likelihood_activations, "largest pass"),
        ("train micro-batch activations", m.train_activations,
         f"{w.micro_rows} rows; with checkpointing {m.train_activations_checkpointed / size:.2f}"
         + (" (used)" if w.gradient_checkpointing else "")),
    ]
    if m.fsdp_gathered:
        rows.append(("FSDP gathered blocks (bf16)", m.fsdp_gathered, "two blocks in flight"))
    out = [f"  {name:<38}{f'{value / size:.2f}' if value else '—':>8}  {note}".rstrip() for name, value, note in rows]
    phases = " | ".join(f"{k} {v / size:.1f}" for k, v in m.phases.items())
    verdict = (f"fits, {plan.usable_gib - m.peak / GiB:.1f} GiB to spare" if plan.fits else
               f"DOES NOT FIT: over by {m.peak / GiB - plan.usable_gib:.1f} GiB")
    out.append(f"  peak by phase ({unit}): {phases}")
    out.append(f"  peak {m.peak / size:.1f} {unit} ({m.peak_phase}) of {plan.usable_gib:.1f} GiB usable on one "
               f"{GPUS[plan.gpu].name}: {verdict}")
    return out


def _work_lines(plan: Plan) -> list[str]:
    r, w = plan.rates, plan.workload
    out = [f"  {'phase':<11}{'what':<34}{'calls × rows':>13}{'tokens':>8}{'TFLOP':>9}{'seconds':>9}"]
    digits = 1 if sum(c.flops for c in plan.costs) > 1e13 else 4
    for c in plan.costs:
        p = c.passes
        rate = pass_rate(p.model, w, r)
        out.append(f"  {p.phase:<11}{p.what[:33]:<34}{f'{p.calls} × {p.rows}':>13}{p.tokens:>8}"
                   f"{c.flops / 1e12:>9.{digits}f}{c.flops / rate:>9.2f}")
    blank = f"{'':>13}{'':>8}{'':>9}"
    out.append(f"  {'update':<11}{'AdamW steps (HBM-bound)':<34}{blank}{plan.seconds['optimizer']:>9.2f}")
    if plan.seconds["sync"]:
        out.append(f"  {'sync':<11}{'FP8 copy requantised':<34}{blank}{plan.seconds['sync']:>9.2f}")
    hours = plan.seconds_per_step * w.train_steps / 3600
    out.append(f"  {plan.seconds_per_step:.3g} s per step (rollout {plan.seconds['rollout']:.1f}, likelihood "
               f"{plan.seconds['likelihood']:.1f}, train {plan.seconds['train']:.1f}); {w.train_steps} steps ≈ "
               f"{hours:.1f} h")
    return out


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def format_plan(plan: Plan, preset) -> str:
    """What `dllm-ais plan` prints."""
    w, sh = plan.workload, plan.shape
    trained = f"LoRA r={w.lora_r} ({sh.lora_params(w.lora_r) / 1e6:.1f} M trained)" if w.lora_r else \
        "full fine-tuning"
    prompt = "measured" if preset.model.path is None else "assumed; --prompt-len"
    blocks = w.gen_length // w.block_length
    cache = "no cache" if w.cache == "none" else f"{w.cache} cache"
    mismatch = {"none": "none (μ = π_old)", "elbo": f"coupled ELBO, K = {w.mismatch_draws}",
                "trajectory": "trajectory replay", "onestep": "one-step log-ratios"}[w.mismatch]
    setup = "FSDP2" if w.fsdp else ("DDP" if w.gpus > 1 else "one process")
    lines = [
        f"dllm-ais plan: {plan.preset} on {w.gpus} × {GPUS[plan.gpu].name} ({setup}); figures per GPU",
        f"model  {sh.name}: {_count(sh.params_total)} parameters (d {sh.d_model}, {sh.n_layers} layers × "
        f"{sh.n_heads} heads{f' ({sh.n_kv_heads} KV)' if sh.n_kv_heads not in (0, sh.n_heads) else ''}, MLP "
        f"{sh.mlp_hidden}, vocab {sh.vocab}); {trained}",
        f"step   {w.rows} rows per GPU; prompt {w.prompt_len} tokens ({prompt}) + {w.gen_length} generated; "
        f"{w.sampler_steps} denoising steps over {blocks} block{'s' * (blocks != 1)} ({cache}); "
        f"{w.num_iterations} update(s) × {w.micro_batches} micro-batch(es); ℓ: {mismatch}; β = {w.beta}",
        "", f"memory per GPU ({_unit(plan)[0]})", *_memory_lines(plan), "", "work per RL step", *_work_lines(plan),
        f"rates: {plan.rates.source}",
    ]
    if not plan.fits:
        found = fixes(plan, preset)
        alone = found and all(" + " not in f.flag for f in found)
        lines.append(("fixes (each alone):" if alone else "fixes (no single change fits):") if found else
                     "no change the plan tries fits (LoRA, micro-batches, checkpointing, FSDP up to 8 GPUs).")
        lines += [f"  {f.flag}: peak {f.peak_gib:.1f} GiB, {f.seconds_per_step:.1f} s/step" for f in found]
        lines += [f"  ({flag}: {meaning})" for flag, meaning in FIX_NOTES.items() if any(flag in f.flag for f in found)]
    for f in speedups(plan, preset):
        lines.append(f"faster: {f.flag}: {f.seconds_per_step:.1f} s/step, peak {f.peak_gib:.1f} GiB")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)
