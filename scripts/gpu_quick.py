"""Every headline GPU figure in one short call: `bash scripts/gpu_check.sh --quick` (≤ 420 s on an H100, install
included). The staged `gpu_check.sh --stage …` stays for longer budgets.

  bash scripts/gpu_check.sh --quick                         # GPU: LLaDA-8B shape, random bf16 weights
  python scripts/gpu_quick.py --device cpu --tiny           # CPU dry run: the same code at tiny shapes (CI runs it)

Parts, each a subprocess under its own deadline (a part that hangs is killed; what it wrote stays), run in this order
(the figures the H200 run missed first, then the forward, then the kernel tests); summary.json and report.md are
rebuilt after each:
  window    scripts/gpu_quick_window.py: the dual-cache window step [32 × 32] over a cached 320-token canvas, BF16 vs
            FP8, eager and replayed from a CUDA graph; one dual-cache block (1 refresh + 15 window steps) FP8 graphed
            vs the BF16 master's 16 uncached forwards; the weight sync vs its floors; profiles of the window step
            (profile_window.txt) and the sync (profile_sync.txt); the compiled window step, BF16 and FP8; last,
            Dream-7B's dual-cache window step, BF16 vs the fused FP8 Dream copy (scripts/gpu_quick_dream.py).
  rl_step   scripts/gpu_quick_rl.py: two whole GRPO steps at llada-8b-gsm8k's shapes (random weights, LoRA r 128,
            G 6, gen 256 in 8 blocks, dual cache + threshold 0.9, FP8 graphed rollouts, AIS, a checkpoint written and
            verified), seconds per phase and peak memory next to `dllm-ais plan`'s prediction.
  eager     one random LLaDA-8B-shaped master (bf16, no download):
            (a) one sampler forward at [32, 320] (the whole canvas in, the current 32-token block's logits out, exactly
                as diffusion_sample calls the model): BF16 master, BF16 fused copy, FP8 copy on the default backend
                (cublas on sm_90) and every other available block/row backend, all eager;
            (g) torch.profiler top-15 ops of one FP8 forward (profile_fp8.txt);
            (e) Triton vs cuBLAS blockwise vs BF16 GEMM at two rollout shapes, and which row counts M cuBLAS's
                blockwise mode accepts (cublas_accepts probes);
            (c) resident memory and forward peak of each copy, and the peak of one RL micro-batch (LoRA r=128 master,
                forward + backward over the completion + an AdamW step, with and without gradient checkpointing).
            (d) last, at Dream-7B's shapes (GQA 28/4 heads, q/k/v biases; scripts/gpu_quick_dream.py): one uncached
                Dream sampler step, BF16 master vs the fused FP8 Dream copy.
  compiled  the sampler's compiled step (torch.compile mode="reduce-overhead", CUDA graphs) at the same shape: BF16
            master, FP8 default backend, BF16 fused copy.
  tests     the kernel tests on CUDA (CUDA graphs, grouped sync, direct dispatch, kernels vs their torch twins,
            compiled sampler step), ≤ 90 s.
On CPU (--device cpu) the compiled part traces the same step with dynamo's "eager" backend (no inductor: seconds,
not minutes), so the dry run exercises tracing, the recorded cuBLAS decisions and every summary key.

Writes to --out-dir (default benchmarks/gpu/<device>-<YYYYMMDD>-quick): quick.jsonl (one JSON row per measurement,
flushed as measured), profile_{fp8,window,sync}.txt, <part>.log, summary.json (QUICK_KEYS exactly) and report.md
(values, targets, the plan's predictions next to the measurements, missed targets with the profiles).
--block-imports A,B makes those modules unimportable in every part (the CI dry run blocks datasets, math_verify and
torchao, which the device image lacks).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
PARTS = ("window", "rl_step", "eager", "compiled", "tests")
PART_CAP_S = {"window": 90, "rl_step": 110, "eager": 50, "compiled": 60, "tests": 90}
"""Each part's own limit in seconds on a GPU (the budget may cut it shorter): 400 s in all, the 420 s call less the
install. The CPU dry run (tiny shapes, Triton interpreted, a shared 2-core machine) gets CPU_SLACK times as long."""
CPU_SLACK = 2.0
SUMMARY_MARGIN_S = 8  # kept back from the budget for the last summary
WORKLOAD = {  # batch, prompt length, gen length, block length; LoRA rank and RL micro-batch rows
    "full": dict(batch=32, prompt=64, gen=256, block=32, lora_r=128, micro_batch=3),
    "tiny": dict(batch=2, prompt=8, gen=16, block=8, lora_r=4, micro_batch=2),
}
GEMM_SHAPES = {"full": [(10240, 24576, 4096), (10240, 4096, 12288)], "tiny": [(64, 256, 128), (64, 128, 256)]}
CUBLAS_PROBE_M = [1, 2, 3, 4, 8, 16, 24, 31, 32, 33, 64, 96, 100, 1024, 10240]
TEST_FILES = {
    # the kernel tests first, the compile-heavy ones last: on the H200 (2026-11-27) the 90 s part reached only the
    # first 21 tests of the old order, which began with the graph captures
    "full": ["tests/test_fp8_gemm.py", "tests/test_fp8_quant.py", "tests/test_fp8_producers.py",
             "tests/test_fp8_row_producers.py", "tests/test_fp8_eager_direct.py", "tests/test_fp8_fused_sync.py",
             "tests/test_fp8_cublas_auto.py", "tests/test_fp8_cublas_decisions.py", "tests/test_cuda_graphs.py",
             "tests/test_sampler_compile.py"],
    "tiny": ["tests/test_fp8_cublas_decisions.py::test_ragged_layers_never_probe"],  # plumbing only (the suite: all)
}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# import blocking (the bare device image has no datasets / math_verify / torchao)


def block_imports(names: str | None) -> None:
    """Make the named top-level modules look absent in this process: `import` raises ModuleNotFoundError and
    importlib.util.find_spec returns None (a None entry in sys.modules), as on an image without them."""
    for name in (n.strip() for n in (names or "").split(",")):
        if name:
            sys.modules[name] = None


# ----------------------------------------------------------------------------------------------------------------------
# rows


class Rows:
    """Appends one JSON object per measurement to <out>/quick.jsonl, flushed at once (a killed part loses nothing)."""

    def __init__(self, out: Path, part: str) -> None:
        self.path, self.part = out / "quick.jsonl", part

    def __call__(self, section: str, metric: str, value=None, status: str = "ok", **extra) -> None:
        row = {"part": self.part, "section": section, "metric": metric, "value": value, "status": status, **extra}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        shown = value if status == "ok" else f"{status}: {extra.get('reason', '')}"
        print(f"gpu_quick: {section} {metric} = {shown}", flush=True)



@functools.cache
def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


qs = _script("gpu_quick_summary")  # summary.json / report.md from the rows (a sibling script, not a package)


# ----------------------------------------------------------------------------------------------------------------------
# measuring


def time_ms(fn: Callable[[], object], device, warmup: int = 2, repeats: int = 5) -> float:
    """Median milliseconds of fn() after `warmup` calls (bench_fp8.timed: CUDA events on a GPU)."""
    return _script("bench_fp8").timed(fn, device, repeats, warmup) * 1e3


def allocated_gib(device) -> float | None:
    import torch

    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None


def peak_during(fn: Callable[[], object], device) -> float | None:
    """Peak allocated GiB while fn() runs (CUDA; None elsewhere)."""
    import torch

    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


class Setup:
    """The master, the canvas and the shapes every part measures at."""

    def __init__(self, args) -> None:
        import torch

        from dllm_ais.models.llada.model import LLaDAConfig

        self.device = torch.device(args.device)
        self.size = "tiny" if args.tiny else "full"
        self.w = WORKLOAD[self.size]
        bench_rollout = _script("bench_rollout")
        shape = bench_rollout.SHAPES["smoke" if args.tiny else "full"]
        self.config = LLaDAConfig(**shape)
        t0 = time.perf_counter()
        self.master = bench_rollout.random_llada(self.config, seed=0, device=self.device)
        self.build_s = time.perf_counter() - t0
        B, P, L = self.w["batch"], self.w["prompt"], self.w["gen"]
        g = torch.Generator(device=self.device).manual_seed(0)
        ids, mask = bench_rollout.random_prompts(B, P, self.config.embedding_size, self.config.mask_token_id, g,
                                                 self.device)  # fmt: skip
        masks = torch.full((B, L), self.config.mask_token_id, dtype=ids.dtype, device=self.device)
        self.x = torch.cat([ids, masks], dim=1)  # [B, P + L]: prompt, then an all-masked completion
        self.attn = torch.cat([mask, torch.ones(B, L, dtype=torch.bool, device=self.device)], dim=1)
        self.lo, self.hi = P, P + self.w["block"]  # the first block
        self.rows = B * (P + L)  # activation rows of one whole-canvas forward

    def default_backend(self) -> str:
        from dllm_ais.fp8 import default_backend

        return default_backend(self.device)

    def fp8_copy(self, backend: str):
        from dllm_ais.fp8 import prepare_gemm_shapes, quantize_model

        copy = quantize_model(self.master, backend=backend, expected_m=self.rows)
        prepare_gemm_shapes(copy, [self.rows, self.w["batch"] * self.w["block"]])
        return copy

    def forward(self, model, compiled: int = 0):
        """One sampler step without a cache: the whole canvas in, the first block's logits out [B, Lb, V]."""
        from dllm_ais.samplers.diffusion import _logits

        return _logits(model, self.x, self.attn, self.lo, self.hi, compiled)

    def cached_window(self, model, compiled: int = 0, graphed: bool = False):
        """(refresh, step) of one dual-cache block as diffusion_sample runs it, sharing one KV cache: refresh() runs
        the whole canvas and fills the cache (once now, before any capture), step() recomputes only the block window
        [B, Lb] against it — eagerly, compiled, or replayed from a CUDA graph (samplers/diffusion_graphs.py, the
        sampler's own graphs under cuda_graphs='on'; captured now)."""
        from dllm_ais.models.kv_cache import KVCache
        from dllm_ais.samplers.diffusion import _logits

        kv = KVCache.for_model(model, self.x.shape[0], self.x.shape[1])
        if compiled and self.device.type == "cuda":
            kv.mark_static()

        def refresh():
            return _logits(model, self.x, self.attn, self.lo, self.hi, compiled, kv, 0)

        refresh()
        block = self.x[:, self.lo:self.hi]
        if graphed:
            from dllm_ais.samplers.diffusion_graphs import graphed_window_step

            return refresh, graphed_window_step(model, kv, block, self.attn, self.lo)
        return refresh, lambda: _logits(model, block, self.attn, 0, self.hi - self.lo, compiled, kv, self.lo)

    def window(self, model, compiled: int = 0, graphed: bool = False) -> Callable[[], object]:
        """The window step of `cached_window` (its cache filled by one refresh now)."""
        return self.cached_window(model, compiled, graphed)[1]


