"""The layers hold: no upward imports and no import circles, at module level or inside functions.

relations/ is the ground; programs/ and extract/ stand on it (and not on each other); driver/
stands on all three; benchmarks/ on top. Every ``import`` and ``from ... import`` in every module
(function-level ones included, which is where circles hide) is read with ``ast``.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"relations": "relations", "programs": "programs", "extract": "extract", "driver": "driver",
            "benchmarks": "benchmarks"}
ALLOWED = {
    "relations": {"relations"},
    "programs": {"relations", "programs"},
    "extract": {"relations", "extract"},
    "driver": {"relations", "programs", "extract", "driver"},
    "benchmarks": {"relations", "programs", "extract", "driver", "benchmarks"},
}
# The one sanctioned exception: the command line serves the built-in benchmark models (`zoo:NAME`
# inputs, `relsat zoo build`), which the design ships as relsat.benchmarks.
EXCEPTIONS = {("relsat.driver.cli", "relsat.benchmarks.zoo")}


def modules() -> dict[str, Path]:
    """relsat module name -> file, for every module of the five packages."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            rel = f.relative_to(ROOT / folder).with_suffix("")
            if rel.parts and rel.parts[0] == "_root":
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join(["relsat", pkg, *parts])] = f
    return out


def imports(name: str, path: Path) -> set[str]:
    """The relsat modules ``name`` imports (relative imports resolved; ``from pkg import mod`` counted
    as the module when it is one)."""
    known = modules()
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = ".".join(base[: len(base) - node.level + 1]) + ("." + node.module if node.module else "") \
                if node.level else node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.add(t)
    return found


GRAPH = {name: imports(name, path) for name, path in modules().items()}


def layer(module: str) -> str:
    return module.split(".")[1]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_upward_import(module):
    bad = sorted(t for t in GRAPH[module] if layer(t) not in ALLOWED[layer(module)] and (module, t) not in EXCEPTIONS)
    assert not bad, f"{module} imports {bad}"


def test_no_import_circles():
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_graph_is_read():
    """The reader sees the imports that exist (a guard against a test that checks nothing)."""
    assert "relsat.relations.egraph" in GRAPH["relsat.driver.optimize"]
    assert "relsat.relations.catalog" in GRAPH["relsat.relations.egraph"]
    assert len(GRAPH) > 30
