"""d1's evaluation protocol: hand-written generations scored as d1's parsers score them, and `eval --score-file`.

The expected values follow d1's eval/parse_and_get_acc.py behaviour (commit 837888f); the same parsers agreed with
d1's own code on every one of its 5,000+ committed LLaDA-8B-Instruct baseline generations (see the report/README).
"""

import json

import pytest

from dllm_ais.cli import main
from dllm_ais.tasks import d1

PUZZLE, SOLUTION = "4320004330100004", "4321124334122134"  # 8 blanks


@pytest.mark.parametrize("text,expected", [
    ("<reasoning>..</reasoning><answer>\\boxed{...} \\boxed{18}</answer>", 18.0),  # '...' is skipped
    ("so \\boxed{x = 12 apples} and \\boxed{13}", 12.0),  # first box holding a number, its first number
    ("<answer>The answer is 3, no: 42</answer><|eot_id|>", 42.0),  # no box: the answer span's last number
    ("<answer>\n-7.5\n</answer>", -7.5),
    ("the answer is 42", None),  # neither format
])
def test_gsm8k_parsing(text, expected):
    assert d1.parse_gsm8k(text) == expected


def test_gsm8k_scores_against_gold_and_none_gold():
    assert d1.score("gsm8k", "<answer>1,000? no: 1000</answer>", {"answer": "1000"}) == (1.0, 1.0)
    assert d1.score("gsm8k", "<answer>1000</answer>", {"answer": None}) == (0.0, 1.0)


@pytest.mark.parametrize("text,gold,correct", [
    ("<answer>\\boxed{\\dfrac{1}{2}}</answer>", "\\frac{1}{2}", True),
    ("\\boxed{0.5}", "\\frac12", True),  # both normalise to \frac{1}{2}
    ("\\boxed{x = 3}", "3", True),  # a short left-hand side is dropped
    ("\\boxed{10^{\\circ}}", "10", True),
    ("\\boxed 5$ more", "5", True),  # the '\boxed ' spelling, up to '$'
    ("\\boxed{3", "3", False),  # open box, no <answer>: nothing parsed
    ("\\boxed{3 <answer>3</answer>", "3", True),  # open box: the <answer> span instead
    ("The answer is 3.", "3", False),  # no box: the whole text is compared
    ("\\boxed{x/2}", "x/2", True),  # d1's normaliser raises on a non-integer a/b: raw strings compared
    ("\\boxed{x/2}", "\\frac{x}{2}", False),
])
def test_math500_parsing_and_equivalence(text, gold, correct):
    assert d1.score("math500", text, {"answer": gold}) == (float(correct), 1.0)


@pytest.mark.parametrize("text,correct", [
    ("<answer>\\boxed{3 * 5 + 7}</answer>", True),
    ("\\boxed{3 \\times 5 + 7 = 22}", True),  # LaTeX operator; only the left side of '= number'
    ("\\boxed{5 * 3 + 7 + 7}", False),  # 7 used twice
    ("\\boxed{3 * 5 + 6}", False),  # wrong numbers
    ("\\boxed{3 * 5 + 7} = 21", True),  # only the box counts
    ("3 * 5 + 7 = 22 is my answer", True),  # no box: the whole text, left side of '= 22'
    ("\\boxed{(3 + 5}", False),  # open box, no <answer>: the whole text, which fails the number check
])
def test_countdown_parsing(text, correct):
    assert d1.score("countdown", text, {"numbers": [3, 5, 7], "target": 22}) == (float(correct), 1.0)


def test_countdown_division_within_tolerance_and_no_eval():
    assert d1.score("countdown", "\\boxed{6 / 3 * 4}", {"numbers": [6, 4, 3], "target": 8}) == (1.0, 1.0)
    assert d1.score("countdown", "\\boxed{6 / (3 - 3) * 4}", {"numbers": [6, 3, 3, 4], "target": 8})[0] == 0.0
    assert d1.score("countdown", "\\boxed{2 ** 3}", {"numbers": [2, 3], "target": 8})[0] == 0.0  # not eval


@pytest.mark.parametrize("text,cells", [
    (f"<answer>\n{SOLUTION}\n</answer><|eot_id|>", 8),
    ("<answer>\n4321 1243 3412 2134\n</answer>", 8),  # whitespace removed
    ("<answer>\n43211243</answer>", 3),  # padded with 0: only the blanks among the first 8 cells (3, 4, 5) count
    (f"<answer>\n{SOLUTION}99</answer>", 8),  # truncated to 16
    (f"<answer>\n```\n{SOLUTION}\n```\n</answer>", 8),
    (f"reasoning only {SOLUTION[:15]}", 0),  # no answer found
    (f"</answer>\n{SOLUTION}<|endoftext|>", 8),  # text after a closed answer
])
def test_sudoku_cell_accuracy(text, cells):
    assert d1.score("sudoku", text, {"puzzle": PUZZLE, "solution": SOLUTION}) == (float(cells), 8.0)


