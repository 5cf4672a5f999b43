"""Nothing lost, nothing wrong: output paths, the e-graph file, the cost cache, unsound rules, `relsat query`.

Every refusal is checked the way a user meets it: exit status 1, one line on stderr naming the
path or rule, no traceback, and the files that were there before unchanged.
"""

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from relsat.driver.app.cli import app
from relsat.driver.errors import RelsatError
from relsat.driver.app.optimize import optimize
from relsat.driver.boundary.verify import compare_output, verify
from relsat.extract.cost_cache import CostCache

runner = CliRunner()
F = TensorProto.FLOAT
FAST = ["--cost-model", "analytic", "--no-measure"]


def model_of(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs.items()], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def small_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return model_of(nodes, {"x": [2, 8]}, {"y": [2, 8]}, [w])


def shifted_relu_model() -> onnx.ModelProto:
    """Relu(x + 10): standard-normal inputs never reach Relu's negative side."""
    ten = numpy_helper.from_array(np.array(10, np.float32), "ten")
    nodes = [helper.make_node("Add", ["x", "ten"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return model_of(nodes, {"x": [4, 32]}, {"y": [4, 32]}, [ten])


def mixed_scale_model() -> onnx.ModelProto:
    """Concat of a small-valued half (x + w) and a 1e5-valued half (x * w * 1e5)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.uniform(3, 6, (1, 16)).astype(np.float32), "w")
    big = numpy_helper.from_array(np.array(1e5, np.float32), "big")
    nodes = [helper.make_node("Mul", ["x", "w"], ["p"]), helper.make_node("Mul", ["p", "big"], ["b"]),
             helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Concat", ["s", "b"], ["y"], axis=1)]
    return model_of(nodes, {"x": [1, 16]}, {"y": [1, 32]}, [w, big])


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A folder with a model, a text file and a cost cache that has one row."""
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    monkeypatch.chdir(tmp_path)
    onnx.save(small_model(), tmp_path / "m.onnx")
    (tmp_path / "notes.txt").write_text("my notes\n")
    import datetime as dt

    from relsat.extract.cost_cache import CostRow

    CostCache(tmp_path / "costs.duckdb").store([CostRow("k", "cpu", 1, "Relu", {}, 0.5, 3, "1", dt.datetime.now())])
    return tmp_path


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def refused(args, *needles) -> str:
    """Run the CLI; assert exit 1, exactly one line on stderr with every needle, no traceback."""
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.output and lines[0].startswith("error:")
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- --db


def test_db_at_the_input_model_is_refused(place):
    before = snapshot(place)
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--db", "m.onnx", *FAST], "--db m.onnx", "input model")
    assert snapshot(place) == before


def test_db_at_a_text_file_is_refused(place):
    before = snapshot(place)
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--db", "notes.txt", *FAST], "--db notes.txt",
            "not a DuckDB database")
    assert snapshot(place) == before


def test_db_at_another_duckdb_file_is_refused(place):
    with duckdb.connect(str(place / "mine.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT 42 AS answer")
    before = snapshot(place)
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--db", "mine.duckdb", *FAST], "mine.duckdb",
            "without the e-graph tables")
    assert snapshot(place) == before


def test_db_at_the_cost_cache_is_refused(place):
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--db", "costs.duckdb"], "--db costs.duckdb", "cost cache")
    assert CostCache(place / "costs.duckdb").count() == 1  # still a working cache with its row


@pytest.mark.parametrize("flag", ["-o", "--report"])
def test_outputs_may_not_be_the_cost_cache_or_each_other(place, flag):
    refused(["optimize", "m.onnx", "-o", "o.onnx", *([] if flag == "-o" else ["--report", "costs.duckdb"]),
             *(["-o", "costs.duckdb"] if flag == "-o" else []), *FAST], "costs.duckdb")
    refused(["optimize", "m.onnx", "-o", "same", "--report", "same", *FAST], "same")
    assert CostCache(place / "costs.duckdb").count() == 1


def test_a_failed_run_keeps_the_earlier_egraph(place):
    res = runner.invoke(app, ["optimize", "m.onnx", "-o", "o.onnx", "--db", "g.duckdb", *FAST])
    assert res.exit_code == 0, res.output
    with duckdb.connect(str(place / "g.duckdb"), read_only=True) as con:
        enodes = con.execute("SELECT count(*) FROM enodes").fetchall()
    before = snapshot(place)
    # fails after the model is loaded, in import: the e-graph being built is dropped
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--db", "g.duckdb", "--input-shape", "nosuch=1,2", *FAST],
            "nosuch")
    assert snapshot(place) == before  # g.duckdb as it was, no temporary file left
    with duckdb.connect(str(place / "g.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM enodes").fetchall() == enodes


def test_a_relsat_egraph_is_replaced(place):
    for _ in range(2):
        res = runner.invoke(app, ["optimize", "m.onnx", "-o", "o.onnx", "--db", "g.duckdb", "--report", "r.json",
                                  *FAST])
        assert res.exit_code == 0, res.output
    assert sorted(p.name for p in place.iterdir()) == ["costs.duckdb", "g.duckdb", "m.onnx", "notes.txt", "o.onnx",
                                                       "r.json"]
    assert json.loads((place / "r.json").read_text())["verification"]["ok"]


# ---------------------------------------------------------------- other output paths


def test_output_that_is_a_folder(place):
    (place / "d").mkdir()
    refused(["optimize", "m.onnx", "-o", "d", *FAST], "-o d", "folder")


def test_output_under_a_file(place):
    before = snapshot(place)
    refused(["optimize", "m.onnx", "-o", "notes.txt/o.onnx", *FAST], "notes.txt", "not a folder")
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--report", "notes.txt/r.json", *FAST], "--report")
    assert snapshot(place) == before


def test_output_replaces_only_a_model(place):
    before = snapshot(place)
    refused(["optimize", "m.onnx", "-o", "notes.txt", *FAST], "-o notes.txt", "not an ONNX model")
    refused(["optimize", "m.onnx", "-o", "m.onnx", *FAST], "input model")
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--report", "notes.txt", *FAST], "not a relsat report")
    assert snapshot(place) == before


def _unwritable() -> Path:
    """A folder this process cannot create files in, even as root (/sys), or a chmod-ed one."""
    probe = Path("/sys/relsat-probe")
    try:
        probe.touch()
        probe.unlink()
    except OSError:
        return Path("/sys")
    pytest.skip("no unwritable folder here")


@pytest.mark.parametrize("flag", ["-o", "--db", "--report"])
def test_unwritable_output_is_refused_before_any_work(place, flag):
    bad = _unwritable() / "relsat-out" / "x"
    args = {"-o": ["-o", bad], "--db": ["-o", "o.onnx", "--db", bad], "--report": ["-o", "o.onnx", "--report", bad]}
    before = snapshot(place)
    refused(["optimize", "m.onnx", *args[flag], *FAST], flag, "cannot write")
    assert snapshot(place) == before  # in particular no o.onnx: the model is not written either


def test_corrupt_cost_cache_is_set_aside_and_rebuilt(place, monkeypatch):
    """In relsat's own cache folder a file that is not a database is relsat's broken cache: set aside and
    rebuilt. Elsewhere (RELSAT_COST_CACHE) it may be the user's: refused, untouched."""
    (place / "costs.duckdb").write_bytes(b"not a database " * 100)
    before = snapshot(place)
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--no-measure"], "costs.duckdb", "cost cache")
    assert snapshot(place) == before
    monkeypatch.delenv("RELSAT_COST_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(place / "xdg"))  # the user cache dir (platformdirs, Linux)
    own = place / "xdg" / "relsat" / "costs.duckdb"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"not a database " * 100)
    res = runner.invoke(app, ["optimize", "m.onnx", "-o", "o.onnx", "--no-measure"])  # measured costs
    assert res.exit_code == 0, res.output
    aside = [p.name for p in own.parent.iterdir() if p.name.startswith("costs.duckdb.corrupt-")]
    assert len(aside) == 1 and (own.parent / aside[0]).read_bytes() == b"not a database " * 100
    assert CostCache(own).count() > 0  # rebuilt with this run's measurements
    warning = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "set aside as costs.duckdb.corrupt-" in warning[0]


def test_query_on_a_file_that_is_not_duckdb_or_a_folder(place):
    refused(["query", "notes.txt", "SELECT 1"], "notes.txt")
    refused(["query", ".", "SELECT 1"], "folder")
    refused(["query", "absent.duckdb", "SELECT 1"], "absent.duckdb")


# ---------------------------------------------------------------- unsound rules


def test_unsound_user_rules_are_refused_before_use(place):
    onnx.save(shifted_relu_model(), place / "relu.onnx")
    onnx.save(mixed_scale_model(), place / "mixed.onnx")
    (place / "relu.rules").write_text("# unsound\nrelu-id: (Relu ?x) => ?x\n")
    (place / "addmul.rules").write_text("# unsound\n\nadd-mul: (Add ?a ?b) => (Mul ?a ?b)\n")
    before = snapshot(place)
    refused(["optimize", "relu.onnx", "-o", "o.onnx", "--rules", "relu.rules", *FAST],
            "relu.rules:2:1", "relu-id", "unsound")
    refused(["optimize", "mixed.onnx", "-o", "o.onnx", "--rules", "default", "--rules", "addmul.rules", *FAST],
            "addmul.rules:3:1", "add-mul", "unsound")
    assert snapshot(place) == before


def test_verification_alone_refuses_the_mixed_scale_model(tmp_path):
    """With the rule check skipped, the extracted graph (Add rewritten to a Mul already there) is wrong
    by about 10 on the small half, under 1e-4 of the output's largest value; per element, it is refused."""
    with pytest.raises(RelsatError) as info:
        optimize(mixed_scale_model(), rules=[str(_rules(tmp_path, "add-mul: (Add ?a ?b) => (Mul ?a ?b)"))],
                 check_rules=False, cost_model="analytic", measure=False, output=tmp_path / "o.onnx")
    msg = str(info.value)
    assert "verification failed, no model written" in msg and "worst element [0, " in msg
    assert not (tmp_path / "o.onnx").exists()


def test_verification_reaches_the_negative_side_of_the_shifted_relu():
    """The model the rule `(Relu ?x) => ?x` makes of Relu(x + 10) agrees on standard-normal inputs;
    the wide draw (normal x 10) reaches x < -10 and shows the difference, with the element."""
    original = shifted_relu_model()
    ten = numpy_helper.from_array(np.array(10, np.float32), "ten")
    rewritten = model_of([helper.make_node("Add", ["x", "ten"], ["y"])], {"x": [4, 32]}, {"y": [4, 32]}, [ten])
    narrow = verify(original, rewritten, draws=((0, 1.0), (1, 1.0)))
    assert narrow.ok  # what one standard-normal draw saw before
    result = verify(original, rewritten)
    assert not result.ok
    check = result.per_output["y"]
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32) * 10
    assert check.draw == 2 and x[check.worst] + 10 < 0  # the reported element is one Relu clamps
    assert "input draw 3 of 3" in result.message and f"element {list(check.worst)}" in result.message


def _rules(folder: Path, text: str) -> Path:
    path = folder / "user.rules"
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_integer_and_boolean_outputs_compare_exactly(dtype):
    ref = np.arange(12).reshape(3, 4).astype(dtype)
    got = ref.copy()
    assert compare_output(ref, got).ok
    got[2, 1] = not got[2, 1] if dtype == np.bool_ else got[2, 1] + 1
    c = compare_output(ref, got)
    assert not c.ok and c.worst == (2, 1) and "compared exactly" in c.problem


def test_small_elements_are_not_hidden_by_large_ones():
    ref = np.concatenate([np.full(4, 2.0), np.full(4, 1e5)]).astype(np.float32)
    got = ref.copy()
    got[1] += 0.5  # 2.5e-6 of the largest value, 25 % of its own
    c = compare_output(ref, got)
    assert not c.ok and c.worst == (1,)
    got = ref * np.float32(1 + 2e-7)  # rounding-sized differences everywhere pass
    assert compare_output(ref, got).ok


# ---------------------------------------------------------------- relsat query


@pytest.fixture(scope="module")
def built_egraph(tmp_path_factory):
    """The small model's e-graph, built once for the module's query tests (each gets its own copy)."""
    d = tmp_path_factory.mktemp("query")
    mp = pytest.MonkeyPatch()
    mp.setenv("RELSAT_COST_CACHE", str(d / "costs.duckdb"))
    try:
        optimize(small_model(), db=d / "g.duckdb", cost_model="analytic", measure=False)
    finally:
        mp.undo()
    return d / "g.duckdb"


@pytest.fixture
def egraph(place, built_egraph):
    shutil.copy(built_egraph, place / "g.duckdb")
    return place / "g.duckdb"


@pytest.mark.parametrize("sql,made", [
    ("COPY (SELECT * FROM enodes) TO 'leak.csv'", "leak.csv"),
    ("ATTACH 'other.duckdb' AS o (READ_WRITE)", "other.duckdb"),
    ("SELECT * FROM read_csv('notes.txt')", None),
    ("SELECT * FROM read_text('notes.txt')", None),
    ("SELECT * FROM glob('*')", None),
    ("INSTALL httpfs", None),
    ("SET enable_external_access = true", None),
])
def test_query_reads_the_egraph_and_nothing_else(egraph, sql, made):
    before = snapshot(egraph.parent)
    refused(["query", egraph, sql], "g.duckdb")
    assert snapshot(egraph.parent) == before
    if made:
        assert not (egraph.parent / made).exists()


def test_query_formats(egraph):
    refused(["query", egraph, "SELECT 1", "--format", "xml"], "--format xml")
    res = runner.invoke(app, ["query", str(egraph), "SELECT 1 AS a, 'x' AS b UNION ALL SELECT 2, 'y'", "--format",
                              "csv"])
    assert res.exit_code == 0 and res.stdout == "a,b\n1,x\n2,y\n"


def test_query_may_start_with_a_comment(egraph):
    res = runner.invoke(app, ["query", str(egraph), "-- how many e-nodes\nSELECT count(*) AS n FROM enodes",
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["n"] > 0


# ---------------------------------------------------------------- a valid model never fails


def test_an_unexportable_extraction_falls_back_to_the_input_model(place):
    """A sound rule turns Transpose-Softmax-Transpose into Softmax over axis 0, cheaper, but opset 11's
    Softmax cannot express that axis: ILP and greedy both pick it, neither can be written, and the
    input model is written unchanged with the reasons in the report."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Softmax", ["t"], ["s"], axis=1),
             helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0])]
    model = model_of(nodes, {"x": [4, 5]}, {"y": [4, 5]})
    model.opset_import[0].version = 11
    model.ir_version = 7
    onnx.save(model, place / "sm.onnx")
    (place / "sm.rules").write_text("softmax-cols: (Transpose :perm (1 0) (Softmax :axis 1 (Transpose :perm (1 0) "
                                    "?x))) => (Softmax :axis 0 ?x)\n")
    res = runner.invoke(app, ["optimize", "sm.onnx", "-o", "o.onnx", "--rules", "sm.rules", "--report", "r.json",
                              *FAST])
    assert res.exit_code == 0, res.output
    rep = json.loads((place / "r.json").read_text())
    assert rep["written"] == "original" and rep["extraction"]["used"] == "original"
    assert [f["candidate"] for f in rep["extraction"]["fallbacks"]] == ["ilp"]  # greedy chose the same graph
    assert "Softmax over axis 0 at opset 11" in rep["extraction"]["fallbacks"][0]["reason"]
    assert any("no extracted graph could be used" in n for n in rep["notices"])
    assert (place / "o.onnx").read_bytes() == (place / "sm.onnx").read_bytes()


def test_costs_export_replaces_only_a_cost_table(place):
    (place / "mine.csv").write_text("a,b\n1,2\n")
    before = snapshot(place)
    refused(["costs", "export", "notes.txt"], "notes.txt", "not a cost table")
    refused(["costs", "export", "mine.csv"], "mine.csv", "not a cost table")
    refused(["costs", "export", "costs.duckdb"], "cost cache")
    assert snapshot(place) == before
    for _ in range(2):  # an exported table is replaced by the next export
        res = runner.invoke(app, ["costs", "export", "t.csv"])
        assert res.exit_code == 0, res.output
    assert (place / "t.csv").read_text().startswith("key,provider,threads")


def test_a_rule_file_with_a_syntax_error_is_one_line(place):
    (place / "bad.rules").write_text("bad: (Relu ?x => ?x\n")
    refused(["optimize", "m.onnx", "-o", "o.onnx", "--rules", "bad.rules", *FAST], "bad.rules:1:15")
    refused(["batch", "m.onnx", "-o", "out", "--rules", "bad.rules", *FAST], "bad.rules:1:15")
    assert not (place / "o.onnx").exists() and not (place / "out").exists()
