"""dllm_ais.fp8's modules import downward only (no import cycle, lazy function-level imports included), and the
names that moved out of fp8/linear.py stay importable from it without importing anything at module import time."""

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
    assert {"backends", "linear", "walker", "quantize", "sync", "fused_llada", "ops"} <= set(graph)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"
    # the layers DESIGN names: the kernels' torch ops never reach up to the layer or the model code
    assert not graph["ops"] & {"backends", "linear", "walker", "quantize", "sync", "fused_llada"}
    assert not graph["walker"]  # model walking knows no number format


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("name", ["quantize_model", "sync_weights", "BACKENDS", "check_backend", "effective_weight",
                                  "quantizable_layers", "quantized_copy", "canonical_name", "_linear_layers",
                                  "_outer_dim_major", "torchao_blockwise_gemm", "_QUANTIZE_INTO", "FP8BackendError",
                                  "_AUTO_CHOICES", "_copy_memo", "_gemm_cublas"])
def test_moved_names_still_import_from_linear(name):
    from dllm_ais.fp8 import linear

    assert getattr(linear, name) is not None
    with pytest.raises(AttributeError):
        linear.no_such_name  # noqa: B018


@pytest.mark.parametrize("first", ["linear", "fused_llada", "sync"])
def test_import_order_does_not_matter(first):
    """A fresh interpreter that imports one fp8 module first, then the moved names from fp8.linear: no import error
    (a cycle shows up as a partially initialised module), and our Triton kernels not imported."""
    code = (f"import sys, dllm_ais.fp8.{first}; from dllm_ais.fp8.linear import quantize_model, sync_weights, "
            "quantized_copy, BACKENDS; print('dllm_ais.fp8.kernels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
