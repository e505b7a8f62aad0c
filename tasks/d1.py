"""d1's evaluation protocol (github.com/dllm-reasoning/d1, commit 837888f): prompts, answer parsing, scoring.

Everyone comparing with d1 / wd1 / SPG tables reports this protocol, so it exists beside our strict default
(tasks/<task>.py). Every piece names the place in d1 it follows; the parsing is written here from d1's behaviour.

Prompts (d1 `eval/{gsm8k,math500,countdown,sudoku}.py`, `GSM8KDataset.create_prompt`): one user turn
`SYSTEM_PROMPT + "\\n\\n" + question` in the tokenizer's chat template with the generation prompt, and the assistant
turn opened with "<reasoning>" (`add_reasoning=True`). Questions: GSM8K's `question`, MATH-500's `problem`,
Countdown `"Numbers: [a, b, c]\\nTarget: t"` (`CTDDataset.__getitem__`), Sudoku
`"Solve the following Sudoku puzzle: <16 digits>\\n"` (`SudokuDataset.__getitem__`).
Generation (d1 `eval/eval.py`): temperature 0, low-confidence remasking, block 32, steps = gen_length / 2, and the
text scored is the whole gen_length window decoded with special tokens kept (`batch_decode(...,
skip_special_tokens=False)`), so `<|eot_id|>`/`<|endoftext|>` can end an answer.
Scoring (d1 `eval/parse_and_get_acc.py`, helpers in `eval/parser_helper.py`): each `score_*` returns
(correct, total) for one generation: (0 or 1, 1) for GSM8K, MATH-500 and Countdown; (correct cells, empty cells) for
Sudoku, whose accuracy is Σ correct cells / Σ empty cells over the split (`parse_sudoku_answers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .safe_arith import ArithLimits, evaluate_arithmetic

ASSISTANT_PREFIX = "<reasoning>"
"""Opens the assistant turn after the chat template (d1 `create_prompt`, `add_reasoning=True`)."""

_FORMAT = "<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>"
_MATH_INTRO = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final "
               "answer in a \\boxed{}.")
SYSTEM_PROMPTS = {
    # d1 eval/gsm8k.py GSM_SYSTEM_PROMPT (note the space before the first newline)
    "gsm8k": f"{_MATH_INTRO} \nRespond in the following format:\n{_FORMAT}",
    # d1 eval/math500.py MATH500_SYSTEM_PROMPT (it ends with a stray '" ' and a newline, kept as d1 has it)
    "math500": f"{_MATH_INTRO}\nRespond in the following format:\n{_FORMAT}\" \n",
    # d1 eval/countdown.py CTD_SYSTEM_PROMPT (no newline before "Respond")
    "countdown": ("Using only the provided numbers, create an arithmetic expression that evaluates to exactly the "
                  "provided target number. You may use the operations +, -, *, and / as needed, but each number "
                  "must be used exactly once. Think step-by-step. After reasoning, provide only your final "
                  "expression inside \\boxed{} tags without including an equals sign or the target number. For "
                  f"example: \\boxed{{a + b * c}}Respond in the following format:\n{_FORMAT}"),
    # d1 eval/sudoku.py SUDOKU_SYSTEM_PROMPT
    "sudoku": ("\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string "
               "reading left-to-right, top-to-bottom, where '0' represents empty cells.\n\nRules:\n"
               "- Fill empty cells with digits 1-4\n- Each row must contain digits 1-4 exactly once\n"
               "- Each column must contain digits 1-4 exactly once\n- Each 2x2 box must contain digits 1-4 exactly "
               "once\n\nImportant: Your solution must be a COMPLETE 16-character string with only the digits 1-4, "
               "representing your final solved grid.\n\nRespond in this exact format:\n<reasoning>\nYour "
               "step-by-step solving process\n</reasoning>\n<answer>\n[16-character solution string with no spaces "
               "or separators]\n</answer>\n"),
}
TASKS = tuple(SYSTEM_PROMPTS)
"""Tasks d1 evaluates."""


def check_task(task: str) -> None:
    if task not in SYSTEM_PROMPTS:
        raise ValueError(f"--protocol d1 covers {', '.join(TASKS)}; task {task!r} has no d1 protocol (use the "
                         "default --protocol strict).")


def question(task: str, row: dict[str, Any]) -> str:
    """d1's question text for one of our rows (see the module docstring for where each comes from)."""
    check_task(task)
    if task == "gsm8k":
        return row["question"]
    if task == "math500":
        return row["problem"]
    if task == "countdown":
        return f"Numbers: {[int(n) for n in row['numbers']]}\nTarget: {int(row['target'])}"
    return f"Solve the following Sudoku puzzle: {row['puzzle']}\n"


def user_prompt(task: str, row: dict[str, Any]) -> str:
    """The user turn d1 sends: system prompt, a blank line, the question (d1 `create_prompt` with 0 few-shot)."""
    check_task(task)
    return SYSTEM_PROMPTS[task] + "\n\n" + question(task, row)


