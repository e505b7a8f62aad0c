"""The estimator ladder's command (analysis/ladder.py): --smoke is bit-reproducible (rung 2's models trained anew each
time, its Monte Carlo, the report and the figure), and the rank intervals move only past distinguishable rivals."""

import pytest

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


def test_the_committed_rung2_results_come_from_the_documented_command():
    """benchmarks/estimators/rung2/results.json holds the config of `--rungs 2 --lengths 8,16,32,64 --paths
    8:4096,16:4096,32:1024,64:1024` (RUN.md's command), so the folder is what that command writes."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    stored = json.loads((repo / "benchmarks" / "estimators" / "rung2" / "results.json").read_text())["config"]
    cfg = ladder.rung2_config("full", (8, 16, 32, 64), ladder.parse_paths("8:4096,16:4096,32:1024,64:1024"))
    assert json.loads(json.dumps(asdict(cfg), default=float)) == stored
    assert {L for _, _, ls in stored["grid"] for L in ls} == {8, 16, 32, 64}


def test_the_status_says_what_each_rung_lacks():
    """The generated README says 'not run at scale' without rung 2's results and 'runs not done' without rung 3's,
    and names the paths per cell against the issue's 10^5."""
    from dllm_ais.analysis.ladder_text import status

    empty = "\n".join(status({}))
    assert "Rung 2 (Monte-Carlo ground truth): not run at scale" in empty and "runs not done" in empty
    cfg = ladder.rung2_config("full", (8,), 4096)
    from dataclasses import asdict

    doc = {"rung2": {"config": asdict(cfg), "cells": {"a": {}, "b": {}}}}
    text = "\n".join(status(doc))
    assert "2 cells" in text and "4,096 sampled paths per cell" in text and "≥ 100,000" in text
    assert "L = 8 only" in text and "not run at scale" in text


def test_paths_per_length():
    """--paths L:N,L:N gives each length its own count (the others keep Rung2Config's); a length rung 2 does not
    have is refused."""
    cfg = ladder.rung2_config("full", (8, 32), ladder.parse_paths("8:4096,32:1024"))
    assert dict(cfg.paths)[8] == 4096 and dict(cfg.paths)[32] == 1024
    assert dict(cfg.paths)[16] == dict(ladder.R2.Rung2Config().paths)[16]
    assert ladder.parse_paths("512") == 512
    with pytest.raises(SystemExit, match="L = \\[12\\]"):
        ladder.rung2_config("full", (8,), ladder.parse_paths("12:100"))
    with pytest.raises(SystemExit, match="L:N"):
        ladder.parse_paths("8:many")


def test_the_committed_reports_are_what_the_report_command_writes_from_the_committed_results(tmp_path):
    """benchmarks/estimators' README.md and ladder.json, and rung 1's README, regenerate byte for byte from the
    committed results (rung1/results.json, rung2/results.json, rung3/summary.json): a report edited by hand, or code
    that changed the report without regenerating it, fails here."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "estimators"
    shutil.copytree(repo / "benchmarks" / "estimators", out)
    ladder.report(out, figures=False)  # the figures: test_smoke_is_bit_reproducible
    for name in ("README.md", "ladder.json", "answer.md", "rung2/README.md"):
        assert (out / name).read_bytes() == (repo / "benchmarks" / "estimators" / name).read_bytes(), name
    # rung 1: what `python -m dllm_ais.analysis.estimators --report-only` does, less its figure
    import json

    from dllm_ais.analysis.estimator_report import summarise, write_readme

    doc = json.loads((out / "rung1" / "results.json").read_text())
    doc["summary"] = summarise(doc)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    assert text == (out / "rung1" / "results.json").read_text()
    write_readme(json.loads(text), out / "rung1" / "README.md")  # from the file's own order, as write_outputs does
    assert (out / "rung1" / "README.md").read_bytes() == (repo / "benchmarks/estimators/rung1/README.md").read_bytes()


def test_the_readme_answer_is_the_ladders_table():
    """README.md's answer block is benchmarks/estimators/answer.md, which `ladder.report` writes (the test above
    checks that file regenerates from the committed results)."""
    from pathlib import Path

    from dllm_ais.analysis.ladder_answer import ANSWER_BEGIN, ANSWER_END

    repo = Path(__file__).resolve().parent.parent
    readme = (repo / "README.md").read_text()
    block = readme[readme.index(ANSWER_BEGIN):readme.index(ANSWER_END) + len(ANSWER_END)]
    assert block + "\n" == (repo / "benchmarks" / "estimators" / "answer.md").read_text()
    assert "| ≤ 1 |" in block and "rung 3" in block
