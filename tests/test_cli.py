"""The `dllm-ais` command line: sample on the tiny default, clear errors for bad input."""

import subprocess
import sys

from dllm_ais.cli import main


def test_sample_prints_one_block_per_prompt(capsys):
    assert main(["sample", "--prompt", "1+1=", "--prompt", "2+2=", "--gen-length", "8", "--steps", "4",
                 "--block-length", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("### ") == 2 and "### 1+1=" in out and "### 2+2=" in out


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
