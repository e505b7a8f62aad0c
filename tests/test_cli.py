"""The `dllm-ais` command line: sample on the tiny default, clear errors for bad input."""

import subprocess
import sys

from dllm_ais.cli import main


def test_sample_prints_one_block_per_prompt(capsys):
    assert main(["sample", "--prompt", "1+1=", "--prompt", "2+2=", "--gen-length", "8", "--steps", "4",
                 "--block-length", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("### ") == 2 and "### 1+1=" in out and "### 2+2=" in out


def test_sample_without_prompts_uses_the_presets_task(capsys):
    """The tiny model is trained on its preset's task, so `sample` with no --prompt shows that task's test prompts."""
    from dllm_ais.analysis.evaluate import _load_rows
    from dllm_ais.presets import get_preset
    from dllm_ais.tasks.registry import get_task

    train = get_preset("tiny-cpu").train
    expected = [r["prompt"] for r in _load_rows(get_task(train.task), "test", None, 3, 0, train.task_config)]
    assert main(["sample", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert [line[4:] for line in out.splitlines() if line.startswith("### ")] == expected


def test_bad_preset_and_config_give_clear_errors(capsys):
    assert main(["sample", "--preset", "nope"]) == 2
    assert "known presets: tiny-cpu" in capsys.readouterr().err
    assert main(["sample", "--gen-length", "10", "--block-length", "4"]) == 2
    assert "multiple of block_length" in capsys.readouterr().err
    assert main(["sample", "--model", "/nonexistent/dir"]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err


def test_import_is_light():
    code = ("import sys, dllm_ais, dllm_ais.config, dllm_ais.cli; "
            "print(sorted({'triton', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_sample_with_the_fp8_copy_and_unsupported_backend(capsys):
    assert main(["sample", "--fp8", "--prompt", "1+1=", "--gen-length", "8", "--steps", "4"]) == 0
    assert "### 1+1=" in capsys.readouterr().out
    assert main(["sample", "--fp8", "--backend", "torchao"]) == 2
    err = capsys.readouterr().err
    assert "torchao" in err and "torch" in err.split("run on cpu:")[-1]


def test_variance_subcommand_runs_the_study(tmp_path):
    assert main(["variance", "--smoke", "--out", str(tmp_path), "--no-progress"]) == 0
    assert (tmp_path / "variance.csv").is_file() and (tmp_path / "variance.png").is_file()


def test_train_subcommand_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--steps", "2", "--sft-steps", "2", "--no-progress"]
    assert main(args) == 0
    assert "2 steps" in capsys.readouterr().out
    assert main(args) == 2 and "already holds a run" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--steps", "3", "--no-progress"]) == 0
    assert (out / "checkpoints" / "step-000003").is_dir()
    assert main(["plot", str(out), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_version_and_python_dash_m_are_the_same_cli():
    """`dllm-ais --version` prints the installed distribution's version; `python -m dllm_ais` is the same parser (same
    version line, same one-line refusal and exit code 2 for an unknown flag)."""
    from importlib.metadata import version

    import dllm_ais

    assert dllm_ais.__version__ == version("dllm-ais")  # pyproject.toml and __init__.py agree
    entry = subprocess.run([sys.executable, "-c", "import sys; from dllm_ais.cli import main; sys.exit(main())",
                            "--version"], capture_output=True, text=True, timeout=120)
    module = subprocess.run([sys.executable, "-m", "dllm_ais", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert entry.returncode == module.returncode == 0
    assert entry.stdout == module.stdout == f"dllm-ais {dllm_ais.__version__}\n"
    bad = subprocess.run([sys.executable, "-m", "dllm_ais", "train", "--no-such-flag"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad.stderr
