"""Layering metrics of the llmc package: cross-package imports, file-level import cycles,
function-local imports of llmc's own modules, files over 300 lines, functions over 80 lines.

    python ci/import_metrics.py            # summary
    python ci/import_metrics.py --cycles   # exit 1 if any file-level or package cycle exists

The import graph is import-linter's (grimp's `build_graph`, every import in a file, function-local
ones included, `if TYPE_CHECKING:` ones excluded); cycles are its strongly connected components.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "llmc"
# (importer, imported) subpackage pairs the layers forbid or that the redesign watches.
WATCHED = [
    ("runtime", "compiler"),
    ("compiler", "runtime"),
    ("calibration", "compiler"),
    ("compiler", "calibration"),
    ("registry", "compiler"),
    ("compiler", "registry"),
    ("runtime", "registry"),
]


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def build_graph() -> grimp.ImportGraph:
    """grimp's import graph of llmc (function-local imports included, TYPE_CHECKING ones not)."""
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=True, cache_dir=None)


def cross_package_imports(graph: grimp.ImportGraph) -> Counter:
    """Import statements (one per importing line) from one llmc subpackage into another."""
    counts: Counter = Counter()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            pair = (_subpackage(importer), _subpackage(imported))
            if pair[0] != pair[1]:
                details = graph.get_import_details(importer=importer, imported=imported)
                counts[pair] += max(1, len(details))
    return counts


def file_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module."""
    modules = sorted(graph.modules)
    return _components(
        modules, {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    )


def package_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Cycles between the children of one package (modules or subpackages, as import-linter's
    ``acyclic_siblings`` sees them): for every package of llmc, the strongly connected
    components of more than one child, a child importing another when any module in it does."""
    packages = {m.rsplit(".", 1)[0] for m in graph.modules if "." in m}
    found = []
    for package in sorted(packages):
        prefix = package + "."
        child_edges: dict[str, set[str]] = {}
        for m in graph.modules:
            if not m.startswith(prefix):
                continue
            a = prefix + m[len(prefix) :].split(".")[0]
            child_edges.setdefault(a, set())
            for imported in graph.find_modules_directly_imported_by(m):
                if imported.startswith(prefix):
                    b = prefix + imported[len(prefix) :].split(".")[0]
                    if b != a:
                        child_edges[a].add(b)
        for b in {b for bs in child_edges.values() for b in bs}:
            child_edges.setdefault(b, set())
        children = sorted(child_edges)
        found += _components(children, {c: sorted(child_edges[c]) for c in children})
    return sorted(found)


def compiler_cross_package_imports(graph: grimp.ImportGraph) -> int:
    """Import statements from one package (or root module) of ``llmc.compiler`` into another."""

    def room(module: str) -> str:
        return module.split(".")[2] if module.count(".") >= 2 else module

    total = 0
    for importer in graph.modules:
        if not importer.startswith("llmc.compiler."):
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported.startswith("llmc.compiler.") and room(importer) != room(imported):
                details = graph.get_import_details(importer=importer, imported=imported)
                total += max(1, len(details))
    return total


def _components(modules: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def _python_files() -> list[Path]:
    return sorted((ROOT / PACKAGE).rglob("*.py"))


def _is_llmc_import(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == PACKAGE
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == PACKAGE for alias in node.names)
    return False


def function_local_imports() -> list[str]:
    """`file:line` of every import of an llmc module inside a function body."""
    found = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if _is_llmc_import(node):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(set(found))


def long_files(limit: int = 300) -> list[tuple[str, int]]:
    """(path, lines) of llmc's files longer than ``limit`` lines."""
    out = []
    for path in _python_files():
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append((str(path.relative_to(ROOT)), lines))
    return out


def long_functions(limit: int = 80) -> list[tuple[str, int]]:
    """(qualified name, lines) of llmc's functions longer than ``limit`` lines."""
    out = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", lines))
    return out


def main() -> int:
    """Print the counts (exit 0); with ``--cycles`` only the cycle check, exit 1 on a cycle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cycles", action="store_true", help="only check for file-level and package cycles"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list every finding")
    args = parser.parse_args()
    graph = build_graph()
    cycles, package = file_cycles(graph), package_cycles(graph)
    if args.cycles:
        for component in cycles + package:
            print("cycle:", " <-> ".join(component))
        print(f"{len(cycles)} file-level import cycle(s), {len(package)} package cycle(s)")
        return 1 if cycles or package else 0
    counts = cross_package_imports(graph)
    print("cross-package import statements:")
    for pair in WATCHED:
        print(f"  {pair[0]} -> {pair[1]}: {counts.get(pair, 0)}")
    print(f"file-level import cycles: {len(cycles)}")
    for component in cycles:
        print("  " + " <-> ".join(component))
    print(f"package cycles: {len(package)}")
    for component in package:
        print("  " + " <-> ".join(component))
    between = compiler_cross_package_imports(graph)
    print(f"import statements between the compiler's packages: {between}")
    local = function_local_imports()
    print(f"function-local imports of llmc modules: {len(local)}")
    if args.verbose:
        for where in local:
            print("  " + where)
    files = long_files()
    print(f"files over 300 lines: {len(files)}")
    for name, lines in files:
        print(f"  {name}: {lines}")
    funcs = long_functions()
    print(f"functions over 80 lines: {len(funcs)}")
    if args.verbose:
        for name, lines in funcs:
            print(f"  {name}: {lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
