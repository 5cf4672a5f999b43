"""EinNet's derivation rules as SQL in rounds (relations/tensor_rounds.py): they derive exactly the programs the
reference rules over Python objects derive (relations/tensor_derive.py), every kept program is equal to its root,
a rule written wrong is caught by the numeric check, the statements per round do not grow with the programs,
and the expression distance and beam bound the search."""

import duckdb
import numpy as np
import pytest

from relsat.relations import tensor_rounds, tensor_tables
from relsat.relations.tensor_derive import canonical, derive, equivalent
from relsat.relations.tensor_expr import evaluate
from relsat.relations.tensor_lower import lower

CASES = {
    "conv_3x3_same": ("Conv", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [("x", (1, 4, 6, 6)), ("w", (5, 4, 3, 3))]),
    "conv_5x3": ("Conv", {"kernel_shape": [5, 3]}, [("x", (2, 3, 8, 7)), ("w", (4, 3, 5, 3))]),
    "conv_strided": ("Conv", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0]},
                     [("x", (1, 2, 7, 6)), ("w", (3, 2, 3, 3))]),
    "chain_of_three": ("Einsum", {"equation": "ij,jk,kl->il"}, [("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2))]),
    "chain_of_four": ("Einsum", {"equation": "ij,jk,kl,lm->im"},
                      [("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2)), ("d", (2, 5))]),
    "softmax": ("Softmax", {"axis": -1}, [("x", (2, 3, 5))]),
    "gemm": ("Gemm", {"alpha": 0.5, "beta": 2.0, "transB": 1}, [("a", (3, 4)), ("b", (5, 4)), ("c", (5,))]),
    "matmul_bcast": ("MatMul", {}, [("a", (2, 1, 3, 4)), ("b", (3, 4, 6))]),
}


def _programs():
    return {cid: lower(op, attrs, inputs) for cid, (op, attrs, inputs) in CASES.items()}


def _con(programs):
    con = duckdb.connect()
    con.execute(tensor_tables.DDL)
    for k, p in enumerate(programs.values()):
        tensor_tables.write(con, tensor_tables.rows_of("case", k, k, p), replace=False)
    return con


def _kept(con, search, root):
    keys = con.execute("SELECT enode FROM texpr_derived WHERE status = 'kept' AND rule <> 'canonical' "
                       "AND root_op = ? AND root_enode = ?", list(root)).fetchall()
    return {canonical(p) for p in tensor_tables.load_many(con, [("derived", k) for k, in keys]).values()}


def test_sql_rounds_derive_exactly_what_the_reference_rules_derive():
    """All eight roots in one search (one set of statements per rule and round for all of them): per root, the
    kept programs are the reference derive()'s, up to canonical form, at depth 3."""
    programs = _programs()
    con = _con(programs)
    s = tensor_rounds.search(con, [("case", k) for k in range(len(programs))], rounds=3, explore=3, beam=None)
    assert len(s.rounds) == 3
    total = 0
    for k, (cid, p) in enumerate(programs.items()):
        want = set(derive(p, depth=3))
        assert _kept(con, s, ("case", k)) == want, cid
        total += len(want)
    assert total >= 60 and len(s.kept) == total  # every kept program is in the tables, once


def test_every_kept_program_computes_its_root_and_its_lineage_leads_to_it():
    programs = _programs()
    con = _con(programs)
    tensor_rounds.search(con, [("case", k) for k in range(len(programs))], rounds=2, explore=2, beam=None)
    rng = np.random.default_rng(11)
    rows = con.execute("SELECT enode, root_enode FROM texpr_derived WHERE status = 'kept'").fetchall()
    loaded = tensor_tables.load_many(con, [("derived", e) for e, _ in rows])
    for enode, root in rows:
        p = list(programs.values())[root]
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in p.inputs}
        np.testing.assert_allclose(evaluate(loaded[("derived", enode)], feeds), evaluate(p, feeds), rtol=1e-4, atol=1e-5)
    # the lineage: parents are derived programs of the round before (or the root for the canonical start)
    orphans = con.execute("""SELECT count(*) FROM texpr_derived d WHERE d.rule <> 'canonical' AND NOT EXISTS (
        SELECT 1 FROM texpr_derived p WHERE p.enode = d.parent_enode AND d.parent_op = 'derived'
        AND p.round = d.round - 1 AND p.status = 'kept')""").fetchone()[0]
    assert orphans == 0
    # duplicates and refuted programs leave no rows behind; the tables hold kept (and unchecked) programs only
    stored = {e for e, in con.execute("SELECT enode FROM texpr_program WHERE op = 'derived'").fetchall()}
    assert stored == {e for e, in con.execute("SELECT enode FROM texpr_derived WHERE status IN ('kept', 'unchecked')")
                      .fetchall()}


def test_a_rule_written_wrong_is_refuted_by_the_numeric_check(monkeypatch):
    """split-summation with the index T is read at shifted by one: every program it writes is refuted, none kept."""
    wrong = [sql.replace('SELECT \'derived\', c.nid, c.k + 1, 0, s.q, i."const",',
                         'SELECT \'derived\', c.nid, c.k + 1, 0, s.q, i."const" + 1,')
             for sql in tensor_rounds.SPLIT_SUMMATION]
    assert wrong != tensor_rounds.SPLIT_SUMMATION
    monkeypatch.setitem(tensor_rounds.STATEMENTS, "split-summation", wrong)
    p = lower("Einsum", {"equation": "ij,jk,kl->il"}, [("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2))])
    con = _con({"chain": p})
    s = tensor_rounds.search(con, [("case", 0)], rounds=1, rules=("split-summation",))
    assert s.rounds[0].written["split-summation"] == 2
    assert s.rounds[0].refuted == 2 and s.rounds[0].kept == 0 and s.kept == []
    # the reference says what the right rule gives
    assert len(derive(p, depth=1)) == 2


def test_statements_per_round_do_not_grow_with_the_programs():
    programs = _programs()
    one = tensor_rounds.search(_con({"c": programs["conv_3x3_same"]}), [("case", 0)], rounds=2, explore=2, beam=None)
    con = _con(programs)
    many = tensor_rounds.search(con, [("case", k) for k in range(len(programs))], rounds=2, explore=2, beam=None)
    assert [r.statements for r in one.rounds] == [r.statements for r in many.rounds]
    assert sum(sum(r.written.values()) for r in many.rounds) > 5 * sum(sum(r.written.values()) for r in one.rounds)


def test_distance_and_beam_bound_the_search():
    """The distance counts accesses still read through a non-plain index in a computing step: a Conv is 1 (its
    shifted input), a MatMul 0; the beam keeps at most that many programs per root in each frontier, nearest
    first, and converging rounds keep none farther than its parent."""
    programs = _programs()
    con = _con(programs)
    s = tensor_rounds.search(con, [("case", k) for k in range(len(programs))], rounds=3, explore=1, beam=2)
    assert all(r.frontier <= 2 * len(programs) for r in s.rounds)
    con2 = _con({"mm": lower("MatMul", {}, [("a", (3, 4)), ("b", (4, 5))]), "conv": programs["conv_3x3_same"]})
    tensor_rounds.search(con2, [("case", 0), ("case", 1)], rounds=1)
    assert dict(con2.execute("SELECT root_enode, distance FROM texpr_derived WHERE rule = 'canonical'")
                .fetchall()) == {0: 0, 1: 1}
    # unbounded, the same search keeps more
    wide = tensor_rounds.search(_con(programs), [("case", k) for k in range(len(programs))], rounds=3, explore=1,
                                beam=None)
    assert len(wide.kept) > len(s.kept)


def test_the_egraph_s_enodes_derive_in_one_search():
    """Every lowered e-node of a zoo model is a root: one search over all of them, its kept programs equal to
    their roots (checked inside the search), queryable beside the e-graph."""
    from relsat.driver.boundary import zoo
    from relsat.driver.boundary.onnx_import import import_model

    con = import_model(zoo.build("squeezenet", small=True)).egraph.con
    tensor_tables.lower_egraph(con)
    roots = con.execute("SELECT op, enode FROM texpr_program").fetchall()
    s = tensor_rounds.search(con, roots, rounds=2, beam=2, check_elements=2_000_000)
    assert s.rounds[0].frontier == len(roots) > 10
    assert sum(r.kept for r in s.rounds) > 0
    by_rule = dict(con.execute("SELECT rule, count(*) FROM texpr_derived WHERE status = 'kept' GROUP BY rule").fetchall())
    assert by_rule.get("split-summation", 0) > 0  # the Convs' channel sums split out (the motivating example)
    # a kept program's e-class is its root's
    bad = con.execute("""SELECT count(*) FROM texpr_derived d JOIN texpr_program p ON p.op = 'derived' AND p.enode = d.enode
        JOIN texpr_program r ON r.op = d.root_op AND r.enode = d.root_enode WHERE p.eclass <> r.eclass""").fetchone()[0]
    assert bad == 0


def test_derived_forms_of_a_biased_conv_match_onnx_and_run_equal():
    """A Conv with bias lowers to the convolution and an Add of the bias over axis 1 (not right-aligned: the
    matcher reshapes it to [C, 1, 1]); the forms the rounds derive from a 1 x 1 and a 3 x 3 Conv match ONNX
    operators (Einsum over channels, shifted slices) and run equal to the Conv under ONNX Runtime."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from relsat.relations.tensor_match import NoMatch, match

    rng = np.random.default_rng(5)
    for k, pads in ((1, [0, 0, 0, 0]), (3, [1, 1, 1, 1])):
        shapes = [("x", (1, 4, 6, 6)), ("w", (3, 4, k, k)), ("b", (3,))]
        attrs = {"kernel_shape": [k, k], "pads": pads}
        con = _con({"conv": lower("Conv", attrs, shapes)})
        s = tensor_rounds.search(con, [("case", 0)], rounds=2, beam=None)
        x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
        w = rng.standard_normal((3, 4, k, k)).astype(np.float32)
        b = rng.standard_normal(3).astype(np.float32)
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]

        def run(nodes, extra=()):
            g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 6, 6))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [*inits, *extra])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
            return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

        want = run([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)])
        matched = 0
        for q in tensor_tables.load_many(con, [("derived", e) for e in s.kept]).values():
            try:
                nodes, extra = match(q, "y", {"w": w, "b": b})
            except NoMatch:
                continue
            if {n.op_type for n in nodes} <= {"Conv", "Identity"}:
                continue
            matched += 1
            assert "Einsum" in {n.op_type for n in nodes}
            np.testing.assert_allclose(run(nodes, extra), want, rtol=1e-4, atol=1e-5)
        assert matched >= 1, k
