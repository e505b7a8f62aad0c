"""README.md and docs/ stay true to the repository (issue 29): every relative link resolves, to a file and, for a
Markdown target, to one of its headings (GitHub's anchor rules); every `dllm-ais <command> --flag` they show exists in
that command's parser (read from dllm_ais.cli, no process spawned), every other `--flag` in their code exists in some
parser of the package or in the script it is passed to; the README opens with the two commands CI runs, stays under
200 lines in the agreed order, and links the docs map, which links every page; the accelerate configs load."""

from __future__ import annotations

import argparse
import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
VENV = "python3 -m venv .venv && . .venv/bin/activate"
INSTALL_RUN = "pip install torch==2.13.0 -e . && dllm-ais train"
INSTALL_TEST = 'pip install torch==2.13.0 -e ".[dev]" && pytest -n 2'
README_SECTIONS = ["Quickstart on a CPU", "Quickstart on GPUs: LLaDA-8B-Instruct", "What is here", "What was measured",
                   "Where to read more"]  # after the pitch and the two commands (issue 29's order)

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
# `dllm-ais CMD`, `python -m dllm_ais CMD`, `accelerate launch ... -m dllm_ais.cli CMD`: what follows is CMD's line
INVOCATION = re.compile(r"(?:(?<![\w./-])dllm-ais|-m dllm_ais(?:\.cli)?)(?=\s|$)(.*)", re.S)
SCRIPT = re.compile(r"(?<![\w/.-])(scripts/[\w.-]+\.(?:py|sh))\b(.*)", re.S)
# tools whose own flags the pages show (the package's flags after `-m dllm_ais.cli` are still checked)
EXTERNAL = ("accelerate", "pip", "huggingface-cli", "pytest", "python -m pytest", "ruff", "git", "bash .ci/run",
            "python3 -m venv")
EXTERNAL_FLAGS = {"--cpu"}  # accelerate launch's, named in prose on its own


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """The text without fenced code blocks (a link or heading inside one is not one)."""
    return FENCE.sub("", text)


def _code_lines(text: str) -> list[str]:
    """Every line of every fenced block, continuation lines (trailing backslash) joined."""
    lines = []
    for block in FENCE.finditer(text):
        lines.extend(block.group(2).replace("\\\n", " ").splitlines())
    return lines


