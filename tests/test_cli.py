"""The relsat CLI end to end: optimize writes a verified model and a report; bad input writes nothing."""

import json

import onnx
import pytest
from typer.testing import CliRunner

from relsat.benchmarks import zoo
from relsat.driver.cli import app
from relsat.driver.verify import verify

runner = CliRunner()


@pytest.fixture(scope="module")
def small_resnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "resnet50.onnx"
    zoo.save(zoo.build("resnet50", small=True), path)
    return path


def test_optimize_writes_a_verified_model_report_and_database(small_resnet, tmp_path):
    out, rep, db = tmp_path / "a" / "o.onnx", tmp_path / "b" / "r.json", tmp_path / "c" / "g.duckdb"  # folders made
    before = small_resnet.read_bytes()
    res = runner.invoke(app, ["optimize", str(small_resnet), "-o", str(out), "--report", str(rep), "--db", str(db),
                              "--cost-model", "analytic", "--no-measure"])  # deterministic: measured costs and
    # the latency guard are tested in tests/test_costs_e2e.py
    assert res.exit_code == 0, res.output
    assert small_resnet.read_bytes() == before
    report = json.loads(rep.read_text())
    assert report["verification"]["ok"]
    assert report["nodes_out"] < report["nodes_in"]  # BatchNormalization folded into Conv
    optimized = onnx.load(out)
    onnx.checker.check_model(optimized, full_check=True)
    assert "BatchNormalization" not in {n.op_type for n in optimized.graph.node}
    assert verify(onnx.load(small_resnet), optimized).ok
    q = runner.invoke(app, ["query", str(db), "SELECT count(*) AS n FROM extraction", "--format", "json"])
    assert q.exit_code == 0 and json.loads(q.output)[0]["n"] > 0


@pytest.mark.parametrize("args,needle", [
    (["optimize", "missing.onnx", "-o", "OUT"], "missing.onnx"),
    (["optimize", "zoo:nope", "-o", "OUT"], "zoo:nope"),
    (["optimize", "MODEL", "-o", "OUT", "--rules", "no-such-set"], "no-such-set"),
    (["optimize", "MODEL", "-o", "OUT", "--input-shape", "nosuchinput=1,2"], "nosuchinput"),
    (["optimize", "MODEL", "-o", "OUT", "--search", "annealing"], "--search annealing"),
    (["optimize", "MODEL", "-o", "OUT", "--search", "backtrack", "--alpha", "0.9"], "--alpha 0.9"),
    (["optimize", "MODEL", "-o", "OUT", "--search", "mcts", "--budget", "0"], "--budget 0"),
    (["optimize", "MODEL", "-o", "OUT", "--memory-limit", "lots"], "--memory-limit lots"),
    (["optimize", "MODEL", "-o", "OUT", "--scheduler", "fifo"], "--scheduler fifo"),
    (["batch", "MODEL", "-o", "OUT", "--executor", "dask"], "--executor dask: expected one of local, ray"),
    (["batch", "MODEL", "-o", "OUT", "--address", "auto"], "--address auto: only with --executor ray"),
])
def test_bad_input_gives_one_line_error_and_no_output(small_resnet, tmp_path, args, needle):
    out = tmp_path / "o.onnx"
    args = [str(small_resnet) if a == "MODEL" else str(out) if a == "OUT" else a for a in args]
    res = runner.invoke(app, args)
    assert res.exit_code == 1
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)  # no traceback
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr
    assert "Traceback" not in res.output and not res.stdout
    assert not out.exists()


def test_rules_list_shows_the_shipped_sets():
    res = runner.invoke(app, ["rules", "list", "ac-add"])
    assert res.exit_code == 0
    assert "add-comm" in res.output and "add-assoc" in res.output


def test_zoo_build_prints_counts(tmp_path):
    res = runner.invoke(app, ["zoo", "build", "squeezenet", "--small", "-o", str(tmp_path)])
    assert res.exit_code == 0
    assert (tmp_path / "squeezenet.onnx").exists() and "Concat" in res.output