# ---------------------------------------------------------------------------------------------------------------------
# Ground truth in d1's JSON layout <-> our row columns


def gold(task: str, row: dict[str, Any]) -> Any:
    """d1's `ground_truth` from our row: GSM8K float, MATH-500 string, Countdown [numbers, target], Sudoku string."""
    check_task(task)
    if task == "gsm8k":  # None where d1's '#### N' extraction found no number (it then never matches)
        return None if row["answer"] is None else float(str(row["answer"]).replace(",", ""))
    if task == "math500":
        return str(row["answer"])
    if task == "countdown":
        return [[int(n) for n in row["numbers"]], int(row["target"])]
    return str(row["solution"])


def row_from_d1(task: str, item: dict[str, Any]) -> dict[str, Any]:
    """Our row columns from one entry of d1's `*_generations.json` (`question`, `ground_truth`)."""
    check_task(task)
    q, gt = item.get("question", ""), item.get("ground_truth")
    if task == "gsm8k":
        if gt is None:  # d1's extraction found no number (e.g. a negative answer): scores 0 under both protocols
            return {"question": q, "answer": None}
        value = float(gt)
        return {"question": q, "answer": str(int(value)) if value.is_integer() else str(value)}
    if task == "math500":
        return {"problem": q, "answer": str(gt)}
    if task == "countdown":
        if not (isinstance(gt, list) and len(gt) == 2):
            raise ValueError(f"countdown ground_truth {gt!r}: expected [numbers, target].")
        return {"numbers": [int(n) for n in gt[0]], "target": int(gt[1])}
    return {"puzzle": sudoku_puzzle(q), "solution": str(gt)}


def sudoku_puzzle(question_text: str) -> str:
    """The puzzle in a d1 Sudoku question: its first 16 characters if all digits, else the 16 digits after
    'Sudoku puzzle: ' (d1 `parse_sudoku_answers`)."""
    if len(question_text) >= 16 and question_text[:16].isdigit():
        return question_text[:16]
    match = re.search(r"Sudoku puzzle: (\d{16})", question_text)
    if match is None:
        raise ValueError(f"no 16-digit puzzle in the Sudoku question {question_text[:60]!r}.")
    return match.group(1)


# ---------------------------------------------------------------------------------------------------------------------
# Boxed answers (d1 eval/parser_helper.py `last_boxed_only_string` + `remove_boxed`)

_UNCLOSED = None


def boxed_content(text: str) -> str | None:
    """What d1 reads as the boxed answer: the content of the last `\\boxed{...}` (balanced braces); text after the
    last `\\boxed ` up to a `$` when that spelling occurs anywhere; the last `\\fbox{...}` kept whole; the whole text
    when there is no box at all; None when the last box never closes (d1's parsers then fall back to <answer>)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return text
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                box = text[start:i + 1]
                inner = box.startswith("\\boxed{") and box.endswith("}")
                return box[len("\\boxed{"):-1] if inner else box
    return _UNCLOSED


def _answer_tag(text: str) -> str | None:
    match = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return match.group(1).strip() if match else None


# ---------------------------------------------------------------------------------------------------------------------
# GSM8K (d1 `parse_gsm_answers`)

_NUMBER = r"-?\d+\.?\d*"


def _as_float(text: str, pick: int) -> float | None:
    try:
        return float(text)
    except ValueError:
        numbers = re.findall(_NUMBER, text)
        return float(numbers[pick]) if numbers else None


def parse_gsm8k(text: str) -> float | None:
    """The first `\\boxed{...}` (shortest match) that is a number or contains one (its first number); else the
    `<answer>` span as a number or its last number; else None."""
    for content in re.findall(r"\\boxed{(.*?)}", text):
        content = content.strip()
        if content and not re.fullmatch(r"\.+", content):
            value = _as_float(content, 0)
            if value is not None:
                return value
    span = _answer_tag(text)
    return _as_float(span, -1) if span else None


def score_gsm8k(text: str, gold_value: float) -> tuple[float, float]:
    parsed = parse_gsm8k(text)
    return (1.0 if parsed is not None and parsed == gold_value else 0.0), 1.0


# ---------------------------------------------------------------------------------------------------------------------
# MATH-500 (d1 `parse_math_answers`, `is_equiv` / `strip_string` of the MATH benchmark's helper)


class _Unparsable(Exception):
    """d1's normaliser raised: its is_equiv then compares the raw strings."""


def _fix_sqrt(s: str) -> str:
    head, *rest = s.split("\\sqrt")
    out = head
    for piece in rest:
        if not piece:
            raise _Unparsable
        out += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return out


def _fix_fracs(s: str) -> str:
    head, *rest = s.split("\\frac")
    out = head
    for piece in rest:
        out += "\\frac"
        if not piece:
            raise _Unparsable
        if piece[0] == "{":
            out += piece
            continue
        if len(piece) < 2:
            return s
        a, b, tail = piece[0], piece[1], piece[2:]
        out += "{" + a + "}{" + b + "}" + tail if b != "{" else "{" + a + "}" + b + tail
    return out


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise _Unparsable from None
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if s == f"{a}/{b}" else s


