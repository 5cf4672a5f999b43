"""The optimize pipeline as typed phases (relsat.driver.app.phases): each phase returns its result, and one step,
``decide``, says what is written: the extraction's fallbacks, a failed verification, the latency guard and
the in-context measured choice all reach it as results."""

import inspect

import onnx
import pytest
from onnx import TensorProto, helper

from relsat.driver.app import optimize as pipeline
from relsat.driver.app import phases
from relsat.driver.errors import RelsatError
from relsat.driver.app.optimize import optimize
from relsat.driver.app.phases import Chosen, Exported, Imported, Timed, Verified, decide
from relsat.driver.boundary.verify import VerifyResult

F = TensorProto.FLOAT


def _tiny() -> onnx.ModelProto:
    """Two transposes that cancel, then a Relu: the default rules and analytic costs write one Relu."""
    return helper.make_model(helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
         helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]), helper.make_node("Relu", ["u"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F, [4, 8])], [helper.make_tensor_value_info("y", F, [4, 8])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


INPUT, OPTIMIZED = _tiny(), helper.make_model(helper.make_graph([], "optimized", [], []))
IMPORTED = Imported("in.onnx", INPUT, graph=None, roots=[], binding=None, input_sets=[])
OK = VerifyResult(True, 0.0, 0.0, {}, "ok")
FAILED = VerifyResult(False, 1.0, 0.0, {}, "outputs differ")


def _exported(model=OPTIMIZED, fallbacks=(), notices=()) -> Exported:
    return Exported("ilp" if model is not None else "original", None, model, None, list(fallbacks),
                    {"nodes": 1, "ops": {"Relu": 1}}, 1.0, tuple(notices))


def _chosen(picked: bool) -> Chosen:
    class Picked:
        model, label = OPTIMIZED, "round 1"

    return Chosen(None, Picked() if picked else None, "round 1" if picked else "original", OK, {"kept": "x"}, [],
                  {"nodes": 1, "ops": {}}, 2.0, 1.5, ("chosen",))


# ---------------------------------------------------------------- decide: the one step
def test_decide_writes_the_verified_extraction():
    out = decide(IMPORTED, _exported(notices=("exported",)), Verified(OK, ("verified",)))
    assert (out.written, out.model, out.label, out.check) == ("optimized", OPTIMIZED, "ilp", OK)
    assert out.notices == ("exported", "verified") and out.latency is None and out.cost_before is None


def test_decide_writes_the_input_when_the_extraction_kept_the_original_graph():
    out = decide(IMPORTED, _exported(model=None), Verified(OK))
    assert (out.written, out.model) == ("original", INPUT)
    assert out.notices == ("the extraction kept the original graph: the input model is written unchanged",)


def test_decide_writes_the_input_after_fallbacks_without_a_second_notice():
    fell = [{"candidate": "ilp", "reason": "x"}]
    out = decide(IMPORTED, _exported(model=None, fallbacks=fell, notices=("no extracted graph could be used",)),
                 Verified(OK))
    assert (out.written, out.model, out.fallbacks) == ("original", INPUT, fell)
    assert out.notices == ("no extracted graph could be used",)


def test_decide_writes_nothing_when_verification_fails():
    with pytest.raises(RelsatError, match=r"^in.onnx: verification failed, no model written: outputs differ; "
                                          r"the e-graph is in e.duckdb$"):
        decide(IMPORTED, _exported(), Verified(FAILED), db="e.duckdb")
    with pytest.raises(RelsatError, match=r"no model written: outputs differ$"):
        decide(IMPORTED, _exported(), Verified(FAILED))


def test_decide_writes_the_input_when_the_guard_finds_it_not_faster():
    slow = Timed({"kept": "original"}, False, ("not faster",))
    out = decide(IMPORTED, _exported(notices=("exported",)), Verified(OK, ("verified",)), slow)
    assert (out.written, out.model, out.latency) == ("original", INPUT, {"kept": "original"})
    assert out.notices == ("exported", "verified", "not faster")
    out = decide(IMPORTED, _exported(), Verified(OK), Timed({"kept": "optimized"}, True))
    assert (out.written, out.model, out.latency) == ("optimized", OPTIMIZED, {"kept": "optimized"})


def test_decide_follows_the_measured_choice():
    out = decide(IMPORTED, _chosen(True))
    assert (out.written, out.model, out.label, out.cost_before, out.cost_after) == (
        "optimized", OPTIMIZED, "round 1", 2.0, 1.5)
    assert out.latency == {"kept": "x"} and out.notices == ("chosen",)
    out = decide(IMPORTED, _chosen(False))
    assert (out.written, out.model, out.label) == ("original", INPUT, "original")


def test_results_are_frozen():
    with pytest.raises(AttributeError):
        _exported().model = None


# ---------------------------------------------------------------- the pipeline, phase by phase
def _spy(monkeypatch) -> list:
    """Record every phase function's name and result type, in the order they run."""
    seen = []
    for name in ("prepare", "load", "read", "check_overhead", "derive", "saturate", "profile", "extract",
                 "search_candidates",
                 "choose", "export", "verify_export", "guard", "decide"):
        real = getattr(phases, name)

        def wrapped(*a, _real=real, _name=name, **k):
            out = _real(*a, **k)
            seen.append((_name, type(out).__name__))
            return out

        monkeypatch.setattr(phases, name, wrapped)
    return seen


def test_phases_run_in_order_and_return_typed_results(monkeypatch, tmp_path):
    seen = _spy(monkeypatch)
    res = optimize(_tiny(), cost_model="analytic", measure=False, output=tmp_path / "o.onnx")
    assert seen == [("prepare", "Prepared"), ("load", "Loaded"), ("read", "Imported"),
                    ("check_overhead", "NoneType"), ("derive", "Derived"), ("saturate", "Saturated"),
                    ("profile", "Priced"),
                    ("extract", "Extracted"), ("export", "Exported"), ("verify_export", "Verified"),
                    ("decide", "Outcome")]
    assert list(res.report.phases_s) == ["import", "profile", "derive", "saturate", "extract", "export", "verify"]
    assert res.report.written == "optimized" and [n.op_type for n in res.model.graph.node] == ["Relu"]
    assert [n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node] == ["Relu"]


def test_a_failed_guard_writes_the_input_model(monkeypatch, tmp_path):
    """The guard's result reaches ``decide``: the input model is written, with the guard's report."""
    monkeypatch.setattr(phases, "guard", lambda run, imported, optimized: Timed({"kept": "original"}, False,
                                                                               ("not faster (test)",)))
    res = optimize(_tiny(), cost_model="analytic", measure=True, output=tmp_path / "o.onnx", db=tmp_path / "e.duckdb",
                   keep_egraph=True)
    try:
        r = res.report
        assert (r.written, r.latency, r.nodes_out, r.extracted["nodes"]) == ("original", {"kept": "original"}, 3, 1)
        assert r.notices[-1] == "not faster (test)" and "latency" in r.phases_s
        assert res.model is not None and len(onnx.load(tmp_path / "o.onnx").graph.node) == 3
        assert res.egraph.sql("SELECT value FROM meta WHERE key = 'written'") == [("original",)]
    finally:
        res.egraph.close()


def test_a_failed_verification_writes_nothing(monkeypatch, tmp_path):
    """A failed verification reaches ``decide`` too: an error, no model written, the guard not run, the
    complete e-graph kept in ``db``."""
    monkeypatch.setattr(phases, "verify", lambda *a, **k: VerifyResult(False, 1.0, 0.0, {}, "made to differ"))
    monkeypatch.setattr(phases, "guard", lambda *a: pytest.fail("the guard timed an unverified model"))
    out, db = tmp_path / "o.onnx", tmp_path / "e.duckdb"
    with pytest.raises(RelsatError, match="verification failed, no model written: made to differ; the e-graph is in"):
        optimize(_tiny(), cost_model="analytic", measure=True, output=out, db=db)
    assert not out.exists() and db.exists()


def test_the_pipeline_keeps_no_state_outside_its_results():
    """No class holds the pipeline's state: the phases are functions and the run is one function."""
    assert not [n for n, v in vars(pipeline).items() if inspect.isclass(v) and v.__module__ == pipeline.__name__
                and n not in ("Report", "OptimizeResult", "_Timer")]
    src = inspect.getsource(pipeline._pipeline)
    assert src.count("phases.decide(") == 2 and "written =" not in src
