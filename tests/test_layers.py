"""The layer rule of DESIGN.md, checked from the imports.

    cli.py, demo.py, __main__.py                       (the top: may import anything)
    compiler/   bench/   cuda/                         (one row; bench times the other two)
    kernels/  (with linalg.py, nn.py: the library API over the kernels)
    device.py · config.py · targets.py · diskcache.py  (the floor; the package root only imports these)

"A module may import from its own layer or below, never above, and no two modules import each other."

Every module under ``tilefuse/`` is parsed with :mod:`ast` (nothing is imported or executed), every
``import`` / ``from ... import`` statement is resolved to a module of the package -- absolute or relative,
at module level or inside a function, since a function-level import is a dependency all the same, only
a later one -- and each edge is checked against ``ALLOWED`` below. A module's layer comes from its path
prefix (``tilefuse/kernels/...`` is ``kernels`` however deep), so the test keeps working when files move
into subpackages.

Known violations that live in files being reorganised elsewhere are listed in ``KNOWN_UPWARD`` and
``KNOWN_CYCLES``, each with why it exists; they are to be removed, and the test fails on any new one and
on an allow-list entry that no longer matches anything (so the list only shrinks). The state measured when the
test was written: docs/decisions/029-layer-rule-and-shared-hopper-header.md.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = "tilefuse"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Layer of a module, by the longest matching dotted prefix (a subpackage inherits its folder's layer).
LAYER_OF_PREFIX = {
    "tilefuse": "floor",            # the root imports config and device only, loads the rest lazily by name
    "tilefuse.device": "floor",
    "tilefuse.config": "floor",
    "tilefuse.targets": "floor",
    "tilefuse.diskcache": "floor",
    "tilefuse.kernels": "kernels",
    "tilefuse.linalg": "kernels",   # tilefuse.gemm(...): the library API over the GEMM family
    "tilefuse.nn": "kernels",       # tilefuse.nn.Linear: a module over linalg
    "tilefuse.compiler": "compiler",
    "tilefuse.bench": "bench",
    "tilefuse.cuda": "cuda",
    "tilefuse.cli": "cli",
    "tilefuse.__main__": "cli",
    "tilefuse.demo": "cli",         # `tilefuse demo`: a tour of every part, run only by the CLI
}

# Which layers a layer may import from (its own included). Read off DESIGN.md's diagram: compiler and
# bench stand on kernels, cuda only on the floor, bench sits in the same row as compiler and cuda because
# its suites time them; nothing below the CLI imports the CLI.
ALLOWED = {
    "floor": {"floor"},
    "kernels": {"kernels", "floor"},
    "compiler": {"compiler", "kernels", "floor"},
    "cuda": {"cuda", "floor"},
    "bench": {"bench", "compiler", "cuda", "kernels", "floor"},
    "cli": {"cli", "bench", "compiler", "cuda", "kernels", "floor"},
}

# (importer, imported) edges that break the rule today, in files being reorganised by the GEMM-package
# and compiler-stage moves. Each is to be removed by that move; the test fails when one disappears so that
# the entry goes with it.
KNOWN_UPWARD: dict[tuple[str, str], str] = {
}

# Import cycles (strongly connected components of more than one module) that exist today, as frozensets of
# module names, each with why and what removes it. A cycle found must lie inside one of these (a move that
# splits one is fine); one that reaches a module outside them is new and fails.
KNOWN_CYCLES: dict[frozenset, str] = {
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    if module == PACKAGE:
        return LAYER_OF_PREFIX[PACKAGE]
    parts = module.split(".")
    for n in range(len(parts), 1, -1):  # the bare package prefix names the root alone, not its children
        layer = LAYER_OF_PREFIX.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    raise KeyError(f"{module} has no layer: add its path prefix to LAYER_OF_PREFIX")


def discover_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The package module that importing ``target`` executes last: the longest existing prefix."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in modules:
            return name
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported package module, line) for every import statement in ``path``, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    resolved = _resolve(alias.name, modules)
                    if resolved is not None:
                        found.append((resolved, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # `from .x import y` in a.b.c (module) is a.b.x; in package a.b (an __init__) it is a.b.x.
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
                if not (stem == PACKAGE or stem.startswith(PACKAGE + ".")):
                    continue
            for alias in node.names:
                # `from pkg import sub` imports the submodule pkg.sub when it exists, else a name of pkg.
                resolved = _resolve(f"{stem}.{alias.name}", modules) if alias.name != "*" else None
                if resolved is None or resolved == _resolve(stem, modules):
                    resolved = _resolve(stem, modules)
                if resolved is not None:
                    found.append((resolved, node.lineno))
        elif isinstance(node, ast.Call) and _is_import_module_call(node):
            target = node.args[0].value
            if target.startswith(PACKAGE + ".") or target == PACKAGE:
                resolved = _resolve(target, modules)
                if resolved is not None:
                    found.append((resolved, node.lineno))
    return [(m, line) for m, line in found if m != module]


def _is_import_module_call(node: ast.Call) -> bool:
    """``importlib.import_module("tilefuse.x")`` with a literal name is an import too."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return (name == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str))


