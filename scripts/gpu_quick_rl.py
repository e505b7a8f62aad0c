"""The quick check's `rl_step` part: two whole GRPO steps at the `llada-8b-gsm8k` shapes, timed by phase next to
`dllm-ais plan`'s prediction for the same settings (loaded by scripts/gpu_quick.py; a sibling script, not a package).

The master is LLaDA-8B-shaped with random bf16 weights (scripts/bench_rollout.py's random_llada; --tiny: the tiny
model) wrapped in peft LoRA (r 128 as d1, α 64); the preset is `llada-8b-gsm8k` (G = 6, gen 256 in 8 blocks of 32,
128 steps, β 0.04, 12 inner iterations, 2 micro-batches) with Fast-dLLM's dual cache and threshold 0.9, FP8 rollouts
on the default backend, CUDA-graphed eager (not compiled) sampler steps where the sampler offers them, AIS on the
trajectory mismatch ratio (the ELBO cannot see a cache) with one Horvitz–Thompson replayed step per block (`dllm-ais
plan`'s own advice).
Prompts are random strings (bench_rl_step.random_rows); the reward is bench_rl_step.text_reward. The prompt count is
the largest (≤ 8) that the plan says fits the GPU and whose two planned steps, times PLAN_SAFETY, fit in
RL_STEP_BUDGET_S (1 on CPU).

Random weights never pass a 0.9 threshold: every step commits only its forced top-1 token, so a rollout makes
gen_length forwards (1 refresh + 31 window steps per block), not the fixed schedule's 128. The plan is therefore
re-made at the NFE the rollout actually ran (`sampler.steps` = the measured NFE) before the phases are compared.

Rows (section "rl_step"): prompts, rows, nfe, step_s_1 / step_s_2 (the first step captures graphs and tunes), then
for the second step <phase>_s and plan_<phase>_s for rollout, likelihood (π_old, reference and the mismatch ELBO
passes), update (forwards with gradients, backward, optimizer) and sync; rl_step_s and plan_rl_step_s; peak_gib and
plan_peak_gib (CUDA); checkpoint_verified (a checkpoint written after the second step and read back through
RunDir.verify, sha256 included).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

RL_STEP_BUDGET_S = 90.0
"""Seconds the two planned steps may take together when choosing the prompt count."""
PLAN_SAFETY = 3.0
"""The plan counts FLOPs and bytes; a rollout's small window steps are launch-bound (the H200's eager FP8 window step
took 39 ms against ≈ 16 ms of device work), so the prompt count is chosen as if a step took this many times the plan."""
PHASES = ("rollout", "likelihood", "update", "sync")


def rl_preset(tiny: bool, device: str, prompts: int, graphs: bool):
    """llada-8b-gsm8k with the quick check's changes (dual cache, threshold 0.9, random-string task, 2 steps, a
    checkpoint after each); --tiny shrinks the shapes to the tiny model's."""
    from dllm_ais.config import SamplerConfig
    from dllm_ais.presets import get_preset

    base = get_preset("llada-8b-gsm8k")
    # eager graphed steps, not compiled ones: compiling the 32-layer window step took ≈ 90 s on the H200 (2026-11-27),
    # more than the whole part may take; the graphed FP8 window step is as fast (21.0 ms vs compiled BF16 32.4 ms)
    sampler = dict(cache="dual", threshold=0.9, compile=False)
    if "cuda_graphs" in {f.name for f in SamplerConfig.__dataclass_fields__.values()}:
        sampler["cuda_graphs"] = "on" if graphs else "off"
    if tiny:
        sampler.update(gen_length=16, block_length=8, steps=8)
    blocks = sampler.get("gen_length", base.sampler.gen_length) // sampler.get("block_length",
                                                                               base.sampler.block_length)
    train = replace(base.train, task="bench", steps=2, prompts_per_step=prompts, save_every=1,
                    lora_r=4 if tiny else base.train.lora_r, fp8_backend="auto", mismatch_estimator="trajectory",
                    trajectory_steps=blocks)  # the ELBO cannot see a cache; one replayed step per block (plan's advice)
    grpo = replace(base.grpo, max_completion_length=sampler.get("gen_length", base.grpo.max_completion_length),
                   num_iterations=2 if tiny else base.grpo.num_iterations)
    model = replace(base.model, device=device, dtype="float32" if tiny else base.model.dtype)
    return replace(base, name="gpu-quick-rl-step", model=model, sampler=replace(base.sampler, **sampler), train=train,
                   grpo=grpo)


def planned(preset, gpu: str | None, prompt_len: int, nfe: int | None = None) -> dict | None:
    """Seconds by phase (PHASES), per step, and peak GiB from dllm_ais.plan for `preset` on `gpu`; with `nfe`, the
    sampler's steps are set to it (the forwards the rollout actually made). None off a known GPU kind."""
    if gpu is None:
        return None
    from dllm_ais.plan import make_plan
    from dllm_ais.plan.memory import GiB

    if nfe is not None and nfe % preset.sampler.num_blocks == 0:
        preset = replace(preset, sampler=replace(preset.sampler, steps=nfe))
    plan = make_plan(preset, gpu, prompt_len=prompt_len)
    s = plan.seconds
    phases = {"rollout": s["rollout"], "likelihood": s["likelihood"], "update": s["train"] + s["optimizer"],
              "sync": s["sync"]}
    return {**phases, "step": plan.seconds_per_step, "peak_gib": plan.memory.peak / GiB, "fits": plan.fits}


