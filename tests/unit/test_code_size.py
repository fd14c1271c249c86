"""The style's size limits, held (issue 28's "done when"): no function over 80 lines and no module over
700 in the code a newcomer changes -- the operator, the server, the local cluster, the benches and the
tests themselves. A module or function that grows past them fails here with its name and size."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("operator", "serving_image", "tools/localcluster", "bench", "tests")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


def python_files() -> list[Path]:
    files = [p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py")) if ".venv" not in p.parts]
    assert len(files) > 100, f"found only {len(files)} modules under {TREES}: wrong root {ROOT}?"
    return files


def test_no_module_is_over_700_lines() -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in python_files()
        if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    }
    assert over == {}, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_80_lines() -> None:
    over = {}
    for p in python_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert over == {}, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
