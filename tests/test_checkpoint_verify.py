"""Checkpoints are verified wherever they are loaded (issue 29, item 5): `train --resume` falls back to the newest
intact checkpoint (saying which steps are lost, metrics.jsonl truncated to match) or refuses when none is intact;
`eval --run`, `eval --model <run>/checkpoints/step-N` and `sample --run` refuse a corrupt one naming the file. Sizes are
always checked, sha256 unless --no-hash-check. The two corruptions: one byte flipped inside model.safetensors (same
size: only the hash sees it), chat_template.jinja truncated (the size sees it)."""

from __future__ import annotations

import json
import shutil

import pytest

from dllm_ais import metrics as M
from dllm_ais.cli import main
from dllm_ais.train.run_dir import CheckpointCorrupt, RunDir

TIMING = ("time/", "rollout/tokens_per_s")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny 3-step run with a checkpoint after every step (step-000001 … step-000003)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "--out", str(out), "--steps", "3", "--sft-steps", "2", "--save-every", "1",
                 "--no-progress", "--threads", "1"]) == 0
    return out


@pytest.fixture
def run(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-5])


def _ckpt(run, step):
    return run / "checkpoints" / f"step-{step:06d}"


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_verify_checks_sizes_always_and_hashes_unless_told_not_to(run):
    ckpt = _ckpt(run, 3)
    RunDir.verify(ckpt)
    _flip_byte(ckpt / "model" / "model.safetensors")
    with pytest.raises(CheckpointCorrupt, match="file model/model.safetensors does not match its manifest"):
        RunDir.verify(ckpt)
    RunDir.verify(ckpt, hashes=False)  # same size: only sha256 sees a flipped byte
    with pytest.raises(CheckpointCorrupt, match="model/model.safetensors"):
        RunDir.verify(ckpt, hash_only=("model/",))
    RunDir.verify(ckpt, hash_only=("adapter/",))  # what a load of adapter/ hashes
    _truncate(ckpt / "model" / "chat_template.jinja")
    with pytest.raises(CheckpointCorrupt, match="file model/chat_template.jinja does not match its manifest"):
        RunDir.verify(ckpt, hashes=False)  # a size mismatch is caught without hashing
    assert [p.name for p in RunDir(run).step_dirs()] == ["step-000003", "step-000002", "step-000001"]
    assert RunDir(run).newest_intact()[0] == _ckpt(run, 2)


def test_resume_falls_back_to_the_newest_intact_checkpoint(run, capsys):
    before = M.read_metrics(run)
    _flip_byte(_ckpt(run, 3) / "model" / "model.safetensors")
    assert main(["train", "--out", str(run), "--resume", "--steps", "4", "--no-progress", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if line.startswith("warning: --resume")]
    assert len(warning) == 1, captured.err
    for part in ("step-000003: file model/model.safetensors does not match", "Resuming from step-000002",
                 "step 2 is lost and will be redone", "step-000003 to step-000003.corrupt"):
        assert part in warning[0], warning[0]
    assert "2 steps in" in captured.out  # steps 2 and 3 ran in this launch
    rows = M.read_metrics(run)
    assert [r[M.STEP] for r in rows] == [0, 1, 2, 3]  # step 2's old row dropped, the redone one written once

    def same(r):
        return {k: v for k, v in r.items() if not k.startswith(TIMING)}

    assert [same(r) for r in rows[:3]] == [same(r) for r in before]  # redone from the intact state: identical on CPU
    assert (run / "checkpoints" / "step-000003.corrupt").is_dir()
    assert RunDir(run).latest().name == "step-000004"
    RunDir.verify(_ckpt(run, 3))  # rewritten by the resumed run


def test_resume_refuses_when_no_checkpoint_is_intact(run, capsys):
    for step in (1, 2, 3):
        _truncate(_ckpt(run, step) / "model" / "chat_template.jinja")
    metrics = (run / "metrics.jsonl").read_text()
    config = json.loads((run / "config.json").read_text())
    assert main(["train", "--out", str(run), "--resume", "--steps", "5", "--no-progress"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "no intact checkpoint" in line and "step-000003: file model/chat_template.jinja" in line, line
    assert "step-000002, step-000001 fail too" in line, line
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing touched
    assert json.loads((run / "config.json").read_text()) == config
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000001", "step-000002",
                                                                        "step-000003"]


def test_eval_run_and_eval_model_name_the_corrupt_file(run, capsys):
    _flip_byte(_ckpt(run, 3) / "model" / "model.safetensors")
    assert main(["eval", "--run", str(run), "--limit", "1", "--out", str(run / "ev")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "step-000003: file model/model.safetensors does not match its manifest" in line, line
    assert f"An older checkpoint to try: --model {_ckpt(run, 2)} (it verifies)" in line, line
    _truncate(_ckpt(run, 2) / "model" / "chat_template.jinja")
    assert main(["eval", "--model", str(_ckpt(run, 2)), "--limit", "1", "--no-hash-check",
                 "--out", str(run / "ev")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "step-000002: file model/chat_template.jinja does not match its manifest" in line, line
    assert not (run / "ev").exists()


def test_sample_run_names_the_corrupt_file_and_no_hash_check_checks_sizes_only(run, capsys):
    _flip_byte(_ckpt(run, 3) / "model" / "model.safetensors")
    assert main(["sample", "--run", str(run), "--steps", "1", "--prompt", "1+1="]) == 2
    assert "file model/model.safetensors does not match its manifest" in _one_line(capsys.readouterr().err)
    assert main(["sample", "--run", str(run), "--steps", "1", "--prompt", "1+1=", "--no-hash-check"]) == 0
    assert "### 1+1=" in capsys.readouterr().out  # same size, not hashed: loaded (what the flag trades away)


def test_eval_run_suggests_only_a_checkpoint_that_verifies(run, capsys):
    """`eval --run` checks an older checkpoint before suggesting it (as --resume does): with step 3 and 2 broken it
    names step 1; with every manifest deleted it says that none verifies instead of suggesting one that fails."""
    _flip_byte(_ckpt(run, 3) / "model" / "model.safetensors")
    _truncate(_ckpt(run, 2) / "model" / "chat_template.jinja")
    assert main(["eval", "--run", str(run), "--limit", "1", "--out", str(run / "ev")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"An older checkpoint to try: --model {_ckpt(run, 1)} (it verifies)" in line, line
    for step in (1, 2, 3):
        (_ckpt(run, step) / "manifest.json").unlink()
    assert main(["eval", "--run", str(run), "--limit", "1", "--out", str(run / "ev")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "older checkpoint to try" not in line and "No older checkpoint verifies either" in line, line
    assert "step-000002, step-000001 checked" in line, line
    assert not (run / "ev").exists()


def test_eval_writes_into_the_run_and_says_what_it_does(run, capsys, monkeypatch, tmp_path):
    """Without --out, `eval --run` writes under <run>/evals/ (not ./evals/) and prints a line before it starts and
    per batch (stderr is not a tty here); an explicit --out still wins."""
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--run", str(run), "--limit", "2", "--batch-size", "1"]) == 0
    captured = capsys.readouterr()
    assert not (tmp_path / "evals").exists()
    written = list((run / "evals").glob("*/*/scores.json"))
    assert len(written) == 1, written
    assert f"writing {written[0].parent}" in captured.err
    assert "batch 1/2" in captured.err and "batch 2/2" in captured.err, captured.err
    assert main(["eval", "--run", str(run), "--limit", "1", "--out", str(tmp_path / "mine")]) == 0
    assert list((tmp_path / "mine").glob("*/scores.json"))
