"""The size budget of production code: no file over 400 lines, no function over 80.

    python .ci/size_budget.py        (`make lint` runs it)

Production code is tracer/, ir/, codegen/ and runtime/ (tests, benchmarks and examples are
not counted). A function's length runs from its `def` line to its last line, docstring included.
Prints every file and function over budget and exits 1 if there is one.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tracer", "ir", "codegen", "runtime")
FILE_LINES, FUNCTION_LINES = 400, 80


def over_budget(path: Path) -> list[str]:
    text = path.read_text()
    relative = path.relative_to(ROOT)
    found = []
    lines = len(text.splitlines())
    if lines > FILE_LINES:
        found.append(f"{relative}: {lines} lines (budget {FILE_LINES})")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES:
                found.append(f"{relative}:{node.lineno}: function {node.name} has {length} lines "
                             f"(budget {FUNCTION_LINES})")
    return found


def main() -> int:
    found = [problem for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for problem in over_budget(path)]
    print("\n".join(found) if found else "size budget: every file and function within budget")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
