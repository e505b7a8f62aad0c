"""scripts/compare_corrections.py: the --smoke run writes the four-row table and the plot; the --stress format."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_corrections.py"
RUNS = ("bf16-none", "fp8-none", "fp8-tis", "fp8-ais")


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_corrections_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_smoke_writes_four_rows_and_plot(compare, tmp_path):
    assert compare.main(["--smoke", "--out", str(tmp_path), "--no-progress"]) == 0
    md = (tmp_path / "comparison.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| run ")]
    assert [r.split("|")[1].strip() for r in rows] == list(RUNS)
    assert "python scripts/compare_corrections.py --smoke" in md and "Machine:" in md
    assert (tmp_path / "comparison.png").stat().st_size > 0
    results = {r["run"]: r for r in json.loads((tmp_path / "comparison.json").read_text())}
    assert results["bf16-none"]["lambda"] == 0.0 and results["bf16-none"]["ess"] == 1.0
    for name in RUNS:
        assert results[name]["steps"] == 3 and math.isfinite(results[name]["reward_final_q"])
    first_rows = {name: json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
                          for name in RUNS[1:]}
    lams = {name: row["ais/lambda"] for name, row in first_rows.items()}
    assert len(set(lams.values())) == 1, f"FP8 runs share weights and seeds at step 0: {lams}"


def test_existing_run_directory_is_refused(compare, tmp_path):
    (tmp_path / "fp8-ais").mkdir()
    with pytest.raises(SystemExit, match="already has run directories"):
        compare.main(["--smoke", "--out", str(tmp_path), "--no-progress"])


@pytest.mark.parametrize("bits", [0, 1, 2])
def test_stress_format_rounds_fp8_codes_and_is_undone(compare, bits):
    from dllm_ais.fp8.linear import FP8Linear

    linear = torch.nn.Linear(32, 16, bias=False)
    torch.nn.init.normal_(linear.weight, generator=torch.Generator().manual_seed(0))
    real = FP8Linear.from_linear(linear)
    with compare.coarse_rollout_weights(bits):
        coarse = FP8Linear.from_linear(linear)
    after = FP8Linear.from_linear(linear)
    assert torch.equal(after.weight_q.float(), real.weight_q.float()), "the patch is undone on exit"
    assert torch.equal(coarse.weight_scale, real.weight_scale)
    codes = coarse.weight_q.float()
    mant, _ = torch.frexp(codes)
    assert torch.equal(mant * 2 ** (bits + 1), torch.round(mant * 2 ** (bits + 1))), f"more than {bits} mantissa bits"
    assert codes.abs().max() <= (2 - 2**-bits) * 256
    rel = ((codes - real.weight_q.float()).abs() / real.weight_q.float().abs().clamp(min=1e-6)).max()
    assert 0 < rel <= 2.0 ** -(bits + 1) + 1e-6, "round to nearest: relative change at most half a coarse ulp"