def choose_prompts(tiny: bool, device: str, gpu: str | None, prompt_len: int, graphs: bool) -> int:
    """The largest prompt count (≤ 8) that fits the GPU's memory by the plan and whose two planned steps at NFE =
    gen_length, times PLAN_SAFETY, fit RL_STEP_BUDGET_S; 1 when there is no plan (CPU) or none fits."""
    if tiny or gpu is None:
        return 1
    best = 1
    for prompts in range(1, 9):
        preset = rl_preset(tiny, device, prompts, graphs)
        p = planned(preset, gpu, prompt_len, nfe=preset.sampler.gen_length)
        if p is not None and p["fits"] and 2 * PLAN_SAFETY * p["step"] <= RL_STEP_BUDGET_S:
            best = prompts
    return best


def part_rl_step(q, args, rows, deadline: float) -> None:
    """Two train_steps through the real Trainer; `q` is scripts/gpu_quick.py (its helpers and sibling loader)."""
    import torch

    from dllm_ais import metrics as M
    from dllm_ais.analysis import bench_env
    from dllm_ais.models.llada.backend import build_backend as _llada_backend
    from dllm_ais.train.run_dir import RunDir
    from dllm_ais.train.trainer import Policy, Trainer

    bench = q._script("bench_rl_step")
    device = torch.device(args.device)
    gpu = q.qs.gpu_kind(bench_env.device_name(device)) if device.type == "cuda" else None
    graphs = device.type == "cuda"
    prompt_len = 8 if args.tiny else 64
    prompts = choose_prompts(args.tiny, args.device, gpu, prompt_len, graphs)
    preset = rl_preset(args.tiny, args.device, prompts, graphs)
    G = preset.grpo.num_generations
    rows("rl_step", "prompts", prompts, rows=prompts * G, prompt_len=prompt_len,
         gen_length=preset.sampler.gen_length, cache=preset.sampler.cache, threshold=preset.sampler.threshold,
         lora_r=preset.train.lora_r, num_iterations=preset.grpo.num_iterations, graphs=graphs)  # fmt: skip
    t0 = time.perf_counter()
    master, tokenizer = bench.build_master("smoke" if args.tiny else "full", device, preset.train.lora_r)
    inner = _llada_backend(preset.sampler, master.base_model.model, tokenizer, preset.train)
    timed = bench.TimedBackend(inner, device)

    def save_model(m, directory: Path) -> None:
        m.save_pretrained(str(directory / "adapter"))

    def load_model_state(m, directory: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(m, load_file(str(directory / "adapter" / "adapter_model.safetensors")))

    policy = Policy(model=master, tokenizer=tokenizer, backend=timed, save_model=save_model,
                    load_model_state=load_model_state, use_chat_template=False)  # fmt: skip
    data = bench.random_rows(64, prompt_len, seed=0)
    with tempfile.TemporaryDirectory(prefix="gpu_quick_rl_") as tmp:
        run = RunDir(Path(tmp) / "run")
        run.create(preset, resume=False)
        trainer = Trainer(preset, policy, run, bench.text_reward, data, progress=False)
        bench_env.sync(device)
        rows("rl_step", "build_s", time.perf_counter() - t0)
        sync_fn = trainer._sync_rollout
        trainer._sync_rollout = lambda: timed._timed("sync_s", sync_fn)
        measured: dict[str, float] = {}
        nfe = None
        with bench_env.cuda_memory(device) as memory:
            for i in (1, 2):
                if time.time() > deadline - 5:
                    rows("rl_step", f"step_s_{i}", status="skipped", reason="the part's deadline passed")
                    return
                row, step_s = bench.timed_train_step(trainer, timed, device)
                rows("rl_step", f"step_s_{i}", step_s, reward=row.get(M.REWARD_MEAN))
                nfe = int(row[M.ROLLOUT_NFE]) if M.ROLLOUT_NFE in row else None
                logp = timed.times.get("logp_s", 0.0)
                measured = {"rollout": timed.times.get("rollout_s", 0.0),
                            "likelihood": logp + timed.times.get("mismatch_s", 0.0),
                            "update": row[M.time_key("update")] - logp, "sync": timed.times.get("sync_s", 0.0),
                            "step": step_s}  # fmt: skip
        ckpt = trainer.save()
        verified = RunDir.verify(ckpt) if ckpt is not None else None
        rows("rl_step", "checkpoint_verified", verified is not None, files=len((verified or {}).get("files", {})))
    plan = planned(preset, gpu, prompt_len, nfe=nfe)
    rows("rl_step", "nfe", nfe, planned_fixed_schedule=preset.sampler.steps)
    for phase in PHASES:
        rows("rl_step", f"{phase}_s", measured[phase])
        rows("rl_step", f"plan_{phase}_s", None if plan is None else plan[phase],
             **({} if plan is not None else {"status": "skipped", "reason": "no plan off a known GPU kind"}))
    rows("rl_step", "rl_step_s", measured["step"])
    rows("rl_step", "plan_rl_step_s", None if plan is None else plan["step"],
         **({} if plan is not None else {"status": "skipped", "reason": "no plan off a known GPU kind"}))
    if "peak_mem_gib" in memory:
        rows("rl_step", "peak_gib", memory["peak_mem_gib"])
    rows("rl_step", "plan_peak_gib", None if plan is None else plan["peak_gib"],
         **({} if plan is not None else {"status": "skipped", "reason": "no plan off a known GPU kind"}))
