"""Compare mismatch corrections on the tiny default: BF16 rollouts vs FP8 rollouts with none / TIS / AIS.

    python scripts/compare_corrections.py --out runs/compare                 # tiny-cpu as preset (~minutes per run)
    python scripts/compare_corrections.py --out runs/compare --steps 60      # shorter GRPO phase
    python scripts/compare_corrections.py --out runs/compare --stress        # coarser fake rollout format (below)
    python scripts/compare_corrections.py --out /tmp/c --smoke               # seconds

Runs (one seed, same SFT-warmed start, same data and sampling seeds; only the rollout policy and the correction
differ):

    bf16-none   rollout_precision="bf16", correction="none"   μ = π_old: the reference without mismatch
    fp8-none    rollout_precision="fp8",  correction="none"   biased: FP8 rollouts, no correction
    fp8-tis     rollout_precision="fp8",  correction="tis"    truncated IS, ω = min(w, C)
    fp8-ais     rollout_precision="fp8",  correction="ais"    AIS, ω = (1 − λ) + λ min(w, C)

The SFT warm-up runs once (`<out>/sft-warmup`, a 1-step run whose `sft/` cache is copied into every run directory),
so all four GRPO phases start from the same weights and their wall times exclude SFT. Each run is a normal
`dllm_ais.train_job.run_training` run directory `<out>/<name>` (config.json, metrics.jsonl, checkpoints/). Then
`<out>/comparison.md` gets a table (first- and final-quarter mean reward, mean λ, ESS, divergence D, mismatch/kl,
wall time) and `<out>/comparison.png` overlays the curves (`dllm_ais.plot.plot_runs`, or a plain matplotlib
fallback drawing reward/mean and ais/lambda when that module is missing).

--stress [BITS]: a STRESS TEST, NOT THE REAL FP8 PATH. If the tiny model's e4m3 mismatch is too small to matter,
this makes it visible with a fake coarser rollout format: every time an FP8Linear of the rollout copy loads weights
(`quantize_model` at the start and `sync_weights` after every optimizer step) its e4m3 codes are rounded
(nearest, ties to even) to BITS mantissa bits (default 1: "e4m1"; 0 keeps only powers of two), with the same
blockwise scales. Activations stay e4m3. It is done by wrapping `FP8Linear.load_weight_` inside this script's
process only, for the FP8 runs only; the package is not modified. The mismatch it creates is of the same kind as
FP8's (a deterministic rounding of the rollout weights) but several times larger.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dllm_ais import metrics as M

SFT_RUN = "sft-warmup"
SFT_CACHE = "sft"  # dllm_ais.train_job.SFT_DIR: the cache run_training reuses when <out>/sft exists
DEFAULT_PRESET = "tiny-cpu"
SMOKE = dict(steps=3, sft_steps=3, prompts_per_step=2, num_generations=4, sft_batch_size=8, mismatch_num_draws=2)
"""--smoke: a few seconds per run."""


@dataclass(frozen=True)
class Variant:
    """One of the compared runs."""

    name: str
    """Run directory name under --out and label in the table and plot."""
    rollout_precision: str
    """TrainConfig.rollout_precision: bf16 or fp8."""
    correction: str
    """CorrectionConfig.correction."""


VARIANTS = (
    Variant("bf16-none", "bf16", "none"),
    Variant("fp8-none", "fp8", "none"),
    Variant("fp8-tis", "fp8", "tis"),
    Variant("fp8-ais", "fp8", "ais"),
)

COLUMNS = (
    ("run", "run"),
    ("rollout", "rollout"),
    ("correction", "correction"),
    ("reward_first_q", "reward, first quarter"),
    ("reward_final_q", "reward, final quarter (± s.e.)"),
    ("lambda", "mean λ"),
    ("ess", "mean ESS (R)"),
    ("divergence", "mean divergence D"),
    ("mismatch_kl", "mean mismatch/kl"),
    ("wall_s", "wall time (s)"),
)


# ---------------------------------------------------------------------------------------------------- stress format
def round_mantissa(x, bits: int):
    """Round x (fp32) to `bits` explicit mantissa bits, nearest with ties to even; zeros and signs are kept.

    On e4m3 codes this gives values that are again exactly e4m3 (fewer bits, exponent no lower), except that rounding
    up may exceed 448; the caller clamps to the coarse format's largest value (2 − 2^-bits) · 2^8.
    """
    import torch

    mant, exp = torch.frexp(x)  # x = mant · 2^exp, |mant| in [0.5, 1)
    step = 2.0 ** (bits + 1)
    return torch.ldexp(torch.round(mant * step) / step, exp)


@contextlib.contextmanager
def coarse_rollout_weights(bits: int | None):
    """While active, every FP8Linear.load_weight_ rounds its e4m3 codes to `bits` mantissa bits (None: no change).

    This is the --stress fake format, patched into this process only and undone on exit.
    """
    if bits is None:
        yield
        return
    import torch

    from dllm_ais.fp8.linear import FP8Linear
    from dllm_ais.fp8.quant import FP8_DTYPE

    if not 0 <= bits <= 3:
        raise ValueError(f"--stress {bits}: mantissa bits must be in 0..3 (e4m3 has 3; 3 = the real FP8 grid).")
    largest = (2.0 - 2.0**-bits) * 2.0**8  # largest value of the coarse grid with e4m3's exponent range
    original = FP8Linear.load_weight_

    @torch.no_grad()
    def load_weight_coarse(self, weight, bias=None):
        original(self, weight, bias)
        coarse = round_mantissa(self.weight_q.float(), bits).clamp(-largest, largest)
        self.weight_q.copy_(coarse.to(FP8_DTYPE))  # exact: the coarse grid is a subset of e4m3's

    FP8Linear.load_weight_ = load_weight_coarse
    try:
        yield
    finally:
        FP8Linear.load_weight_ = original


# ---------------------------------------------------------------------------------------------------------- runs
def build_preset(args: argparse.Namespace, variant: Variant | None = None):
    """The tiny-cpu preset with this script's overrides; `variant` sets the rollout precision and correction."""
    from dllm_ais.config import get_preset

    p = get_preset(DEFAULT_PRESET)
    train = dict(seed=args.seed)
    grpo = {}
    if args.smoke:
        train.update({k: v for k, v in SMOKE.items() if k != "num_generations"})
        grpo["num_generations"] = SMOKE["num_generations"]
    if args.steps is not None:
        train["steps"] = args.steps
    if args.sft_steps is not None:
        train["sft_steps"] = args.sft_steps
    if variant is not None:
        train["rollout_precision"] = variant.rollout_precision
    p = replace(p, model=replace(p.model, seed=args.seed), train=replace(p.train, **train),
                grpo=replace(p.grpo, **grpo))
    if variant is not None:
        p = replace(p, correction=replace(p.correction, correction=variant.correction))
    return p


