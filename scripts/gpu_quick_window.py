"""The quick check's `window` part, run first: the figures the H200 run missed (loaded by scripts/gpu_quick.py; a
sibling script, not a package).

Sections, in order (each under the part's deadline; a failed one is recorded and the next runs):
  window    the dual-cache window step [batch × block] over a cached canvas, eager: BF16 master vs FP8 copy;
  graphed   the same step replayed from a CUDA graph (samplers/diffusion_graphs.py), BF16 and FP8 (CUDA only: on CPU
            each row says "needs CUDA");
  block     one dual-cache block at the fixed schedule, 1 refresh + (steps per block − 1) window steps, FP8 (graphed on
            CUDA, eager elsewhere), against the BF16 master's uncached sampler: the same number of whole-canvas
            forwards, eager — the cache × FP8 × graphs factor (random weights never pass a threshold);
  sync      sync_weights master → FP8 copy vs its floor (block linears only: bench_fp8's definition) and the fair
            floor (embedding, norms and LM head copied too: the plan's sync_bytes);
  profile   torch.profiler of one BF16 and one FP8 window step (profile_window.txt) and one sync (profile_sync.txt);
  compiled  the compiled window step (torch.compile reduce-overhead on CUDA; dynamo's eager backend on CPU), BF16 and
            FP8, until the deadline;
  dream_window  Dream-7B's dual-cache window step, BF16 vs the fused FP8 Dream copy, eager (scripts/gpu_quick_dream.py).
"""

from __future__ import annotations

import time

NEEDS_CUDA = "needs CUDA (CUDA graphs)"


def part_window(q, args, rows, deadline: float) -> None:
    """`q` is scripts/gpu_quick.py (Setup, time_ms, profiles, _section, _free and the sibling loader)."""
    import torch

    from dllm_ais.analysis import bench_env

    s = q.Setup(args)
    dev = s.device
    default = s.default_backend()
    rows("setup", "fp8_backend", default)
    cuda = dev.type == "cuda"
    per_block = 16 if not args.tiny else 4  # the fixed schedule's steps per block: 128 steps over 8 blocks (d1)

    def window_section() -> None:
        for name, build in (("bf16", lambda: s.master), ("fp8", lambda: s.fp8_copy(default))):
            model = build()
            step = s.window(model)
            rows("window", f"window_ms_{name}", q.time_ms(step, dev))
            del model, step
            q._free(dev)

    def graphed_section() -> None:
        for name, build in (("bf16", lambda: s.master), ("fp8", lambda: s.fp8_copy(default))):
            if not cuda:
                rows("graphed", f"window_ms_{name}_graphed", status="skipped", reason=NEEDS_CUDA)
                continue
            step = s.window(build(), graphed=True)
            rows("graphed", f"window_ms_{name}_graphed", q.time_ms(step, dev))
            step = None
            q._free(dev)

    def block_section() -> None:
        copy = s.fp8_copy(default)
        refresh, window = s.cached_window(copy, graphed=cuda)

        def fp8_block() -> None:  # the refresh (eager: one whole-canvas forward) writes the cache, the steps read it
            refresh()
            for _ in range(per_block - 1):
                window()

        def bf16_uncached() -> None:
            for _ in range(per_block):
                s.forward(s.master)

        how = "graphed" if cuda else "eager"
        fp8_ms = q.time_ms(fp8_block, dev, warmup=1, repeats=3)
        bf16_ms = q.time_ms(bf16_uncached, dev, warmup=1, repeats=3)
        rows("block", f"block_ms_fp8_{how}", fp8_ms, forwards=per_block)
        rows("block", "block_ms_bf16_uncached", bf16_ms, forwards=per_block)
        rows("block", "block_speedup", bf16_ms / fp8_ms, fp8=how)

    def sync_section() -> None:
        from dllm_ais.fp8 import FP8Linear, sync_weights

        copy = s.fp8_copy(default)
        layers = [m for m in copy.modules() if isinstance(m, FP8Linear)]
        params = sum(m.weight_q.numel() for m in layers)
        scales = sum(m.weight_scale.numel() for m in layers)
        moved = 2 * params + params + 4 * scales  # read bf16 weights, write e4m3 codes and fp32 scales
        rest = sum(p.numel() * p.element_size() for p in copy.parameters())  # embedding, norms, LM head
        bench_fp8 = q._script("bench_fp8")
        bandwidth = bench_fp8.copy_bandwidth(dev, (1 << 30) if cuda else (1 << 24), repeats=5)
        rows("sync", "copy_bandwidth_GBps", bandwidth / 1e9)
        rows("sync", "sync_floor_ms", moved / bandwidth * 1e3, params=params, bytes_moved=moved)
        rows("sync", "sync_fair_floor_ms", (moved + 2 * rest) / bandwidth * 1e3, bytes_moved=moved + 2 * rest,
             copied_bytes=rest)  # fmt: skip
        rows("sync", "sync_ms", q.time_ms(lambda c=copy: sync_weights(s.master, c), dev, warmup=1, repeats=3))
        del copy
        q._free(dev)

    def profile_section() -> None:
        from dllm_ais.atomic import atomic_write_text
        from dllm_ais.fp8 import sync_weights

        copy = s.fp8_copy(default)
        head = f"{bench_env.device_name(dev)}, fp8 {default}"
        window_bf16, window_fp8 = s.window(s.master), s.window(copy)
        shape = f"[{s.w['batch']} x {s.w['block']}]"
        texts = [q.profile_text(f"one dual-cache window step, bf16 master, {shape}", window_bf16, dev),
                 q.profile_text(f"one dual-cache window step, {head}, {shape}", window_fp8, dev)]
        atomic_write_text(args.out_dir / "profile_window.txt", "\n\n".join(texts) + "\n")
        rows("profile", "profile_window", "profile_window.txt")
        del window_bf16, window_fp8
        q.profile_to(args.out_dir / "profile_sync.txt", f"one sync_weights master -> fp8 copy, {head}",
                     lambda c=copy: sync_weights(s.master, c), dev)
        rows("profile", "profile_sync", "profile_sync.txt")
        del copy
        q._free(dev)

    def compiled_section() -> None:
        from dllm_ais.samplers import diffusion

        if not cuda:  # dynamo traces the same step; no inductor (seconds instead of minutes)
            diffusion._compiled_step = lambda device_type="cpu", cudagraphs=False: torch.compile(
                diffusion._step, backend="eager", dynamic=False)
        for name, build in (("bf16", lambda: s.master), ("fp8", lambda: s.fp8_copy(default))):
            if time.time() > deadline - (30 if cuda else 5):
                rows("compiled", f"window_ms_{name}_compiled", status="skipped", reason="deadline")
                continue
            try:
                model = build()
                step = s.window(model, compiled=2)
                rows("compiled", f"window_ms_{name}_compiled", q.time_ms(step, dev, warmup=3))
            except Exception as e:
                rows("compiled", f"window_ms_{name}_compiled", status="failed", reason=bench_env.error_reason(e))
            model = step = None
            q._free(dev)

    def dream_section() -> None:
        q._script("gpu_quick_dream").dream_window_section(q, args, rows, default)

    for name, fn in (("window", window_section), ("graphed", graphed_section), ("block", block_section),
                     ("sync", sync_section), ("profile", profile_section), ("compiled", compiled_section),
                     ("dream_window", dream_section)):
        q._section(rows, name, deadline, fn)
