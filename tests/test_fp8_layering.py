"""dllm_ais.fp8's modules import downward only (no import cycle, lazy function-level imports included), each name has
one path (fp8/linear.py no longer answers for the names that moved out of it), and importing the fp8 modules in any
order imports no Triton kernel."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

FP8 = Path(__file__).resolve().parent.parent / "dllm_ais" / "fp8"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str]) -> set[str]:
    """fp8 modules that `path` imports anywhere (module level or inside functions), except under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 or base.startswith("dllm_ais.fp8"):
                sub = base.removeprefix("dllm_ais.fp8").lstrip(".") if node.level == 0 else base
                if sub:
                    found.add(sub.split(".")[0])
                else:  # `from . import a, b`
                    found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dllm_ais.fp8."):
                    found.add(alias.name.split(".")[2])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found & modules


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in FP8.glob("*.py")} - {"__init__"}
    return {m: _imports(FP8 / f"{m}.py", modules) - {m} for m in modules}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def dfs(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [node, nxt] if nxt in stack else [node, nxt]
            if nxt not in state and (found := dfs(nxt, stack + [node])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := dfs(node, [])):
            return found
    return None


def test_fp8_modules_import_downward_only():
    graph = _graph()
    assert {"backends", "linear", "walker", "quantize", "sync", "fused_sync", "ops"} <= set(graph)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"
    # the layers DESIGN names: the kernels' torch ops never reach up to the layer or the model code
    assert not graph["ops"] & {"backends", "linear", "walker", "quantize", "sync", "fused_sync"}
    assert not graph["walker"]  # model walking knows no number format


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("name, home", [("quantize_model", "quantize"), ("sync_weights", "sync"),
                                        ("quantized_copy", "walker"), ("linear_layers", "walker"),
                                        ("torchao_blockwise_gemm", "ops"), ("_AUTO_CHOICES", "backends")])
def test_moved_names_live_at_one_path_only(name, home):
    """The lazy re-exports from fp8/linear.py are gone: a name is imported from the module that defines it."""
    import importlib

    from dllm_ais.fp8 import linear

    assert getattr(importlib.import_module(f"dllm_ais.fp8.{home}"), name) is not None
    assert not hasattr(linear, "__getattr__")
    with pytest.raises(AttributeError):
        getattr(linear, name)


@pytest.mark.parametrize("first", ["fp8.linear", "models.llada.fused_fp8", "fp8.sync"])
def test_import_order_does_not_matter(first):
    """A fresh interpreter that imports one fp8 module first, then the others: no import error (a cycle shows up as a
    partially initialised module), and our Triton kernels not imported."""
    code = (f"import sys, dllm_ais.{first}; from dllm_ais.fp8.quantize import quantize_model; "
            "from dllm_ais.fp8.sync import sync_weights; from dllm_ais.fp8.walker import quantized_copy; "
            "from dllm_ais.fp8.backends import BACKENDS; print('dllm_ais.fp8.kernels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
