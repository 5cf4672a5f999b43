"""The relsat CLI end to end: optimize writes a verified model and a report; bad input writes nothing."""

import json

import onnx
import pytest
from typer.testing import CliRunner

from relsat.driver.boundary import zoo
from relsat.driver.app.cli import app
from relsat.driver.boundary.verify import verify

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


# ------------------------------------------------------------------ the Options flags, declared once

API_ONLY = {"multi_rounds", "guard_threshold", "check_rules"}  # Options fields that are no flag (Python API only)


def _params(command: str) -> dict:
    """The click parameters of ``relsat COMMAND`` (the real app), by flag."""
    import typer

    return {o: p for p in typer.main.get_command(app).commands[command].params for o in p.opts}


@pytest.mark.parametrize("command", ["optimize", "batch"])
def test_every_options_field_is_a_flag_with_its_default_and_help(command):
    import dataclasses

    from relsat.driver.options import DEFAULTS, Options

    params = _params(command)
    declared = set()
    for f in dataclasses.fields(Options):
        fl = f.metadata.get("flag")
        if f.name in API_ONLY:
            assert fl is None, f.name
            continue
        assert fl is not None, f"Options.{f.name} declares no flag"
        name = fl.name or "--" + f.name.replace("_", "-")
        declared.add(name)
        if command == "batch" and fl.batch is False:  # --inputs: optimize only
            assert name not in params
            continue
        p = params[name]
        assert p.name == f.name and p.opts == [name]
        if command == "batch" and f.name == "threads":  # batch's own: None shares the cores among the workers
            assert p.default is None and "cores // jobs" in p.help
            continue
        assert p.help == fl.text() and fl.help in p.help
        # the default read as the field would be: DEFAULTS' value
        assert getattr(Options(**{f.name: fl.read(p.default)}), f.name) == getattr(DEFAULTS, f.name), name
    own = {"optimize": {"model", "-o", "--output", "--db", "--report", "-q", "--quiet", "-v", "--verbose", "--help"},
           "batch": {"models", "-o", "--output", "-j", "--jobs", "--model-timeout", "--keep-db", "--skip-failed",
                     "--force", "--executor", "--address", "--connect-timeout", "--help"}}[command]
    assert set(params) - own <= declared  # every other option of the command comes from an Options field


def test_the_default_node_limit_grows_with_the_imported_graph():
    """No --node-limit: 2,000 e-nodes or 4x the imported e-graph's, whichever is more; a given limit is the limit."""
    from relsat.driver.options import DEFAULTS

    assert DEFAULTS.node_limit is None and DEFAULTS.check() is DEFAULTS
    assert DEFAULTS.node_limit_for(120) == 2000 and DEFAULTS.node_limit_for(817) == 3268
    assert DEFAULTS.replace(node_limit=500).node_limit_for(817) == 500


def test_check_names_the_flags_of_the_metadata():
    from relsat.driver.errors import RelsatError
    from relsat.driver.options import DEFAULTS, command_flags, flag_name, parse_shapes

    assert flag_name("node_limit") == "--node-limit" and flag_name("input_shapes") == "--input-shape"
    for f in command_flags("optimize"):
        if f.choices:
            with pytest.raises(RelsatError, match=f"^{f.name} nope: expected "):
                DEFAULTS.replace(**{f.attr: "nope"}).check()
    with pytest.raises(RelsatError, match="^--node-limit -1: "):
        DEFAULTS.replace(node_limit=-1).check()
    with pytest.raises(RelsatError, match="^--input-shape 'x': "):
        parse_shapes(["x"])
    with pytest.raises(RelsatError, match="^--memory-limit lots: "):
        DEFAULTS.replace(memory_limit="lots").check()


def _captured(monkeypatch, target: str):
    """Replace ``target`` (the function a command calls with its Options) by one that records the
    options it is given and stops the command there."""
    from relsat.driver.errors import RelsatError

    seen = {}

    def fake(*args, options=None, **kw):
        seen["options"] = options if options is not None else args[1]
        raise RelsatError("stopped here")

    monkeypatch.setattr(target, fake)
    return seen


def test_optimize_flags_become_options(small_resnet, tmp_path, monkeypatch):
    from relsat.driver.options import DEFAULTS

    seen = _captured(monkeypatch, "relsat.driver.app.optimize.optimize")
    res = runner.invoke(app, ["optimize", str(small_resnet), "-o", str(tmp_path / "o.onnx"), "--rules", "default",
                              "--rules", "ac-add", "--input-shape", "input=1,16,16,16", "--no-measure",
                              "--memory-limit", "1GB", "--node-limit", "77", "--search", "mcts", "--budget", "5"])
    assert res.exit_code == 1 and "stopped here" in res.stderr, res.output
    o = seen["options"]
    assert o.rules == ("default", "ac-add") and o.input_shapes == {"input": [1, 16, 16, 16]}
    assert o.measure is False and o.memory_limit == "1GB" and o.node_limit == 77 and o.budget == 5
    d = DEFAULTS
    assert o.replace(rules=d.rules, input_shapes=d.input_shapes, measure=d.measure, memory_limit=d.memory_limit,
                     node_limit=d.node_limit, search=d.search, budget=d.budget) == DEFAULTS


@pytest.mark.parametrize("threads", [None, "3"])
def test_batch_flags_become_options_and_share_the_cores(small_resnet, tmp_path, monkeypatch, threads):
    from relsat.driver.app.batch import worker_threads
    from relsat.driver.options import DEFAULTS

    seen = _captured(monkeypatch, "relsat.driver.app.batch.run_batch")
    res = runner.invoke(app, ["batch", str(small_resnet.parent), "-o", str(tmp_path / "out"), "-j", "2",
                              "--cost-model", "analytic", *(["--threads", threads] if threads else [])])
    assert res.exit_code == 1 and "stopped here" in res.stderr, res.output
    o = seen["options"]
    assert o.threads == (worker_threads(2) if threads is None else 3)
    assert o.replace(cost_model=DEFAULTS.cost_model, threads=DEFAULTS.threads) == DEFAULTS