def import_graph() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    """Modules and, for each, the package modules it imports with the first line that does."""
    modules = discover_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(name, path, modules):
            edges.setdefault(target, line)
        graph[name] = edges
    return modules, graph


def upward_imports(modules, graph) -> dict[tuple[str, str], str]:
    bad = {}
    for src, edges in graph.items():
        src_layer = layer_of(src)
        for dst, line in edges.items():
            dst_layer = layer_of(dst)
            if dst_layer not in ALLOWED[src_layer]:
                where = modules[src].relative_to(ROOT.parent)
                bad[(src, dst)] = f"{where}:{line}: {src} ({src_layer}) imports {dst} ({dst_layer})"
    return bad


def strongly_connected_components(graph: dict[str, dict[str, int]]) -> list[frozenset]:
    """Tarjan's algorithm, iterative (the package has a few hundred modules; no recursion limit worries)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[frozenset] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(frozenset(component))
    return components


def cycle_description(component: frozenset, modules, graph) -> str:
    lines = []
    for src in sorted(component):
        for dst, line in sorted(graph[src].items()):
            if dst in component:
                lines.append(f"  {modules[src].relative_to(ROOT.parent)}:{line}: {src} -> {dst}")
    return "\n".join(lines)


# --- the checks ---------------------------------------------------------------------------------------

def test_every_module_has_a_layer():
    for name in discover_modules():
        layer_of(name)  # raises with the module's name when a new top-level module has no layer


def test_no_upward_imports():
    modules, graph = import_graph()
    bad = upward_imports(modules, graph)
    new = sorted(msg for edge, msg in bad.items() if edge not in KNOWN_UPWARD)
    assert not new, "imports that break DESIGN.md's layer rule:\n" + "\n".join(new)
    stale = sorted(f"{a} -> {b}" for (a, b) in KNOWN_UPWARD if (a, b) not in bad)
    assert not stale, "KNOWN_UPWARD entries that no longer occur (delete them):\n" + "\n".join(stale)


def test_no_import_cycles():
    modules, graph = import_graph()
    cycles = [c for c in strongly_connected_components(graph) if len(c) > 1]
    new = [c for c in cycles if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, "import cycles:\n" + "\n\n".join(cycle_description(c, modules, graph) for c in new)
    stale = [sorted(known) for known in KNOWN_CYCLES if not any(c <= known for c in cycles)]
    assert not stale, f"KNOWN_CYCLES entries that no longer occur (delete them): {stale}"


# The compiler's stages in pipeline order (DESIGN.md, "The compiler, as data flowing through it"): a stage
# imports only stages at its own rank or before it, so a value flows one way through the pipeline. Rank 0 serves
# every stage (settings, counters, the one tuning table); the IR is what every stage after capture speaks.
COMPILER_STAGE_RANK = {
    "tilefuse.compiler.options": 0, "tilefuse.compiler.records": 0, "tilefuse.compiler.tuning": 0,
    "tilefuse.compiler.ir": 1,
    "tilefuse.compiler.decompositions": 2, "tilefuse.compiler.patterns": 2, "tilefuse.compiler.reinplace": 2,
    "tilefuse.compiler.lowering": 3,
    "tilefuse.compiler.scheduler": 4,
    "tilefuse.compiler.codegen": 5,
    "tilefuse.compiler.cache": 6,
    "tilefuse.compiler.runtime": 7,
    "tilefuse.compiler.backend": 8, "tilefuse.compiler.explain": 8, "tilefuse.compiler": 8,
}


def compiler_stage(module: str) -> tuple[str, int]:
    prefix = ".".join(module.split(".")[:3])  # tilefuse.compiler.<stage>, or the package itself
    if prefix in COMPILER_STAGE_RANK:
        return prefix, COMPILER_STAGE_RANK[prefix]
    raise KeyError(f"{module} is in no compiler stage: add it to COMPILER_STAGE_RANK")


def test_compiler_stages_import_only_earlier_stages():
    modules, graph = import_graph()
    bad = []
    for src, edges in graph.items():
        if layer_of(src) != "compiler":
            continue
        src_stage, src_rank = compiler_stage(src)
        for dst, line in edges.items():
            if layer_of(dst) != "compiler":
                continue
            dst_stage, dst_rank = compiler_stage(dst)
            if dst_rank > src_rank:
                bad.append(f"{modules[src].relative_to(ROOT.parent)}:{line}: {src_stage} (stage {src_rank}) imports "
                           f"{dst_stage} (stage {dst_rank}), a later stage")
    assert not bad, "compiler stages importing a later stage:\n" + "\n".join(sorted(bad))


def test_compiler_stage_rank_catches_a_later_stage_import():
    assert compiler_stage("tilefuse.compiler.lowering.gemm") == ("tilefuse.compiler.lowering", 3)
    assert compiler_stage("tilefuse.compiler.runtime.cudagraphs")[1] > compiler_stage("tilefuse.compiler.codegen")[1]
    with pytest.raises(KeyError, match="no compiler stage"):
        compiler_stage("tilefuse.compiler.somewhere_new")


# --- the checker checks itself on hand-made trees, so a silent resolver bug cannot hide a violation ---

def _write(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / PACKAGE


def test_resolver_sees_relative_absolute_and_function_level_imports(tmp_path):
    root = _write(tmp_path, {
        "tilefuse/__init__.py": "from . import config\n",
        "tilefuse/config.py": "",
        "tilefuse/kernels/__init__.py": "",
        "tilefuse/kernels/gemm/__init__.py": "from .launch import run\n",
        "tilefuse/kernels/gemm/launch.py": "from ... import config\ndef run():\n    from ...compiler import ir\n",
        "tilefuse/compiler/__init__.py": "",
        "tilefuse/compiler/ir.py": "import tilefuse.kernels.gemm.launch as l\n",
    })
    global ROOT
    saved, ROOT = ROOT, root
    try:
        modules, graph = import_graph()
        assert graph["tilefuse.kernels.gemm"] == {"tilefuse.kernels.gemm.launch": 1}
        assert graph["tilefuse.kernels.gemm.launch"] == {"tilefuse.config": 1, "tilefuse.compiler.ir": 3}
        assert graph["tilefuse.compiler.ir"] == {"tilefuse.kernels.gemm.launch": 1}
        bad = upward_imports(modules, graph)
        assert list(bad) == [("tilefuse.kernels.gemm.launch", "tilefuse.compiler.ir")]
        assert "tilefuse/kernels/gemm/launch.py:3" in bad[("tilefuse.kernels.gemm.launch", "tilefuse.compiler.ir")]
        cycles = [c for c in strongly_connected_components(graph) if len(c) > 1]
        assert cycles == [frozenset({"tilefuse.kernels.gemm.launch", "tilefuse.compiler.ir"})]
    finally:
        ROOT = saved


def test_layer_comes_from_the_path_prefix():
    assert layer_of("tilefuse.kernels.gemm.configs") == "kernels"
    assert layer_of("tilefuse.compiler.lowering.pointwise") == "compiler"
    assert layer_of("tilefuse.cuda.ladder") == "cuda"
    assert layer_of("tilefuse") == "floor"
    with pytest.raises(KeyError, match="tilefuse.newthing"):
        layer_of("tilefuse.newthing")
