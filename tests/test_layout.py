"""The package's layout holds: no import cycle among its modules (lazy function-level imports included), layers import
downward only, no source file over 600 lines, at most 12 top-level modules in dllm_ais/, and one path per module: the
0.1 paths (grpo, trainer, ... directly under dllm_ais) neither import nor appear anywhere in the repository."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# where each importable package's files live (pyproject's package-dir: samplers/, models/, tasks/ sit at the root)
SOURCES = {"dllm_ais": REPO / "dllm_ais", "dllm_ais.samplers": REPO / "samplers", "dllm_ais.models": REPO / "models",
           "dllm_ais.tasks": REPO / "tasks"}
BASE = {"dllm_ais", "dllm_ais.types", "dllm_ais.config", "dllm_ais.metrics", "dllm_ais.atomic",
        "dllm_ais.progress"}  # the shared types, configs and utilities every layer may use


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in SOURCES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _owner(dotted: str) -> str | None:
    """The module a dotted import name lands in (a name from a module resolves to that module)."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _imports(name: str, type_checking: bool = False) -> set[str]:
    """Package modules that module `name` imports anywhere (also inside functions), and under TYPE_CHECKING only
    when `type_checking`."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if base.startswith("dllm_ais"):
                for alias in node.names:
                    found.add(_owner(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else _owner(base))
        elif isinstance(node, ast.Import):
            found.update(_owner(a.name) for a in node.names if a.name.startswith("dllm_ais"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {name, None}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_relative_absolute_and_lazy_imports():
    assert "dllm_ais.samplers.ar_common" in GRAPH["dllm_ais.samplers.ar_static"]  # `from .ar_common import`
    assert "dllm_ais.samplers.ar_static" in GRAPH["dllm_ais.samplers.autoregressive"]  # inside a function
    assert "dllm_ais.rl.grpo" in GRAPH["dllm_ais.train.trainer"]
    assert "dllm_ais.train.fsdp_setup" in GRAPH["dllm_ais.train.trainer"]  # `from dllm_ais.train import fsdp_setup`


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_no_import_cycle_even_through_type_hints():
    """Type-only imports count too (fp8/backends.py typed its layers as linear.FP8Linear under TYPE_CHECKING while
    linear.py imports backends: a cycle for readers and type checkers; backends now has its own FP8Layer Protocol)."""
    typed = {name: _imports(name, type_checking=True) for name in MODULES}
    assert "dllm_ais.fp8.backends" in typed["dllm_ais.fp8.linear"]
    assert _cycles(typed) == []


def _layer(name: str) -> str:
    if name in BASE:
        return "base"
    if name in {"dllm_ais.cli", "dllm_ais.sample", "dllm_ais.__main__"}:
        return "entry"
    return name.split(".")[1]


@pytest.mark.parametrize("layer, may_import", [
    ("rl", {"base", "rl"}),  # the math: tensors in, tensors out
    ("likelihood", {"base", "likelihood", "models"}),
    ("samplers", {"base", "samplers", "models", "likelihood", "fp8"}),
    ("fp8", {"base", "fp8", "models"}),
    ("fp4", {"base", "fp4", "fp8", "models"}),
    ("models", {"base", "models", "fp8"}),
    ("tasks", {"base", "tasks"}),
    ("train", {"base", "train", "rl", "likelihood", "samplers", "fp8", "fp4", "models", "tasks"}),
    ("plan", {"base", "plan", "train", "rl", "likelihood", "samplers", "fp8", "fp4", "models", "tasks"}),
    ("commands", {"base", "commands", "analysis", "plan", "train", "rl", "likelihood", "samplers", "fp8", "fp4",
                  "models", "tasks"}),  # the subcommands' flags and runs: everything but the entry points
])
def test_layers_import_downward_only(layer, may_import):
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if _layer(m) == layer for d in deps
                 if _layer(d) not in may_import)
    assert not bad, f"{layer}/ reaches up: {bad}"


def test_nothing_below_the_entry_points_imports_them():
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps
                 if _layer(d) == "entry" and m not in {"dllm_ais.cli", "dllm_ais.__main__"})
    assert not bad


def test_no_source_file_over_600_lines():
    dirs = ("dllm_ais", "samplers", "models", "tasks", "scripts", "tests")
    files = [p for d in dirs for p in (REPO / d).rglob("*.py")]
    assert len(files) > 100
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > 600}
    assert not long


def test_at_most_twelve_top_level_modules():
    top = sorted(p.name for p in (REPO / "dllm_ais").glob("*.py"))
    assert len(top) <= 12, top
    assert {"cli.py", "config.py", "types.py"} <= set(top)


# the 0.1 module names directly under dllm_ais (before it was grouped into rl/, train/, analysis/), and where they live
OLD = {"advantages": "rl.advantages", "correction": "rl.correction", "error_tokens": "rl.error_tokens",
       "grpo": "rl.grpo", "mismatch_stats": "rl.mismatch_stats", "rl_config": "rl.config", "backend": "train.backend",
       "distributed": "train.distributed", "fsdp_checkpoint": "train.fsdp_checkpoint",
       "fsdp_setup": "train.fsdp_setup", "fsdp_sync": "train.fsdp_sync", "master_weights": "train.master_weights",
       "rewards": "train.rewards", "run_dir": "train.run_dir", "sft": "train.sft", "train_flags": "train.flags",
       "train_job": "train.job", "trainer": "train.trainer", "bench_env": "analysis.bench_env",
       "evaluate": "analysis.evaluate", "plot": "analysis.plot", "study": "analysis.study",
       "study_plan": "analysis.study_plan", "study_stats": "analysis.study_stats",
       "variance_cli": "analysis.variance_cli"}


def test_the_old_paths_are_gone_and_the_new_ones_exist():
    assert not (REPO / "dllm_ais" / "_moved.py").exists()
    assert all(f"dllm_ais.{new}" in MODULES for new in OLD.values())
    assert not {f"dllm_ais.{old}" for old in OLD} & set(MODULES)
    code = (f"import importlib, dllm_ais\nfor old in {sorted(OLD)!r}:\n    try:\n"
            "        importlib.import_module('dllm_ais.' + old)\n    except ModuleNotFoundError:\n        continue\n"
            "    print(old)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == [], out.stdout + out.stderr[-3000:]


def test_the_repository_uses_the_new_paths_only():
    old = re.compile(rf"\bdllm_ais[./]({'|'.join(OLD)})\b(?!/)")
    files = [p for d in ("dllm_ais", "samplers", "models", "tasks", "scripts", "tests", "docs", "benchmarks") for p in
             (REPO / d).rglob("*") if p.suffix in {".py", ".md", ".sh"}] + [REPO / "README.md"]
    hits = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in files if p != Path(__file__).resolve()
            for m in old.finditer(p.read_text())]
    assert not hits
    assert "_moved" not in (REPO / "dllm_ais" / "__init__.py").read_text()


def test_an_unknown_name_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        __import__("dllm_ais.no_such_module")


def test_every_package_directory_is_installed():
    """A non-editable install ships only pyproject's `packages`: every directory with an __init__.py under the package
    roots (package-dir mapping included) must be listed (dllm_ais.plan was not: `pip install .` lost the plan)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    found = set()
    for name, root in setup["package-dir"].items():
        for init in (REPO / root).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / root).parts
            found.add(".".join((name, *rel)))
    assert found - listed == set(), f"add to pyproject's packages: {sorted(found - listed)}"