def normalize_math(s: str) -> str:
    """The MATH benchmark's string normalisation as d1 applies it; raises _Unparsable where d1's raises."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:  # units on the right
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise _Unparsable
        s = parts[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3" -> "3"
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def math_equiv(a: str, b: str) -> bool:
    """d1's is_equiv on strings: equal after normalisation; the raw strings when normalising fails."""
    try:
        return normalize_math(a) == normalize_math(b)
    except (_Unparsable, IndexError):
        return a == b


def parse_math(text: str) -> str | None:
    """The boxed answer (the whole text when unboxed); the <answer> span when that is empty or the box is open."""
    parsed = boxed_content(text)
    if not parsed:
        span = _answer_tag(text)
        if span is not None:
            parsed = span
    return parsed


def score_math500(text: str, gold_value: str) -> tuple[float, float]:
    parsed = parse_math(text)
    return (1.0 if parsed is not None and math_equiv(parsed, gold_value) else 0.0), 1.0


# ---------------------------------------------------------------------------------------------------------------------
# Countdown (d1 `parse_countdown_answers`)

_COUNTDOWN_LIMITS = ArithLimits(max_chars=400, max_nodes=128, max_literal=10**9)


def parse_countdown(text: str) -> str:
    """The boxed expression (the whole text when unboxed; the <answer> span, else the whole text, when the box is
    open), LaTeX operators as Python's, and only the left side of an `expr = number`."""
    equation = boxed_content(text)
    if equation is None:
        span = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        equation = span.group(1).strip() if span else text
    equation = equation.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    match = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", equation)
    return match.group(1).strip() if match else equation


def score_countdown(text: str, gold_value: list) -> tuple[float, float]:
    """Correct when the integers in the expression are exactly the given numbers (as a multiset) and it evaluates to
    the target within 1e-5. d1 evaluates with Python's eval on [digits + - * / ( ) . whitespace]; here an ast-based
    evaluator with + - * / on the same characters does (no eval of model text), so `**` and `//` score 0."""
    numbers, target = gold_value
    equation = parse_countdown(text)
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(numbers):
        return 0.0, 1.0
    if not re.fullmatch(r"[\d+\-*/().\s]+", equation) or "**" in equation or "//" in equation:
        return 0.0, 1.0
    result = evaluate_arithmetic(equation.strip(), _COUNTDOWN_LIMITS)
    return (1.0 if result is not None and abs(float(result.value) - target) < 1e-5 else 0.0), 1.0


# ---------------------------------------------------------------------------------------------------------------------
# Sudoku (d1 `parse_sudoku_answers`): cell accuracy over the empty cells, answers padded/truncated to 16

_END = r"(?:<\|eot_id\|>|<\|endoftext\|>"
_SUDOKU_PATTERNS = (
    r"<answer>.*?```\s*([\d\s]+)```",  # a fenced block inside the answer
    r"<answer>(.*?)" + _END + r"|</answer>)",  # the answer span up to its end or a special token
    r"</answer>\s*(.*?)" + _END + r"|$)",  # text after a closed answer
    r".*?(\d{16})\s*</answer>",  # 16 digits right before </answer>
    r"\b(\d{16})\b",  # any 16-digit run
)


def parse_sudoku(text: str) -> str:
    """The first pattern above that captures non-blank text, whitespace removed ("" when none does)."""
    for pattern in _SUDOKU_PATTERNS:
        match = re.search(pattern, text, re.DOTALL)
        if match and match.group(1).strip():
            return re.sub(r"\s", "", match.group(1).strip())
    return ""


def score_sudoku(text: str, gold_value: str, puzzle: str) -> tuple[float, float]:
    """(cells of the puzzle's blanks the answer gets right, number of blanks); the answer is right-padded with '0'
    or truncated to 16 characters first; no answer scores 0 cells."""
    empty = [i for i, c in enumerate(puzzle) if c == "0"]
    answer = parse_sudoku(text)
    if not answer:
        return 0.0, float(len(empty))
    answer = (answer + "0" * 16)[:16]
    return float(sum(answer[i] == gold_value[i] for i in empty)), float(len(empty))


# ---------------------------------------------------------------------------------------------------------------------


def score(task: str, text: str, row: dict[str, Any]) -> tuple[float, float]:
    """(correct, total) of one generation under d1's protocol; `row` holds our columns for the task."""
    check_task(task)
    if task == "sudoku":
        return score_sudoku(text, str(row["solution"]), str(row["puzzle"]))
    scorers: dict[str, Callable[[str, Any], tuple[float, float]]] = {
        "gsm8k": score_gsm8k, "math500": score_math500, "countdown": score_countdown}
    return scorers[task](text, gold(task, row))