def warm_start(args: argparse.Namespace, out: Path) -> Path | None:
    """Run the SFT warm-up once (a 1-step run in <out>/sft-warmup); returns its sft/ cache, or None without SFT."""
    from dllm_ais.train_job import run_training

    preset = build_preset(args)
    if preset.train.sft_steps == 0:
        return None
    run = out / SFT_RUN
    cache = run / SFT_CACHE
    if not cache.is_dir():
        print(f"SFT warm-up ({preset.train.sft_steps} steps) -> {cache}", flush=True)
        t0 = time.perf_counter()
        run_training(replace(preset, train=replace(preset.train, steps=1)), run, progress=not args.no_progress)
        print(f"  {time.perf_counter() - t0:.1f} s", flush=True)
    return cache


def run_variant(args: argparse.Namespace, variant: Variant, out: Path, cache: Path | None) -> float:
    """Train one variant into <out>/<name> (starting from the shared SFT cache); returns its wall time in seconds."""
    from dllm_ais.train_job import run_training

    run = out / variant.name
    if cache is not None:
        shutil.copytree(cache, run / SFT_CACHE)
    stress = args.stress if variant.rollout_precision == "fp8" else None
    print(f"{variant.name}: rollout {variant.rollout_precision}, correction {variant.correction}"
          + (f", stress e4m{stress}" if stress is not None else ""), flush=True)
    t0 = time.perf_counter()
    with coarse_rollout_weights(stress):
        run_training(build_preset(args, variant), run, progress=not args.no_progress)
    seconds = time.perf_counter() - t0
    print(f"  {seconds:.1f} s", flush=True)
    return seconds


# --------------------------------------------------------------------------------------------------------- summary
def _finite(values) -> list[float]:
    out = []
    for v in values:
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def _mean(values) -> float:
    vals = _finite(values)
    return sum(vals) / len(vals) if vals else float("nan")


