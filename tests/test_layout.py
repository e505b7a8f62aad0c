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
        "dllm_ais.progress", "dllm_ais.families",
        "dllm_ais.presets"}  # the shared types, configs and utilities every layer may use
FAMILY_ROLES = {"family": "base", "model": "models", "checkpoint": "models", "tiny": "models", "rollout": "models",
                "fused_fp8": "fp8", "selection": "likelihood", "trajectory": "likelihood", "likelihood": "likelihood",
                "sampler": "samplers", "backend": "train", "shape": "plan",
                "ebpo": "likelihood"}  # a family's own policy likelihood, named after its method (SDAR's EBPO)
"""A family folder models/<family>/ (dllm_ais/families.py): each module's layer is the one its file name says."""


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


def _family_folders() -> set[str]:
    return {p.name for p in (REPO / "models").iterdir() if (p / "family.py").is_file()}


def _layer(name: str) -> str:
    if name in BASE:
        return "base"
    if name in {"dllm_ais.cli", "dllm_ais.sample", "dllm_ais.__main__"}:
        return "entry"
    parts = name.split(".")
    if parts[1] == "models" and len(parts) == 4 and parts[2] in _family_folders():
        return FAMILY_ROLES[parts[3]]
    return parts[1]


def test_every_module_of_a_family_folder_has_a_known_layer():
    """A new file in models/<family>/ must say its layer by its name (FAMILY_ROLES), so the layer table holds for it."""
    families = _family_folders()
    assert {"llada", "dream", "qwen"} <= families
    parts = [name.split(".") for name in MODULES]
    found = [".".join(p) for p in parts if len(p) == 4 and p[1] == "models" and p[2] in families]
    unknown = sorted(n for n in found if n.split(".")[3] not in FAMILY_ROLES)
    assert not unknown, f"name these files by their role ({', '.join(FAMILY_ROLES)}): {unknown}"


def test_the_layer_of_a_family_module_follows_its_role():
    assert _layer("dllm_ais.models.dream.sampler") == "samplers"
    assert _layer("dllm_ais.models.llada.backend") == "train"
    assert _layer("dllm_ais.models.llada.family") == "base"
    assert _layer("dllm_ais.models.llada") == "models"
    assert _layer("dllm_ais.models.kv_cache") == "models"


@pytest.mark.parametrize("layer, may_import", [
    ("base", {"base", "rl"}),  # config -> rl/config.py only; a family's family.py is base: light, no torch
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


def _family_name_branches(path: Path, names: set[str], root: Path = REPO) -> list[str]:
    """`x.family == "dream"`, `family in ("llada", "dream")`, `"qwen" != cfg.family` ...: comparisons of something
    called *family with a family's name, in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(ast.unparse(s).split(".")[-1].endswith("family") for s in sides)
        constants = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)}
        if named and constants & names:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_branch_on_a_family_name_outside_the_registry():
    """Job, plan, sample, eval and checkpoint code ask dllm_ais/families.py's records instead of comparing names."""
    import dllm_ais.families as families

    names = set(families.FAMILIES)
    files = [p for d in ("dllm_ais", "models", "samplers", "tasks", "scripts") for p in (REPO / d).rglob("*.py")]
    assert not [b for p in files for b in _family_name_branches(p, names)]


def test_the_family_branch_check_finds_a_planted_one(tmp_path):
    path = tmp_path / "x.py"
    path.write_text('if preset.model.family == "dream":\n    pass\nok = mc.family in ("llada", "qwen")\n'
                    'fine = spec.kind == "dream"\n')
    found = _family_name_branches(path, {"llada", "dream", "qwen"}, root=tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == ["preset.model.family == 'dream'", "mc.family in ('llada', 'qwen')"]


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