def profile_text(title: str, fn: Callable[[], object], device) -> str:
    """torch.profiler's top-15 ops of one call of fn (after one warm-up call), headed by what tells a launch-bound
    call from a device-bound one: the wall time, the summed device time of its kernels and how many were launched."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from dllm_ais.analysis import bench_env

    fn()
    bench_env.sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        fn()
        bench_env.sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    device_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3  # each kernel's own span
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=15)
    return (f"# {title}\n# wall {wall_ms:.2f} ms under the profiler; {len(kernels)} device kernels, "
            f"{device_ms:.2f} ms of device time\n\n{table}")


def profile_to(path: Path, title: str, fn: Callable[[], object], device) -> None:
    from dllm_ais.atomic import atomic_write_text

    atomic_write_text(path, profile_text(title, fn, device) + "\n")


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _section(rows: Rows, name: str, deadline: float, fn: Callable[[], None]) -> None:
    """Run one section unless the part's deadline has passed; a failure is recorded and the part goes on."""
    from dllm_ais.analysis import bench_env

    if time.time() > deadline:
        rows(name, "section", status="skipped", reason="the part's deadline passed before it started")
        return
    t0 = time.perf_counter()
    try:
        fn()
        rows(name, "section_s", time.perf_counter() - t0)
    except Exception as e:  # one broken section must not cost the others
        rows(name, "section", status="failed", reason=bench_env.error_reason(e))
        import traceback

        traceback.print_exc()


