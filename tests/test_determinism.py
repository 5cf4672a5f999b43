"""Saturation is deterministic: the same model, rules and limits give the same e-graph every run, at
any number of DuckDB threads, also when the node limit cuts a round short (issue 13, item 4)."""

import hashlib
from pathlib import Path

import pytest

from relsat.benchmarks import zoo
from relsat.driver.onnx_import import import_model
from relsat.driver.runner import Limits, Runner, StopReason
from relsat.programs.parser import load_rules
from relsat.programs.rulesets import load_rule_list
from relsat.relations.catalog import OPS
from relsat.relations.egraph import EGraph
from test_runner_phases import add_chain  # the Add chain x0 + x1 + ... the runner tests use

AC_ADD = list(load_rules(Path(__file__).parent.parent / "programs" / "rules" / "ac-add.rules").rules)
DEFAULT = load_rule_list(["default"])
NASRNN = zoo.build("nasrnn", small=True)
NASRNN_LIMIT = 2500  # the small NasRNN passes it inside round 1


def fingerprint(g: EGraph) -> str:
    """Every row of every e-graph table (ids, rounds and rebuild passes included)."""
    h = hashlib.sha256()
    for table in [op.table for op in OPS] + ["op_opaque", "eclass", "uf"]:
        h.update(repr(g.sql(f"SELECT * FROM {table} ORDER BY id")).encode())
    return h.hexdigest()


def run(g: EGraph, rules, limits: Limits, threads: int | None = None):
    if threads is not None:
        g.con.execute(f"SET threads = {threads}")
    report = Runner(g, rules, limits).run()
    return {"rounds": [(it.enodes, it.eclasses) for it in report.iterations], "stop": report.stop_reason,
            "rules": g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY ALL"),
            "counts": g.counts(), "tables": fingerprint(g)}


def nasrnn(threads: int | None = None):
    g = import_model(NASRNN).egraph
    before = g.counts()["enodes"]
    result = run(g, DEFAULT, Limits(iterations=10, enodes=NASRNN_LIMIT, seconds=600), threads)
    g.check_invariants()
    enodes, distinct = g.sql("SELECT count(*), count(DISTINCT id) FROM enodes")[0]
    assert enodes == distinct  # node ids drawn in blocks stay unique
    assert g.sql("SELECT currval('node_seq')")[0][0] == g.sql("SELECT max(id) FROM enodes")[0][0]
    g.close()
    return before, result




def ac_chain(threads: int | None = None, limit: int = 400):
    g = add_chain(7)
    result = run(g, AC_ADD, Limits(iterations=50, enodes=limit, seconds=600), threads)
    g.check_invariants()
    g.close()
    return result


@pytest.fixture(scope="module")
def nasrnn_runs():
    return [nasrnn() for _ in range(3)]


def test_the_node_limit_stops_nasrnn_inside_a_round(nasrnn_runs):
    before, r = nasrnn_runs[0]
    assert before < NASRNN_LIMIT
    assert r["stop"] == StopReason.NODE_LIMIT
    assert r["counts"]["enodes"] <= NASRNN_LIMIT
    assert r["rounds"][0][0] > before  # the round that met the limit still added nodes


def test_three_runs_at_a_node_limit_give_the_same_egraph(nasrnn_runs):
    first = nasrnn_runs[0][1]
    for _, other in nasrnn_runs[1:]:
        assert other["rounds"] == first["rounds"]
        assert other["rules"] == first["rules"]  # matches, applications and new nodes per rule and round
        assert other["counts"] == first["counts"]
        assert other["tables"] == first["tables"]


def test_the_egraph_does_not_depend_on_duckdb_threads(nasrnn_runs):
    one, two = nasrnn(threads=1)[1], nasrnn(threads=2)[1]
    assert one == two == nasrnn_runs[0][1]


def test_a_limit_met_after_several_rounds_is_deterministic_too():
    runs = [ac_chain(t) for t in (None, 1, 2)]
    assert runs[0]["stop"] == StopReason.NODE_LIMIT
    assert len(runs[0]["rounds"]) >= 3  # the cap falls in a later round, on nodes earlier rounds made
    assert runs[0]["counts"]["enodes"] <= 400
    assert all(r == runs[0] for r in runs[1:])
