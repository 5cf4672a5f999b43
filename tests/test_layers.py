"""The layers hold: no upward imports and no import circles, at module level or inside functions.

relations/ is the ground; programs/ and extract/ stand on it (and not on each other); driver/
stands on all three; benchmarks/ on top; the package root ``relsat`` (driver/_root, the Python API
``from relsat import optimize``) above them all, and nothing imports it. Every module of the
installed package is read, the root included, nothing skipped and no exceptions: every ``import``
and ``from ... import`` (function-level ones included, which is where circles hide) with ``ast``.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"relations": "relations", "programs": "programs", "extract": "extract", "driver": "driver",
            "benchmarks": "benchmarks"}
ROOT_PACKAGE = ROOT / "driver" / "_root"  # the package relsat itself (pyproject's package-dir: "relsat")
ALLOWED = {
    "relations": {"relations"},
    "programs": {"relations", "programs"},
    "extract": {"relations", "extract"},
    "driver": {"relations", "programs", "extract", "driver"},
    "benchmarks": {"relations", "programs", "extract", "driver", "benchmarks"},
    "root": {"relations", "programs", "extract", "driver", "benchmarks", "root"},
}


def modules() -> dict[str, Path]:
    """relsat module name -> file, for every module of the installed package: the root ``relsat``
    and every module of the five packages."""
    out = {}
    for f in sorted(ROOT_PACKAGE.rglob("*.py")):
        parts = [p for p in f.relative_to(ROOT_PACKAGE).with_suffix("").parts if p != "__init__"]
        out[".".join(["relsat", *parts])] = f
    for pkg, folder in PACKAGES.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            if ROOT_PACKAGE in f.parents:
                continue  # the root's, above
            parts = [p for p in f.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join(["relsat", pkg, *parts])] = f
    return out


MODULES = modules()


def imports(name: str, path: Path) -> set[str]:
    """The relsat modules ``name`` imports (relative imports resolved; ``from pkg import mod`` counted
    as the module when it is one; an import names the root ``relsat`` only when it says ``relsat``)."""
    known = MODULES
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
            while t not in known and t.count(".") > 1:  # relsat.driver.options.Options -> relsat.driver.options
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.add(t)
    return found


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    return "root" if module == "relsat" else module.split(".")[1]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_upward_import(module):
    bad = sorted(t for t in GRAPH[module] if layer(t) not in ALLOWED[layer(module)])
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


# driver/ in rooms, each standing only on those before it: its ground (errors, options, version: what every
# room reads), the ONNX boundary, the searches, the application.
DRIVER_ROOMS = ("ground", "boundary", "search", "app")


def room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in DRIVER_ROOMS else "ground"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if layer(m) == "driver"))
def test_driver_rooms_stand_on_lower_ones(module):
    here = DRIVER_ROOMS.index(room(module))
    bad = sorted(t for t in GRAPH[module] if layer(t) == "driver" and DRIVER_ROOMS.index(room(t)) > here)
    assert not bad, f"{module} ({room(module)}) imports {bad}"


def test_driver_is_three_rooms_on_a_small_ground():
    top = {f.stem for f in (ROOT / "driver").glob("*.py")}
    assert top == {"__init__", "errors", "options", "version"}, top
    assert {f.name for f in (ROOT / "driver").iterdir() if f.is_dir() and not f.name.startswith(("_", "."))} \
        == set(DRIVER_ROOMS[1:])
    assert room("relsat.driver.app.cli") == "app" and room("relsat.driver.options") == "ground"


def test_the_graph_is_read():
    """The reader sees the imports that exist and every module, the root's too (a guard against a test
    that checks nothing)."""
    assert "relsat.relations.egraph" in GRAPH["relsat.driver.app.optimize"]
    assert "relsat.relations.catalog" in GRAPH["relsat.relations.egraph"]
    assert {"relsat.driver.version", "relsat.driver.app.optimize", "relsat.driver.options"} <= GRAPH["relsat"]
    assert "relsat.driver.boundary.zoo" in GRAPH["relsat.driver.app.cli"]
    files = {f for folder in PACKAGES.values() for f in (ROOT / folder).rglob("*.py")}
    assert files == set(MODULES.values())  # nothing skipped
    assert len(GRAPH) > 30


def test_an_import_of_the_root_is_seen(tmp_path):
    """``from relsat import x`` in a driver module is an import of the root (upward), but an unknown
    module under relsat is not mistaken for it."""
    f, g = tmp_path / "f.py", tmp_path / "g.py"
    f.write_text("from relsat import __version__\n")
    g.write_text("import relsat.no_such_module\nfrom relsat.driver.options import DEFAULTS\n")
    assert imports("relsat.driver.f", f) == {"relsat"}
    assert imports("relsat.driver.g", g) == {"relsat.driver.options"}
    assert not ALLOWED["driver"] & {layer("relsat")}
