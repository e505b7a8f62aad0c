"""The estimator ladder's command (analysis/ladder.py): --smoke is bit-reproducible (rung 2's models trained anew each
time, its Monte Carlo, the report and the figure), and the rank intervals move only past distinguishable rivals."""

from dllm_ais.analysis import ladder
from dllm_ais.analysis.ladder_rank import rank_intervals


def test_smoke_is_bit_reproducible(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert ladder.main(["--smoke", "--rungs", "2", "--out", str(out)]) == 0
    for name in ("rung2/results.json", "rung2/README.md", "README.md", "ladder.json", "mse_vs_L.png"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    text = (outs[0] / "README.md").read_text()
    assert "| ≤ 1 |" in text and "rung 2" in text


def test_rank_intervals():
    mse = {"a": 1.0, "b": 1.1, "c": 3.0}
    sep = {("a", "c"), ("b", "c")}  # c is distinguishably worse than both; a and b are not distinguishable
    r = rank_intervals(mse, lambda x, y: (x, y) in sep)
    assert r["a"] == {"rank": 1, "lo": 1, "hi": 2}
    assert r["b"] == {"rank": 2, "lo": 1, "hi": 2}
    assert r["c"] == {"rank": 3, "lo": 3, "hi": 3}
