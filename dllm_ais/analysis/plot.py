"""Training curves from runs' metrics.jsonl: one subplot per metric vs step, several runs overlaid (`dllm-ais plot`).

NaN/inf values (logged as "nan"/"inf" strings, e.g. a skipped step) are left out of the curves. An optional centred
moving average draws a smoothed line over the faint raw one. matplotlib is imported lazily and drives the Agg canvas
directly (no pyplot, no global backend switch).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from dllm_ais import metrics as M
from dllm_ais.atomic import atomic_file

DEFAULT_KEYS = (M.REWARD_MEAN, M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.MISMATCH_KL)
"""Metrics plotted by default: reward, AIS mixing coefficient λ, normalised ESS R, divergence D, mismatch KL."""

TITLES = {M.MISMATCH_KL: f"{M.MISMATCH_KL}: estimate of KL(μ‖π_old)\nmean(−ℓ/L); noise can make it < 0"}
"""Panel titles that need more than the metric's name (an estimator that can come out negative says so)."""


def panel_title(key: str) -> str:
    """Title of the panel plotting `key`."""
    return TITLES.get(key, key)


def check_out_path(out: Path) -> Path:
    """The PNG to write for --out `out`: a directory gets curves.png inside it; a path below an existing file is a
    one-line error naming the file (instead of mkdir's "[Errno 17] File exists")."""
    if out.is_dir():
        return out / "curves.png"
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise FileExistsError(f"--out {out}: {parent} is a file, not a directory; choose another --out.")
    return out


def _number(value) -> float:
    """A metrics value as float: numbers as is, "nan"/"inf" strings parsed, anything else NaN."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def read_run(run_dir: str | os.PathLike) -> list[dict]:
    """Rows of `run_dir/metrics.jsonl`; a torn last line (run killed mid-write) is dropped, other bad lines raise."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        what = "does not exist" if not Path(run_dir).exists() else "has no metrics.jsonl"
        raise FileNotFoundError(f"{run_dir} {what}: pass a training run directory (one written by dllm-ais train).")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON ({e}).") from e
    if not rows:
        raise ValueError(f"{path} is empty: the run has not finished a step yet.")
    return rows


def curve(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`, skipping rows without it or with a non-finite value or step."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        if key not in row:
            continue
        x, y = _number(row.get(M.STEP, i)), _number(row[key])
        if math.isfinite(x) and math.isfinite(y):
            xs.append(x)
            ys.append(y)
    return xs, ys


def moving_average(values: list[float], window: int) -> list[float]:
    """Centred mean over `window` neighbouring values (truncated at the ends, so no lag); window 1 = the values."""
    if window < 1:
        raise ValueError(f"smoothing window {window} must be >= 1.")
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    before, n = window // 2, len(values)
    out = []
    for i in range(n):
        lo, hi = max(0, i - before), min(n, i - before + window)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def _labels(run_dirs: list[Path]) -> list[str]:
    """Run directory names, or the paths as given when two runs share a name."""
    names = [p.resolve().name or str(p) for p in run_dirs]
    return names if len(set(names)) == len(names) else [str(p) for p in run_dirs]


def plot_runs(run_dirs: list, out_png: str | os.PathLike | None = None, keys=DEFAULT_KEYS,
              smooth: int = 1) -> Path:
    """Write a PNG of `keys` vs step for every run in `run_dirs`; returns its path.

    out_png: default `<first run>/curves.png`. smooth: moving-average window (1 = raw curves). A key that no run
    logs raises ValueError listing the keys the runs have; a key a run logs only as NaN gets an empty panel.
    """
    if not run_dirs:
        raise ValueError("no run directories given.")
    keys = list(keys)
    if not keys:
        raise ValueError("no metric keys given.")
    if smooth < 1:
        raise ValueError(f"smooth={smooth} must be >= 1 (1 = no smoothing).")
    paths = [Path(d) for d in run_dirs]
    out = check_out_path(Path(out_png) if out_png is not None else paths[0] / "curves.png")
    runs = [read_run(p) for p in paths]
    available = sorted({k for rows in runs for row in rows for k in row} - {M.STEP})
    missing = [k for k in keys if k not in available]
    if missing:
        raise ValueError(f"metric(s) {missing} are in none of the runs; available: {', '.join(available)}.")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(4.5 * ncols, 3.2 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colors = [f"C{i % 10}" for i in range(len(paths))]
    for ax, key in zip(axes, keys, strict=False):
        drawn = False
        for rows, label, color in zip(runs, _labels(paths), colors, strict=True):
            xs, ys = curve(rows, key)
            if not xs:
                continue
            drawn = True
            if smooth > 1:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(xs, moving_average(ys, smooth), color=color, linewidth=1.5, label=label)
            else:
                ax.plot(xs, ys, color=color, linewidth=1.2, marker="." if len(xs) < 30 else None, label=label)
        if not drawn:
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(panel_title(key), fontsize=10 if key not in TITLES else 8)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:len(keys)]:
        if handles:
            break
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=min(4, len(handles)), fontsize=9)

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return out


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `dllm-ais plot`."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="training run directories (metrics.jsonl)")
    parser.add_argument("--out", default=None, help="output PNG, or a directory for curves.png in it (default "
                        "<first RUN_DIR>/curves.png)")
    parser.add_argument("--keys", action="append", default=None, metavar="KEY[,KEY...]",
                        help=f"metrics to plot, repeatable or comma list (default {', '.join(DEFAULT_KEYS)})")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in steps (1: raw curves)")


def cmd_plot(args: argparse.Namespace) -> int:
    """Run `dllm-ais plot`: write the PNG and print its path."""
    keys = [k.strip() for value in args.keys for k in value.split(",") if k.strip()] if args.keys else DEFAULT_KEYS
    out = plot_runs(args.run_dirs, args.out, keys=keys, smooth=args.smooth)
    print(f"wrote {out}")
    return 0