@torch.no_grad()
def part_eager(args, rows: Rows, deadline: float) -> None:
    import torch

    from dllm_ais.analysis import bench_env
    from dllm_ais.models.llada.fused_fp8 import build_fused_llada

    s = Setup(args)
    dev = s.device
    default = s.default_backend()
    rows("setup", "master_build_s", s.build_s, shape=s.w, fp8_backend=default)
    rows("setup", "fp8_backend", default)
    master_gib = allocated_gib(dev)
    rows("memory", "model_gib_bf16_master", master_gib)

    def measure_forward(name: str, model) -> None:
        before = allocated_gib(dev)
        ms = time_ms(lambda: s.forward(model), dev)
        peak = peak_during(lambda: s.forward(model), dev)
        rows("forward", f"forward_ms_{name}", ms)
        if peak is not None:
            rows("memory", f"forward_activation_gib_{name}", peak - before)

    def forward_section() -> None:
        measure_forward("bf16_eager", s.master)
        fused = build_fused_llada(s.master, None)
        rows("memory", "model_gib_bf16_fused", allocated_gib(dev) - master_gib if dev.type == "cuda" else None)
        measure_forward("bf16_fused_eager", fused)
        del fused
        _free(dev)
        measure_fp8([default])

    def measure_fp8(names: list[str]) -> None:
        for backend in names:
            reason = bench_env.backend_reason(backend, dev)
            if reason is not None:
                rows("forward", f"forward_ms_fp8_{backend}_eager", status="skipped", reason=reason)
                continue
            if time.time() > deadline - 20:
                rows("forward", f"forward_ms_fp8_{backend}_eager", status="skipped", reason="deadline")
                continue
            t0 = time.perf_counter()
            copy = s.fp8_copy(backend)
            bench_env.sync(dev)
            rows("forward", f"build_s_fp8_{backend}", time.perf_counter() - t0)
            if backend == default:
                rows("memory", "model_gib_fp8_copy", allocated_gib(dev) - master_gib if dev.type == "cuda" else None)
            measure_forward(f"fp8_{backend}_eager", copy)
            del copy
            _free(dev)

    def profile_section() -> None:
        copy = s.fp8_copy(default)
        head = f"{bench_env.device_name(dev)}, fp8 {default}"
        profile_to(args.out_dir / "profile_fp8.txt", f"one forward, {list(s.x.shape)}, {head}",
                   lambda c=copy: s.forward(c), dev)
        rows("profile", "profile_fp8", "profile_fp8.txt")
        del copy
        _free(dev)

    def gemm_section() -> None:
        from dllm_ais.fp8 import backends

        bench_fp8 = _script("bench_fp8")
        g = torch.Generator(device=dev).manual_seed(0)
        wanted = ("bf16_matmul", "fp8_triton_gemm", "fp8_cublas_blockwise")
        for M, N, K in GEMM_SHAPES[s.size]:
            w = (torch.randn(N, K, generator=g, device=dev) * 0.02).to(torch.bfloat16)
            x = torch.randn(M, K, generator=g, device=dev).to(torch.bfloat16)
            shape = {"M": M, "N": N, "K": K}
            for name, (reason, fn) in bench_fp8.gemm_cases(x, w).items():
                if name not in wanted:
                    continue
                if reason is not None:
                    rows("gemm", f"tflops_{name}", status="skipped", reason=reason, shape=shape)
                    continue
                ms = time_ms(fn, dev, warmup=2, repeats=5)
                rows("gemm", f"tflops_{name}", 2 * M * N * K / ms / 1e9, shape=shape)
            del w, x
            _free(dev)
        if bench_env.backend_reason("cublas", dev) is None:
            accepted = [m for m in CUBLAS_PROBE_M if backends.cublas_accepts(m, 4096 if s.size == "full" else 256,
                                                                             4096 if s.size == "full" else 256, dev)]
            rows("gemm", "cublas_rejected_m", [m for m in CUBLAS_PROBE_M if m not in accepted], probed=CUBLAS_PROBE_M)
        else:
            rows("gemm", "cublas_rejected_m", status="skipped", reason=bench_env.backend_reason("cublas", dev))

    def rl_section() -> None:
        from peft import LoraConfig, get_peft_model

        from dllm_ais.models.llada.model import lora_target_regex

        model = get_peft_model(s.master, LoraConfig(r=s.w["lora_r"], lora_alpha=64.0, lora_dropout=0.0,
                                                    target_modules=lora_target_regex()))  # fmt: skip
        model.train()
        mb, P = s.w["micro_batch"], s.w["prompt"]
        x, attn = s.x[:mb].clone(), s.attn[:mb]
        targets = torch.randint(5, s.config.vocab_size, (mb, s.w["gen"]), device=dev)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-6)  # its fp32 m, v are part of a training step's memory
        for checkpointed in (False, True):
            s.master.model.gradient_checkpointing = checkpointed

            def step() -> None:
                with torch.enable_grad():
                    logits = model(input_ids=x, attention_mask=attn, positions=slice(P, P + s.w["gen"])).logits
                    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            step()  # warm-up (allocator, autotuning)
            peak = peak_during(step, dev)
            rows("rl", "peak_gib_rl_microbatch" + ("_checkpointed" if checkpointed else ""), peak,
                 rows=mb, tokens=x.shape[1], lora_r=s.w["lora_r"])  # fmt: skip
            if dev.type != "cuda":
                rows("rl", "step_ms" + ("_checkpointed" if checkpointed else ""), time_ms(step, dev, 0, 1))
        s.master.model.gradient_checkpointing = False
        model.unload()  # the master without LoRA again, for the sections after this one
        s.master.eval()

    def other_backends_section() -> None:  # the Triton GEMM autotunes on its first call
        measure_fp8([b for b in ("scaled_mm", "triton", "cublas") if b != default])

    def dream_section() -> None:  # last: Dream-7B's shapes (scripts/gpu_quick_dream.py)
        _script("gpu_quick_dream").dream_forward_section(sys.modules[__name__], args, rows, default)

    for name, fn in (("forward", forward_section), ("profile", profile_section), ("gemm", gemm_section),
                     ("rl", rl_section), ("other_backends", other_backends_section),
                     ("dream_forward", dream_section)):  # fmt: skip
        _section(rows, name, deadline, fn)


