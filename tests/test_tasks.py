"""Cross-task contracts: registry, reward-function plug-in, TRL reward conventions shared by every task."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import pytest

from dllm_ais.tasks.base import Task, chat_messages, check_aligned, completion_text
from dllm_ais.tasks.registry import TASKS, get_task, load_reward_function

DATA = resources.files("dllm_ais.tasks") / "data"

# A few rows per task, generated offline (arith/countdown/sudoku) or read from the shipped samples.
SAMPLE_FILES = {"gsm8k": "gsm8k_sample.jsonl", "math500": "math500_sample.jsonl"}


def _rows(task: Task) -> list[dict]:
    if task.name in SAMPLE_FILES:
        return task.load("test", data_path=str(DATA / SAMPLE_FILES[task.name]), limit=3)
    return task.load("test", limit=3, seed=0)


def test_registry_holds_every_builtin_task():
    assert set(TASKS) == {"gsm8k", "math500", "countdown", "sudoku", "arith", "digits"}
    for name, task in TASKS.items():
        assert isinstance(task, Task) and task.name == name and get_task(name) is task
        assert task.answer_columns and task.description
    assert not get_task("arith").use_chat_template and get_task("gsm8k").use_chat_template


def test_unknown_task_error_lists_known_names():
    with pytest.raises(KeyError, match="unknown task 'gsm9k'.*arith, countdown, digits, gsm8k, math500, sudoku"):
        get_task("gsm9k")


def test_load_reward_function_by_import_path():
    from dllm_ais.tasks import arith

    assert load_reward_function("dllm_ais.tasks.arith:reward") is arith.reward
    assert load_reward_function("dllm_ais.tasks.registry:TASKS.get") is not None  # dotted attribute path


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("no_colon_here", ValueError, "package.module:function"),
        ("dllm_ais.tasks.arith:", ValueError, "package.module:function"),
        ("surely_not_a_module_xyz:reward", ImportError, "cannot import module 'surely_not_a_module_xyz'"),
        ("dllm_ais.tasks.arith:no_such_reward", ImportError, "has no attribute 'no_such_reward'"),
        ("dllm_ais.tasks.arith:NAME", TypeError, "is a str, not a callable"),
    ],
)
def test_load_reward_function_errors(path, error, message):
    with pytest.raises(error, match=message):
        load_reward_function(path)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_rewards_follow_trl_conventions(name, capsys):
    """Right-length float lists; garbage and empty text score 0; extra TRL kwargs ignored; nothing printed."""
    task = get_task(name)
    rows = _rows(task)
    assert all(isinstance(r["prompt"], str) and r["prompt"] == task.build_prompt(r) for r in rows)
    assert all(r.keys() == rows[0].keys() for r in rows) and set(task.answer_columns) <= rows[0].keys()
    columns = {c: [r[c] for r in rows] for c in task.answer_columns}
    prompts = [r["prompt"] for r in rows]
    garbage = ["", "I don't know", "<answer></answer>"]
    scores = task.reward(prompts, garbage, completion_ids=[[1], [2], [3]], trainer_state=None, **columns)
    assert scores == [0.0, 0.0, 0.0] and all(type(s) is float for s in scores)
    conversational = [[{"role": "assistant", "content": text}] for text in garbage]
    assert task.reward(prompts, conversational, **columns) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="entries for 2 completions"):
        task.reward(prompts, garbage[:2], **columns)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_completion_text_and_alignment_helpers():
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]) == "xy"
    assert completion_text({"role": "assistant", "content": "z"}) == "z"
    assert completion_text(None) == "" and completion_text(42) == ""
    assert chat_messages("hi") == [{"role": "user", "content": "hi"}]
    check_aligned(["a", "b"], answer=["1", "2"])
    with pytest.raises(ValueError, match="'answer' has 1 entries for 2 completions"):
        check_aligned(["a", "b"], answer=["1"])


def test_importing_tasks_stays_light():
    code = (
        "import sys, dllm_ais.tasks.registry; "
        "heavy = [m for m in ('datasets', 'math_verify', 'sympy') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
