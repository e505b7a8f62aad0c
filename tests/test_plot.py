"""Training-curve plots: a valid PNG from synthetic runs, NaN rows skipped, clear errors for non-run directories."""

import argparse
import json
import math

import pytest

from dllm_ais.analysis.plot import (
    DEFAULT_KEYS,
    add_plot_arguments,
    cmd_plot,
    curve,
    moving_average,
    plot_runs,
    read_run,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(path, n_steps, phase, nan_at=()):
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as f:
        for step in range(n_steps):
            row = {"step": step, "reward/mean": step / n_steps, "ais/lambda": 0.5 + 0.4 * math.sin(step + phase),
                   "ais/ess_frac": 0.9, "ais/divergence": 0.01 * step, "mismatch/kl": 1e-3 * (step + phase)}
            if step in nan_at:
                row["ais/lambda"] = "nan"  # how MetricsWriter logs a non-finite value
            f.write(json.dumps(row) + "\n")
    return path


def _is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


def test_two_runs_give_a_png_and_nan_rows_are_skipped(tmp_path):
    a = _write_run(tmp_path / "ais", 12, 0.0, nan_at=(3, 4))
    b = _write_run(tmp_path / "tis", 9, 1.0)
    out = plot_runs([a, b], tmp_path / "figs" / "curves.png")
    assert out == tmp_path / "figs" / "curves.png" and _is_png(out)
    steps, values = curve(read_run(a), "ais/lambda")
    assert len(steps) == 10 and 3 not in steps and all(math.isfinite(v) for v in values)
    smoothed = plot_runs([a, b], tmp_path / "smooth.png", keys=["reward/mean", "ais/lambda"], smooth=3)
    assert _is_png(smoothed)
    assert not list(tmp_path.rglob(".*.tmp-*")), "temporary files must not be left behind"


def test_moving_average_is_centred_and_truncated_at_the_ends():
    assert moving_average([1.0, 2.0, 3.0, 4.0, 5.0], 3) == [1.5, 2.0, 3.0, 4.0, 4.5]
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([1.0, 5.0], 1) == [1.0, 5.0]
    assert moving_average([2.0, 4.0], 10) == [3.0, 3.0]


def test_missing_metrics_and_unknown_keys_raise_clearly(tmp_path):
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        plot_runs([empty], tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_runs([tmp_path / "nowhere"], tmp_path / "x.png")
    run = _write_run(tmp_path / "run", 3, 0.0)
    with pytest.raises(ValueError, match=r"in none of the runs; available: .*ais/lambda"):
        plot_runs([run], tmp_path / "x.png", keys=["ais/lamda"])
    assert not (tmp_path / "x.png").exists()


def test_cmd_plot_defaults_to_first_run_and_reads_comma_keys(tmp_path, capsys):
    a = _write_run(tmp_path / "a", 5, 0.0)
    b = _write_run(tmp_path / "b", 5, 2.0)
    parser = argparse.ArgumentParser()
    add_plot_arguments(parser)
    assert cmd_plot(parser.parse_args([str(a), str(b)])) == 0
    assert _is_png(a / "curves.png") and str(a / "curves.png") in capsys.readouterr().out
    args = parser.parse_args([str(a), "--keys", "reward/mean,ais/lambda", "--keys", "mismatch/kl", "--out",
                              str(tmp_path / "k.png")])
    assert cmd_plot(args) == 0 and _is_png(tmp_path / "k.png")
    assert len(DEFAULT_KEYS) == 5