def test_prompts_follow_d1():
    row = {"numbers": [49, 55, 53], "target": 51}
    prompt = d1.user_prompt("countdown", row)
    assert prompt.endswith("</answer>\n\nNumbers: [49, 55, 53]\nTarget: 51")
    assert "For example: \\boxed{a + b * c}Respond in the following format:" in prompt
    assert d1.question("sudoku", {"puzzle": PUZZLE}) == f"Solve the following Sudoku puzzle: {PUZZLE}\n"
    assert d1.SYSTEM_PROMPTS["gsm8k"].startswith("You are a math expert.") and "\\boxed{}. \nRespond" in \
        d1.SYSTEM_PROMPTS["gsm8k"]
    with pytest.raises(ValueError, match="task 'arith' has no d1 protocol"):
        d1.user_prompt("arith", {})


# ---------------------------------------------------------------------------------------------------------------------
# eval --score-file

SUDOKU_TEXTS = [f"<answer>\n{SOLUTION}\n</answer><|eot_id|>", "<answer>\n43211243</answer>", "no answer"]


def _d1_file(path):
    items = [{"question": f"Solve the following Sudoku puzzle: {PUZZLE}\n", "prompt_input": "...",
              "generations": t, "ground_truth": SOLUTION} for t in SUDOKU_TEXTS]
    path.write_text(json.dumps({"generations": items, "metrics": {}, "gen_length": 256}, indent=2))
    return path


def _our_file(path):
    lines = [json.dumps({"index": i, "prompt": "p", "completion": t, "reward": 0.0, "puzzle": PUZZLE,
                         "solution": SOLUTION}) for i, t in enumerate(SUDOKU_TEXTS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _accuracy(out: str) -> float:
    return float(out.strip().splitlines()[-1].split()[-1])


@pytest.mark.parametrize("make", [_d1_file, _our_file])
def test_score_file_both_layouts_both_protocols(tmp_path, capsys, make):
    f = make(tmp_path / "gens.json")
    assert main(["eval", "--score-file", str(f), "--task", "sudoku", "--protocol", "d1"]) == 0
    assert _accuracy(capsys.readouterr().out) == pytest.approx((8 + 3 + 0) / 24, abs=1e-4)  # Σ cells / Σ blanks
    assert main(["eval", "--score-file", str(f), "--task", "sudoku"]) == 0
    assert _accuracy(capsys.readouterr().out) == pytest.approx(1 / 3, abs=1e-4)  # strict: exactly 16 digits


def test_score_file_pools_files_and_writes_out(tmp_path, capsys):
    a, b = _d1_file(tmp_path / "a.json"), _our_file(tmp_path / "b.jsonl")
    out = tmp_path / "out"
    assert main(["eval", "--score-file", str(a), "--score-file", str(b), "--task", "sudoku", "--protocol", "d1",
                 "--out", str(out)]) == 0
    scores = json.loads((out / "scores.json").read_text())
    assert scores["n"] == 6 and scores["layouts"] == ["d1", "ours"]
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows[:3]] == [1.0, 3 / 8, 0.0]


def test_score_file_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"completion": "x", "puzzle": "1", "solution": "2"}\n{oops\n')
    assert main(["eval", "--score-file", str(bad), "--task", "sudoku"]) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    assert main(["eval", "--score-file", str(bad)]) == 2
    assert "--score-file needs --task" in capsys.readouterr().err
    assert main(["eval", "--score-file", str(bad), "--task", "sudoku", "--model", "x"]) == 2
    assert "drop --model" in capsys.readouterr().err
    assert main(["eval", "--score-file", str(tmp_path / "none.json"), "--task", "gsm8k"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["eval", "--score-file", str(_our_file(tmp_path / "o.jsonl")), "--task", "gsm8k"]) == 2
    assert "missing column(s) ['answer']" in capsys.readouterr().err


def test_eval_protocol_d1_with_a_model_uses_d1_prompts_and_rescoring_agrees(tmp_path, capsys, monkeypatch):
    import torch

    from dllm_ais.analysis.evaluate import d1_sampler, evaluate, rescore
    from dllm_ais.models import load as load_module
    from dllm_ais.models.tiny import tiny_model, tiny_tokenizer

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": f"so #### {a + 1}"}) + "\n"
                            for a in range(3)))
    seen = []
    real = load_module.encode_prompts

    def spy(tokenizer, prompts, **kwargs):
        seen.append((prompts, kwargs.get("assistant_prefix")))
        return real(tokenizer, prompts, **kwargs)

    monkeypatch.setattr(load_module, "encode_prompts", spy)
    out = tmp_path / "out"
    scores = evaluate(tiny_model(seed=0, dtype=torch.float32), tiny_tokenizer(), "gsm8k", d1_sampler(32),
                      data_path=str(data), out_dir=out, protocol="d1")
    prompts, prefix = seen[0]
    assert prefix == "<reasoning>" and prompts[0] == d1.SYSTEM_PROMPTS["gsm8k"] + "\n\nWhat is 0 + 1?"
    assert scores["protocol"] == "d1" and (scores["block_length"], scores["steps"]) == (32, 16)
    rescored, rows = rescore([str(out / "generations.jsonl")], "gsm8k", "d1")
    assert rescored["n"] == 3 and rescored["accuracy"] == scores["accuracy"]
    assert all(r["completion"] for r in rows)  # the whole window, special tokens kept