def _inline_code(text: str) -> list[str]:
    return [m.group(2) for m in INLINE_CODE.finditer(_prose(text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text (no markup) lower-cased, every character but letters, marks,
    digits, '_', '-' and spaces dropped, each space made a '-'."""
    text = LINK.sub(r"\1", heading)
    text = INLINE_CODE.sub(r"\2", text)
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text).strip().lower()
    keep = "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LMN")
    return keep.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", _prose(_text(path)), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def test_slug_follows_github():
    assert slug("The data flow of one step (each arrow names the file that owns it)") == \
        "the-data-flow-of-one-step-each-arrow-names-the-file-that-owns-it"
    assert slug("The sampler is the policy: the trajectory likelihood (`--policy-logprob trajectory`)") == \
        "the-sampler-is-the-policy-the-trajectory-likelihood---policy-logprob-trajectory"
    assert slug("5a. Calibrating τ by outcomes") == "5a-calibrating-τ-by-outcomes"
    assert slug("**Bold** and [a link](x.md) × 2") == "bold-and-a-link--2"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for text, target in LINK.findall(INLINE_CODE.sub("code", _prose(_text(page)))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(REPO) or not dest.exists():
            broken.append(f"[{text}]({target}): no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"[{text}]({target}): no heading of {dest.relative_to(REPO)} has the anchor #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}:\n" + "\n".join(broken)


@cache
def parsers() -> dict[str, set[str]]:
    """Option strings per `dllm-ais` command (top level under ""), read from the parsers the CLI builds."""
    from dllm_ais import cli
    from dllm_ais.analysis import variance_cli

    top = cli.build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    out = {"": {s for a in top._actions for s in a.option_strings}}
    for name, p in sub.choices.items():
        out[name] = {s for a in p._actions for s in a.option_strings}
    out["variance"] = {s for a in variance_cli.build_parser()._actions for s in a.option_strings}
    return out


@cache
def package_flags() -> set[str]:
    """Every flag any parser of the repository defines (dllm-ais, `python -m dllm_ais.…` modules, scripts)."""
    found = set().union(*parsers().values())
    for path in [*(REPO / "dllm_ais").rglob("*.py"), *(REPO / "scripts").glob("*.py")]:
        found |= set(re.findall(r"""["'](--[a-z][a-z0-9_-]*)["']""", _text(path)))
    return found


def _mentions(page: Path):
    """(where, snippet) for each inline code span and code line of a page."""
    text = _text(page)
    for span in _inline_code(text):
        yield "inline", span
    for line in _code_lines(text):
        yield "block", line.split(" # ")[0]


def _flag_problems(page: Path) -> list[str]:
    problems = []
    for where, snippet in _mentions(page):
        snippet = snippet.strip()
        invocation = INVOCATION.search(snippet)
        if invocation:
            rest = re.split(r"\s(?:&&|;|\|\|)\s|\s\|\s|`", invocation.group(1))[0].strip()
            command = rest.split()[0] if rest and not rest.startswith("-") else ""
            known = parsers().get(command)
            if known is None:  # prose such as "`dllm-ais <command>`" names no command
                if re.match(r"[a-z]", command or "-"):
                    problems.append(f"`{snippet}`: no dllm-ais command {command!r}")
                continue
            problems += [f"`{snippet}`: dllm-ais {command or '(top level)'} has no {flag}".replace("  ", " ")
                         for flag in FLAG.findall(rest) if flag not in known]
            continue
        script = SCRIPT.search(snippet)
        if script:
            name = script.group(1)
            source = _text(REPO / name)
            if name.endswith(".sh"):  # a shell wrapper passes its flags on to the scripts it runs
                source += "".join(_text(REPO / py) for py in set(re.findall(r"scripts/\w+\.py", source)))
            problems += [f"`{snippet}`: {name} has no {flag}" for flag in FLAG.findall(script.group(2))
                         if flag not in source]
            continue
        if snippet.startswith(EXTERNAL):
            continue
        problems += [f"`{snippet}` ({where}): no parser of the package has {flag}" for flag in FLAG.findall(snippet)
                     if flag not in package_flags() | EXTERNAL_FLAGS]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_shown_exists(page: Path):
    problems = _flag_problems(page)
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_flag_check_catches_what_it_should(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `dllm-ais train --no-such-flag` or `dllm-ais eval --threads 2` (train has it, eval not),\n"
                    "`dllm-ais frobnicate --x`, `--also-missing 3`, `dllm-ais --version`, `python -m dllm_ais plan "
                    "--gpus 8`.\n```bash\naccelerate launch --config_file c.yaml -m dllm_ais.cli train \\\n"
                    "    --preset tiny-cpu --bogus\npython scripts/study_corrections.py --plan p.toml --nope\n```\n")
    problems = "\n".join(_flag_problems(page))
    for expected in ("train has no --no-such-flag", "eval has no --threads", "no dllm-ais command 'frobnicate'",
                     "no parser of the package has --also-missing", "train has no --bogus",
                     "study_corrections.py has no --nope"):
        assert expected in problems, problems
    for fine in ("--version", "--gpus", "--config_file", "--preset", "--plan"):
        assert f"no {fine}" not in problems and f"has {fine}" not in problems, problems


def test_readme_opens_with_the_two_commands_ci_runs():
    code = [line for block in FENCE.finditer(_text(README)) for line in block.group(2).splitlines() if line.strip()]
    assert code[:3] == [VENV, INSTALL_RUN, INSTALL_TEST]  # the venv first, where a newcomer copies from
    # .ci/run runs the first README line that matches this pattern: it must be the test command
    ci = _text(REPO / ".ci" / "run")
    pattern = re.search(r"grep -m1 -E '([^']+)' README\.md", ci).group(1)
    first = next(line for line in _text(README).splitlines() if re.search(pattern, line))
    assert first == INSTALL_TEST


PLAN_FIGURE = re.compile(r"`(dllm-ais plan [^`]+)` predicts (?:a peak of )?(\d+(?:\.\d+)?) GiB")
"""A memory figure quoted beside the plan command that prints it: "`dllm-ais plan ...` predicts 43.6 GiB"."""


def test_every_plan_figure_is_what_its_command_prints(capsys):
    """README and docs quote `dllm-ais plan` peaks: each is what the command shown beside it prints (the README once
    quoted the one-GPU figure next to the 8-GPU command)."""
    import shlex

    from dllm_ais.cli import main

    quoted = [(page.name, m.group(1), m.group(2)) for page in PAGES
              for m in PLAN_FIGURE.finditer(" ".join(_prose(_text(page)).split()))]
    assert len(quoted) >= 3 and any(page == "README.md" for page, _, _ in quoted)
    printed = {}
    for command in dict.fromkeys(c for _, c, _ in quoted):  # each command run once
        assert main(shlex.split(command)[1:]) == 0
        peak = re.search(r"\bpeak (\d+(?:\.\d+)?) GiB", capsys.readouterr().out)
        printed[command] = peak and peak.group(1)
    wrong = [f"{page}: `{c}` prints {printed[c]} GiB, not {figure}" for page, c, figure in quoted
             if printed[c] != figure]
    assert not wrong


def test_the_plan_figure_pattern_finds_what_it_should():
    text = "so `dllm-ais plan --gpus 8` predicts 43.6 GiB peak; `dllm-ais plan --gpu a100` predicts a peak of 42 GiB"
    assert [m.groups() for m in PLAN_FIGURE.finditer(text)] == [("dllm-ais plan --gpus 8", "43.6"),
                                                               ("dllm-ais plan --gpu a100", "42")]


def test_every_preset_is_listed_in_the_commands_page():
    """docs/commands.md's Presets section names every preset (Dream's were missing)."""
    from dllm_ais.presets import PRESETS

    section = _text(REPO / "docs" / "commands.md").split("## Presets", 1)[1].split("\n## ", 1)[0]
    assert [name for name in PRESETS if f"`{name}`" not in section] == []


def test_readme_is_short_and_in_the_agreed_order():
    text = _text(README)
    assert len(text.splitlines()) <= 200
    assert re.findall(r"^## (.+)$", _prose(text), re.M) == README_SECTIONS
    pitch = text.split("```", 1)[0]
    assert pitch.startswith("# dllm-ais") and len(pitch.split()) > 50  # a paragraph before the commands


def test_the_docs_map_links_every_page():
    assert "docs/index.md" in _text(README)
    index = _text(REPO / "docs" / "index.md")
    linked = {Path(target.partition("#")[0]).name for _, target in LINK.findall(index)}
    assert not {p.name for p in DOCS if p.name != "index.md"} - linked


@pytest.mark.parametrize("name", ["ddp", "fsdp2"])
def test_accelerate_configs_load(name: str):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(REPO / "docs" / "accelerate" / f"{name}.yaml"))
    assert config.num_processes == 8 and config.mixed_precision == "bf16"
    assert str(config.distributed_type).endswith({"ddp": "MULTI_GPU", "fsdp2": "FSDP"}[name])
    if name == "fsdp2":
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LLaDABlock"
