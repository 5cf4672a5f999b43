"""Differential fuzzing (issue 26): random valid models through ``optimize``, compared under ONNX Runtime.

The generator and the campaign are ``relsat.benchmarks.fuzz``; the long campaign's figures are in
benchmarks/FUZZ_RESULTS.md.  Here: the generator's models are valid, varied and deterministic, a short
campaign (every shipped rule set by turns, the searches on some models) has no crash and no wrong
output, and (``-m slow``) a longer one.
"""

from collections import Counter

import numpy as np
import onnx
import pytest

from relsat.benchmarks import fuzz

SHORT_MODELS = 6  # every rule set once, the searches on the last: ~24 s on a 2-core machine (12 took ~33 s)
# Generator features a known, not yet fixed bug trips on (each has an xfail test in test_fuzz_regressions.py);
# none today (exposed initializers were one until test_initializer_listed_as_input_stays_an_input passed).
AVOID = ()


def _runs(model):
    sess = fuzz._session(model)
    return sess.run(None, fuzz.feeds(model, 1, batch=3))


def test_generator_models_are_valid_varied_and_deterministic():
    models = [fuzz.generate(s) for s in range(60)]
    ops, opsets, dynamic = Counter(), Counter(), 0
    for m in models:
        onnx.checker.check_model(m, full_check=True)
        assert m.ir_version == 10
        outs = _runs(m)
        assert outs and all(o.dtype == np.float32 for o in outs)
        assert 1 <= sum(n.op_type != "Constant" for n in m.graph.node) <= 40  # ~3-25, a pattern may overshoot
        ops.update(n.op_type for n in m.graph.node)
        info = fuzz.model_info(m)
        opsets[info["opset"]] += 1
        dynamic += info["dynamic"]
    assert len(ops) >= 20, ops  # many catalog operators, not a handful
    for op in ("Conv", "MatMul", "Gemm", "Add", "Mul", "Transpose", "Concat", "Clip", "Softmax"):
        assert ops[op] > 0, (op, ops)
    assert set(opsets) >= {13, 17} and dynamic >= 5
    assert fuzz.generate(12345).SerializeToString() == fuzz.generate(12345).SerializeToString()
    assert fuzz.generate(1).SerializeToString() != fuzz.generate(2).SerializeToString()


def test_compare_catches_a_wrong_model():
    m = fuzz.generate(3)
    assert fuzz.compare(m, m, 0) is None
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    out = bad.graph.output[0].name
    node = next(n for n in bad.graph.node if out in n.output)
    node.output[list(node.output).index(out)] = out + "_pre"
    bad.graph.node.append(onnx.helper.make_node("Neg", [out + "_pre"], [out]))
    assert fuzz.compare(m, bad, 0) is not None


def test_reason_masks_names_and_numbers():
    assert fuzz.reason_of("<model>: node 'n12' (Conv): 3 dims") == fuzz.reason_of("<model>: node 'n7' (Conv): 4 dims")


def _check(records, minimum):
    s = fuzz.summarize(records)
    fuzz.print_summary(s)
    assert s["models"] >= minimum
    rs = s["runs_by_status"]
    bad = [(rec["index"], rec["seed"], r["settings"], r.get("detail") or r.get("message") or rec.get("worker"))
           for rec in records for r in rec.get("runs", [{"status": rec["status"], "settings": None}])
           if r["status"] in ("crash", "wrong")]
    assert rs["crash"] == 0 and rs["wrong"] == 0 and not bad, bad
    assert rs["ok"] >= s["runs"] // 2  # mostly optimized or passed through, not refused
    assert {r["settings"]["rules"][0] for rec in records for r in rec["runs"]} == set(fuzz.RULE_SETS)
    return s


def test_short_campaign_no_crash_no_wrong(tmp_path):
    records = fuzz.campaign(SHORT_MODELS, 26, tmp_path / "fuzz.jsonl", isolate=False, per_model="one",
                            search_every=SHORT_MODELS, max_nodes=10, avoid=AVOID)
    s = _check(records, SHORT_MODELS)
    assert len((tmp_path / "fuzz.jsonl").read_text().splitlines()) == SHORT_MODELS
    assert {r["settings"].get("search") for rec in records for r in rec["runs"]} >= {"mcts", "backtrack"}
    assert s["written_optimized"] > 0


def test_a_campaign_runs_the_measured_choice_on_every_nth_model(tmp_path, monkeypatch):
    """``measure_every``: those models also go through the measured choice (profiles, timings against the input
    model, verification), with a cost cache of the campaign's own, and what they wrote matches the original."""
    user_cache = tmp_path / "user-costs.duckdb"
    monkeypatch.setenv("RELSAT_COST_CACHE", str(user_cache))  # where optimize caches costs unless told otherwise
    records = fuzz.campaign(SHORT_MODELS, 31, tmp_path / "fuzz.jsonl", isolate=False, per_model="one",
                            search_every=0, max_nodes=10, avoid=AVOID, measure_every=3)
    _check(records, SHORT_MODELS)
    measured = [(rec["index"], r) for rec in records for r in rec["runs"] if r["settings"].get("measured")]
    assert [i for i, _ in measured] == [2, 5]
    assert all(r["timed"] >= 1 and r["verdict"] for _, r in measured)  # candidates were timed
    assert not user_cache.exists()  # the campaign's own cache, not the user's
    assert {r["settings"]["rules"][0] for _, r in measured} == {fuzz.RULE_SETS[0], fuzz.RULE_SETS[1]}


@pytest.mark.slow
def test_long_campaign_no_crash_no_wrong(tmp_path):
    records = fuzz.campaign(300, 27, tmp_path / "fuzz.jsonl", jobs=2, timeout=300, per_model="one", search_every=10,
                            avoid=AVOID)
    _check(records, 300)