def _sem(values) -> float:
    vals = _finite(values)
    if len(vals) < 2:
        return float("nan")
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1) / len(vals))


def summarize(rows: list[dict]) -> dict[str, float]:
    """Quarter means of reward/mean and whole-run means of the AIS diagnostics of one run's metrics rows."""
    rows = sorted(rows, key=lambda r: r[M.STEP])
    q = max(1, len(rows) // 4)
    col = lambda key, part=rows: [r.get(key) for r in part]  # noqa: E731
    return {
        "steps": len(rows),
        "reward_first_q": _mean(col(M.REWARD_MEAN, rows[:q])),
        "reward_final_q": _mean(col(M.REWARD_MEAN, rows[-q:])),
        "reward_final_q_sem": _sem(col(M.REWARD_MEAN, rows[-q:])),
        "lambda": _mean(col(M.AIS_LAMBDA)),
        "ess": _mean(col(M.AIS_ESS)),
        "divergence": _mean(col(M.AIS_DIVERGENCE)),
        "mismatch_kl": _mean(col(M.MISMATCH_KL)),
        "trunc_frac": _mean(col(M.AIS_TRUNC)),
        "step_s": _mean(col(M.time_key("step"))),
    }


def _fmt(x: float, digits: int = 3) -> str:
    if not math.isfinite(x):
        return "nan"
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def table(results: list[dict]) -> str:
    """The markdown table, one row per run."""
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        cells = [r["run"], r["rollout"], r["correction"], _fmt(r["reward_first_q"]),
                 f"{_fmt(r['reward_final_q'])} ± {_fmt(r['reward_final_q_sem'])}", _fmt(r["lambda"]), _fmt(r["ess"], 5),
                 _fmt(r["divergence"], 5), _fmt(r["mismatch_kl"], 5), f"{r['wall_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    """A one-line description of where this ran."""
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} logical CPUs (torch threads "
            f"{torch.get_num_threads()}), {dev}; Python {platform.python_version()}, torch {torch.__version__}")


def code_version() -> str:
    """`git <commit>` of the checkout this script belongs to, plus the package files with uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "dllm_ais", "samplers", "models", "tasks"],
                               cwd=root, capture_output=True, text=True, check=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"git {sha}" + (f" with uncommitted changes in {', '.join(changed)}" if changed else " (clean package tree)")


def write_markdown(path: Path, args: argparse.Namespace, results: list[dict], plot_note: str, argv: list[str]) -> None:
    """comparison.md: command, machine, settings, the table, the plot and how to read it."""
    p = build_preset(args)
    tc, g, c, s = p.train, p.grpo, p.correction, p.sampler
    stress = ("off (real FP8 path: e4m3 weights and activations, blockwise scales)" if args.stress is None else
              f"ON, e4m{args.stress} fake rollout weights (STRESS TEST, not the real FP8 path; see below)")
    text = f"""# Mismatch corrections on the tiny default: BF16 vs FP8 rollouts with none / TIS / AIS

Command: `python scripts/compare_corrections.py {shlex.join(argv)}`

Machine: {args.machine or machine()}

Code: {args.code_version}

Settings: preset `{DEFAULT_PRESET}` (task `{tc.task}` {json.dumps(tc.task_config)}), seed {tc.seed} (model init and
training), SFT warm-up {tc.sft_steps} steps (batch {tc.sft_batch_size}, run once and shared by all four runs), then
{tc.steps} GRPO steps × {tc.prompts_per_step} prompts × G = {g.num_generations} generations, L = {s.gen_length}
tokens, {s.steps} denoising steps, T = {s.temperature}, lr {tc.learning_rate}, loss `{g.loss_type}`, ε = {g.epsilon},
β = {g.beta}, {g.num_iterations} updates per step; mismatch ℓ from the coupled ELBO with K = {tc.mismatch_num_draws}
draws; C = {c.is_cap}, τ = {c.ais_tau}, EMA {c.ais_ema}; FP8 backend `{tc.fp8_backend}`. Stress: {stress}.

{table(results)}

Columns: reward = `reward/mean` of the rollouts (the rollout policy's samples at T = {s.temperature}), averaged over
the first and the final quarter of the steps; ± is the standard error of the per-step values of the final quarter
(autocorrelated, so it understates the noise; with one seed, differences smaller than a few s.e. are noise). λ, ESS,
D and mismatch/kl are means over all steps (`ais/lambda` is logged for every correction: for none/tis it is what AIS
would have used). Wall time is the whole `run_training` call (GRPO steps, FP8 quantisation/sync, checkpoint), not
the shared SFT; on CPU the FP8 path is an emulation (quantise → dequantise → fp32 matmul), so it is slower than BF16
here, unlike on an FP8 GPU.

{plot_note}
"""
    if args.stress is not None:
        text += f"""
Stress mode: after every weight load of an FP8Linear (initial quantisation and every sync) the e4m3 weight codes are
rounded to {args.stress} mantissa bit(s), keeping the blockwise scales — a fake coarser format that enlarges the
rollout/trainer mismatch so that the corrections have something to correct. It is patched into the script's process
only; the real FP8 path is the run without --stress.
"""
    path.write_text(text)


def plot(run_dirs: list[Path], out_png: Path, steps: int) -> str:
    """Overlay PNG of the runs' curves; returns the markdown line that shows it."""
    smooth = max(1, steps // 20)
    try:
        from dllm_ais.plot import plot_runs
    except ImportError:
        plot_fallback(run_dirs, out_png, smooth)
        how = "matplotlib fallback (dllm_ais.plot missing)"
    else:
        keys = (M.REWARD_MEAN, M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.MISMATCH_KL, M.AIS_TRUNC)
        plot_runs(run_dirs, out_png, keys=keys, smooth=smooth)
        how = "dllm_ais.plot.plot_runs"
    return f"![curves]({out_png.name}) — {how}, moving average over {smooth} step(s) over the faint raw curves."


def plot_fallback(run_dirs: list[Path], out_png: Path, smooth: int) -> None:
    """reward/mean and ais/lambda vs step for every run, with the Agg canvas (no pyplot, no global backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for i, run in enumerate(run_dirs):
        rows = sorted(M.read_metrics(run), key=lambda r: r[M.STEP])
        for ax, key in zip(axes, (M.REWARD_MEAN, M.AIS_LAMBDA), strict=True):
            pts = [(r[M.STEP], float(r[key])) for r in rows if key in r and math.isfinite(float(r[key]))]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            half = smooth // 2
            avg = [sum(ys[max(0, j - half):j - half + smooth]) / len(ys[max(0, j - half):j - half + smooth])
                   for j in range(len(ys))]
            ax.plot(xs, ys, color=f"C{i}", alpha=0.25, linewidth=0.8)
            ax.plot(xs, avg, color=f"C{i}", linewidth=1.5, label=run.name)
            ax.set_title(key)
            ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.savefig(out_png, dpi=110)


# ------------------------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare_corrections", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", required=True, help="output directory (one run directory per variant inside)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the preset's)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT warm-up steps (default: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init, data, rollouts and estimators")
    p.add_argument("--smoke", action="store_true", help="seconds: 3 SFT + 3 GRPO steps of 2 prompts × 4 generations")
    p.add_argument("--stress", type=int, nargs="?", const=1, default=None, metavar="BITS",
                   help="stress test: round the FP8 rollout weights to BITS mantissa bits (default 1); not real FP8")
    p.add_argument("--machine", default=None, help="machine description for comparison.md (default: detected)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the four trainings and write comparison.md and comparison.png; returns 0."""
    import torch

    torch.set_num_threads(1)  # tiny models: extra intra-op threads only add overhead on a shared CPU
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    taken = [v.name for v in VARIANTS if (out / v.name).exists()]
    if taken:
        raise SystemExit(f"--out {out} already has run directories {taken}; choose another --out or remove them.")
    out.mkdir(parents=True, exist_ok=True)
    args.code_version = code_version()  # at the start: the code the runs import
    cache = warm_start(args, out)
    results = []
    for variant in VARIANTS:
        seconds = run_variant(args, variant, out, cache)
        rows = M.read_metrics(out / variant.name)
        results.append({"run": variant.name, "rollout": variant.rollout_precision, "correction": variant.correction,
                        "wall_s": seconds, **summarize(rows)})
    run_dirs = [out / v.name for v in VARIANTS]
    plot_note = plot(run_dirs, out / "comparison.png", build_preset(args).train.steps)
    write_markdown(out / "comparison.md", args, results, plot_note, argv)
    (out / "comparison.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"wrote {out / 'comparison.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
