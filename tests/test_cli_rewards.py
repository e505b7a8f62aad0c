"""`dllm-ais train --reward-fn ... --reward-weights ...`: TRL-style functions through the CLI; failures stop the run."""

import pytest

from dllm_ais import metrics as M
from dllm_ais.cli import main

MODULE = '''
calls = []

def always_fails(prompts, completions, **kwargs):
    raise KeyError("solution")

def length(*, prompts, completions, completion_ids, trainer_state, **kwargs):
    calls.append(trainer_state.global_step)
    return [float(len(ids)) for ids in completion_ids]

def half_none(completions, **kwargs):
    return [None if i % 2 else 1.0 for i in range(len(completions))]
'''


@pytest.fixture
def rewards_module(tmp_path, monkeypatch):
    name = f"cli_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


SMALL = ["--steps", "4", "--sft-steps", "0", "--no-progress"]


def test_failing_reward_function_stops_with_an_error_not_exit_0(tmp_path, rewards_module, capsys):
    out = tmp_path / "run"
    code = main(["train", "--out", str(out), "--reward-fn", f"{rewards_module}:always_fails", *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    assert "rewards failed on 3 consecutive steps" in err and "KeyError" in err
    assert [r[M.REWARD_ERRORS] for r in M.read_metrics(out)] == [1.0, 1.0]  # the third failure stops before logging


def test_several_reward_functions_with_weights(tmp_path, rewards_module, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--reward-fn", f"{rewards_module}:length", "--reward-fn",
                 f"{rewards_module}:half_none", "--reward-weights", "0.5,2", "--steps", "2", "--sft-steps", "0",
                 "--no-progress"]) == 0
    rows = M.read_metrics(out)
    assert all(r[M.REWARD_ERRORS] == 0.0 for r in rows)
    for r in rows:  # total = 0.5 * mean length + 2 * (1.0 on every other sample, None elsewhere -> ignored)
        assert r[M.reward_key("fn/half_none")] == 1.0
        assert r[M.REWARD_MEAN] == pytest.approx(0.5 * r[M.reward_key("fn/length")] + 2 * 0.5)
    import importlib

    assert importlib.import_module(rewards_module).calls == [0, 1]


def test_reward_weights_errors(tmp_path, rewards_module, capsys):
    args = ["train", "--out", str(tmp_path / "run"), "--reward-fn", f"{rewards_module}:length", *SMALL]
    assert main([*args, "--reward-weights", "1,2"]) == 2
    assert "--reward-weights has 2 value(s) for 1 reward function(s)" in capsys.readouterr().err
    assert main([*args, "--reward-weights", "one"]) == 2
    assert "--reward-weights 'one': expected comma-separated numbers" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
