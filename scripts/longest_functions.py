"""Print the longest function and the longest file of each package; exit 1 when one is over its limit.

    python scripts/longest_functions.py [--limit 80] [--file-limit 600]

Packages: autopar/, solver/, service/, cache/.  A function's length is its lines from
``def`` (or its first decorator) to its last line, nested functions counted in their
parent too.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autopar", "solver", "service", "cache")
LIMIT = 80
FILE_LIMIT = 600
"""Lines of a module: a longer one holds more than one concept (split it by meaning)."""


def functions(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                end = child.end_lineno or child.lineno
                found.append((prefix + child.name, first, end - first + 1))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=LIMIT)
    ap.add_argument("--file-limit", type=int, default=FILE_LIMIT)
    args = ap.parse_args(argv)
    failed = False
    for package in PACKAGES:
        longest: tuple[int, str] = (0, "")
        longest_file: tuple[int, str] = (0, "")
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text().splitlines())
            if lines > args.file_limit:
                failed = True
                print(f"file over {args.file_limit}: {rel} {lines} lines")
            longest_file = max(longest_file, (lines, rel))
            for name, line, length in functions(path):
                where = f"{rel}:{name}"
                if length > args.limit:
                    failed = True
                    print(f"over {args.limit}: {where} (line {line}) {length} lines")
                if length > longest[0]:
                    longest = (length, f"{where} (line {line})")
        print(f"{package}/: longest function {longest[1] or '-'}: {longest[0]} lines")
        print(f"{package}/: longest file {longest_file[1] or '-'}: {longest_file[0]} lines")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
