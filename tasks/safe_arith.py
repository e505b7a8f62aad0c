"""Safe exact evaluation of arithmetic in model text: ``ast`` parse + whitelist + ``Fraction`` arithmetic.

Model text is never passed to ``eval``/``exec`` or compiled to code: ``ast.parse`` only builds a syntax tree, the
whole tree is checked against a whitelist (integer literals, binary ``+ - * /``, unary ``-``/``+``; parentheses leave
no node) before any arithmetic happens, and evaluation walks the checked tree with ``fractions.Fraction``. Size limits
bound the text length, node count and literal magnitude, so the work is bounded for any input. Anything else —
names, calls, attributes, ``**``, ``//``, ``%``, floats, strings, lambdas, comparisons — yields ``None``.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from fractions import Fraction

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, *_BINARY, *_UNARY)


@dataclass(frozen=True)
class ArithLimits:
    """Bounds on what ``evaluate_arithmetic`` will look at."""

    max_chars: int = 200
    """Longer text is rejected before parsing (also bounds parenthesis nesting)."""
    max_nodes: int = 64
    """Most AST nodes (operators count as nodes) in an accepted expression."""
    max_literal: int = 10**6
    """Largest integer literal accepted."""


@dataclass(frozen=True)
class ArithValue:
    """An evaluated expression: its exact value and its integer literals in source order."""

    value: Fraction
    literals: tuple[int, ...]


def evaluate_arithmetic(text: str, limits: ArithLimits = ArithLimits()) -> ArithValue | None:
    """Exact value and literals of ``text``, or ``None`` if it is not a small whitelisted expression or divides by 0."""
    if not isinstance(text, str) or len(text) > limits.max_chars or not text.strip():
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    nodes = list(ast.walk(tree))
    if len(nodes) > limits.max_nodes or not all(_allowed(node, limits) for node in nodes):
        return None
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        return None
    constants = sorted((n for n in nodes if isinstance(n, ast.Constant)), key=_position)  # walk is breadth-first
    return ArithValue(value=value, literals=tuple(n.value for n in constants))


def _position(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _allowed(node: ast.AST, limits: ArithLimits) -> bool:
    if not isinstance(node, _ALLOWED):
        return False
    if isinstance(node, ast.Constant):  # bool is an int subclass: compare the exact type
        return type(node.value) is int and 0 <= node.value <= limits.max_literal
    return True


def _evaluate(node: ast.expr) -> Fraction:
    """Value of an already-whitelisted node (recursion depth is bounded by ``max_nodes``)."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise TypeError(f"unexpected node {type(node).__name__}")  # unreachable after the whitelist check