@torch.no_grad()
def part_compiled(args, rows: Rows, deadline: float) -> None:
    import torch

    from dllm_ais.analysis import bench_env
    from dllm_ais.models.llada.fused_fp8 import build_fused_llada
    from dllm_ais.samplers import diffusion

    if args.device == "cpu":  # dynamo traces the same step; no inductor (seconds instead of minutes)
        diffusion._compiled_step = lambda device_type="cpu", cudagraphs=False: torch.compile(
            diffusion._step, backend="eager", dynamic=False)
    s = Setup(args)
    dev = s.device
    default = s.default_backend()
    builders = (("bf16", lambda: s.master), (f"fp8_{default}", lambda: s.fp8_copy(default)),
                ("bf16_fused", lambda: build_fused_llada(s.master, None)))  # fmt: skip
    for name, build in builders:
        if time.time() > deadline - (30 if dev.type == "cuda" else 5):
            rows("compiled", f"forward_ms_{name}_compiled", status="skipped", reason="deadline")
            continue
        try:
            model = build()
            t0 = time.perf_counter()
            s.forward(model, compiled=1)  # compiles and records the CUDA graph
            bench_env.sync(dev)
            rows("compiled", f"compile_s_{name}", time.perf_counter() - t0)
            rows("compiled", f"forward_ms_{name}_compiled", time_ms(lambda m=model: s.forward(m, compiled=1), dev))
        except Exception as e:
            rows("compiled", f"forward_ms_{name}_compiled", status="failed", reason=bench_env.error_reason(e))
        model = None
        _free(dev)
    from dllm_ais.fp8.backends import cublas_fallbacks

    rows("compiled", "cublas_fallbacks", sorted(list(k[1:]) for k in cublas_fallbacks()))


def part_tests(args, rows: Rows, deadline: float) -> None:
    files = TEST_FILES["tiny" if args.tiny else "full"]
    log = args.out_dir / "tests-pytest.log"
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "pytest_report_now", "-o", "addopts=",
           "--durations=15", *files]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "scripts"),
                                                                      os.environ.get("PYTHONPATH")]))}  # fmt: skip
    with log.open("w") as f:
        try:
            proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env,
                                  timeout=max(1.0, deadline - time.time()))  # fmt: skip
            status = "ok" if proc.returncode in (0, 1) else f"pytest exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = "timed out"
    counts = qs.count_tests(log.read_text())
    rows("tests", "gpu_tests_passed", counts["passed"], files=files)
    rows("tests", "gpu_tests_failed", counts["failed"] if status in ("ok", "timed out") else None,
         skipped=counts["skipped"], run_status=status, status="ok" if status == "ok" else "partial")  # fmt: skip



# ----------------------------------------------------------------------------------------------------------------------
# driver


def run_parts(args) -> dict:
    """Each part in its own process, under min(its cap, what is left of the budget); summary after each."""
    t_end = time.time() + args.budget_s - SUMMARY_MARGIN_S
    env = qs.environment(args.device)
    parts: dict[str, str] = {}
    result = qs.write_summary(args.out_dir, env, parts)
    for part in args.parts:
        left = t_end - time.time()
        if left < 10:
            parts[part] = "skipped: budget spent"
            continue
        cap = dict(PART_CAP_S, **args.cap)[part]
        limit = min(cap * (CPU_SLACK if args.device == "cpu" else 1.0), left)
        deadline = time.time() + limit
        cmd = [sys.executable, __file__, "--part", part, "--out-dir", str(args.out_dir), "--device", args.device,
               "--deadline", str(deadline - 3)] + (["--tiny"] if args.tiny else []) + (
            ["--block-imports", args.block_imports] if args.block_imports else [])  # fmt: skip
        print(f"gpu_quick: {part} (limit {limit:.0f} s) …", flush=True)
        t0 = time.perf_counter()
        with (args.out_dir / f"{part}.log").open("w") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
            try:
                rc = proc.wait(timeout=limit)
                status = "ok" if rc == 0 else f"exit status {rc} (see {part}.log)"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status = f"killed at its limit (see {part}.log)"
        parts[part] = f"{status} ({time.perf_counter() - t0:.0f} s)"
        print(f"gpu_quick: {part}: {parts[part]}", flush=True)
        result = qs.write_summary(args.out_dir, env, parts)
    return result


def _cap(text: str) -> tuple[str, float]:
    part, sep, seconds = text.partition("=")
    if not sep or part not in PARTS:
        raise argparse.ArgumentTypeError(f"expected PART=SECONDS with PART one of {', '.join(PARTS)}, got {text!r}")
    try:
        return part, float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: SECONDS must be a number") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, help="default benchmarks/gpu/<device>-<YYYYMMDD>-quick")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run, with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny LLaDA shapes (the CPU dry run)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for all parts together (default 400 on a GPU: the 420 s call less the install; "
                        "800 for the CPU dry run)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run, in order")
    parser.add_argument("--cap", type=_cap, action="append", default=[], metavar="PART=SECONDS",
                        help="raise or lower one part's own limit (repeatable), e.g. --cap window=150")
    parser.add_argument("--block-imports", default=None,
                        help="comma-separated modules made unimportable in every part (e.g. datasets,math_verify)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # internal: run one part in this process
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.cap = dict(args.cap)
    block_imports(args.block_imports)
    if args.device == "cpu" and not args.tiny:
        parser.error("--device cpu needs --tiny (LLaDA-8B shapes need a GPU)")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.budget_s is None:
        args.budget_s = 800.0 if args.device == "cpu" else 400.0
    if args.part:
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads()) if args.device == "cuda" else 1)
        rows = Rows(args.out_dir, args.part)
        deadline = args.deadline or time.time() + PART_CAP_S[args.part]
        if args.part == "window":
            _script("gpu_quick_window").part_window(sys.modules[__name__], args, rows, deadline)
        elif args.part == "rl_step":
            _script("gpu_quick_rl").part_rl_step(sys.modules[__name__], args, rows, deadline)
        else:
            {"eager": part_eager, "tests": part_tests, "compiled": part_compiled}[args.part](args, rows, deadline)
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_quick: no CUDA device here; the CPU dry run is --device cpu --tiny", file=sys.stderr)
        return 2
    if args.out_dir is None:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
        name = re.sub(r"[^a-z0-9]+", "-", qs.environment(args.device)["device"].lower()).strip("-")
        args.out_dir = REPO / "benchmarks" / "gpu" / f"{name}-{date}-quick"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary = run_parts(args)
    print(json.dumps(summary, indent=2))
    print(f"gpu_quick: wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
