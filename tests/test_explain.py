"""Why each rewrite happened (``relsat explain``, the ``explain_*`` tables and the ``explanations`` view).

The main test replays recorded chains: for zoo models that relsat rewrites, each written node that is not
in the input graph has a chain of rule applications (rule, round, matched e-nodes and e-classes); applying
exactly those applications, in round order, to a fresh import of the input (the compiled rules' own SQL, one
match row each) must find each application's left side at its recorded bindings and must produce the written
node: same op and attributes, inputs that are the same input values or the same derived values.
"""

from __future__ import annotations

import json

import duckdb
import pytest
import typer
from typer.testing import CliRunner

from relsat.driver.app.explain import explain, explain_text, open_explanations
from relsat.driver.app.optimize import optimize
from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.errors import RelsatError
from relsat.programs.compiler import BUILD_ROW_ID, MATCHES, SNAPSHOT_ALL, compile_rule
from relsat.programs.rulesets import load_rule_list
from relsat.relations.catalog import BY_TYPE
from relsat.relations.egraph import EGraph
from relsat.relations.schema import key_columns, literal, q

# (zoo name, small): rewritten by the default rules; bert_encoder's chains are two applications long;
# mobilenet_v2 (37 batch-norm folds of nine terms each to replay: half a minute) runs with the slow tests
MODELS = [("mobilenet_v2", True), ("bert_encoder", True), ("nasrnn", True)]


class _Models(dict):
    """Each model optimized once, when first asked for, with --db (analytic costs, no timing): name ->
    (model, e-graph file)."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name):
        d = self.root.mktemp(name)
        model = zoo.build(name, small=dict(MODELS)[name])
        res = optimize(model, cost_model="analytic", measure=False, candidates=0, db=d / "e.duckdb",
                       output=d / "o.onnx")
        assert res.report["written"] == "optimized", name
        self[name] = (model, d / "e.duckdb")
        return self[name]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _Models(tmp_path_factory)


class _Saved:
    """The saved e-graph, read only: its final canonical e-classes and its op tables."""

    def __init__(self, db) -> None:
        self.con = duckdb.connect(str(db), read_only=True)
        self.uf = dict(self.con.execute("SELECT id, root FROM uf").fetchall())

    def find(self, c: int) -> int:
        return self.uf.get(c, c)

    def node(self, nid: int):
        op, cls, kids, attrs = self.con.execute("SELECT op, eclass, children, attrs FROM enodes WHERE id = ?",
                                                [nid]).fetchall()[0]
        return op, cls, list(kids), json.loads(attrs)


class _Replay:
    """A fresh import of the input and the chains applied to it; ``cmap``: the saved e-graph's (final,
    canonical) e-classes -> this one's e-classes, for the imported ones and every term the chains build."""

    def __init__(self, model, saved: _Saved, rules: dict) -> None:
        self.g, self.saved, self.rules = EGraph(), saved, rules
        import_model(model, egraph=self.g)
        imported = [r[0] for r in saved.con.execute(
            "SELECT id FROM eclass WHERE id NOT IN (SELECT eclass FROM explain_nodes WHERE fresh) "
            "UNION SELECT id FROM uf WHERE id NOT IN (SELECT eclass FROM explain_nodes WHERE fresh)").fetchall()]
        self.cmap: dict[int, int] = {}
        for k in sorted(imported):  # the least imported id of a merged e-class first
            self.cmap.setdefault(saved.find(k), k)
        self.imported = set(imported)  # (a fresh import gives them the same ids)
        self.done: set = set()

    def rfind(self, c: int) -> int:
        return int(self.g.find([c])[0])

    def back(self) -> dict:
        """This e-graph's canonical e-classes -> the saved e-graph's."""
        keys = list(self.cmap)
        return dict(zip(self.g.find([self.cmap[s] for s in keys]).tolist(), keys))

    def mapped(self, saved_class: int) -> int:
        if saved_class in self.imported:  # itself, as the replay's unions have merged it so far: an imported
            return self.rfind(saved_class)  # e-class that later unions merged is not yet merged here
        s = self.saved.find(saved_class)
        assert s in self.cmap, f"saved e-class {saved_class} is neither imported nor built by the chain"
        return self.rfind(self.cmap[s])

    def apply(self, app) -> None:
        """One recorded application: its left side must match here at its bindings; its right side is
        built, and every built term's e-class is paired with the saved e-class the same term is in."""
        key = (app.rule, app.round, app.mid)
        if key in self.done:
            return
        self.done.add(key)
        c = compile_rule(self.rules[app.rule])
        con = self.g.con
        cols = [f"{int(app.mid)} AS mid"]
        cols += [f"{self.mapped(v)} AS {q('v_' + k[1:])}" for k, v in app.classes.items()]
        cols += [f"{literal(v)} AS {q('v_' + k[1:])}" for k, v in app.bindings.items()]
        cols += [f"{self.mapped(r)} AS root{i}" for i, r in enumerate(app.roots)]
        con.execute(f"CREATE OR REPLACE TEMP TABLE {MATCHES} AS SELECT {', '.join(cols)}")
        found = con.execute(c.witness(f"SELECT mid FROM {MATCHES}", SNAPSHOT_ALL)).fetchall()
        assert found, f"{app.rule} (round {app.round}) does not match the replay at its recorded bindings"
        assert list(found[0][2]) == list(app.ops)
        back = self.back()  # (no rebuild inside an application: canonical ids stay)
        for b in c.builds:
            op = BY_TYPE[b.op]
            self.g.insert_from(op, b.source, ts=app.round, result=b.name, target=b.target, rid=BUILD_ROW_ID)
            rows = con.execute(f"SELECT * FROM {b.name}").fetchall()
            names = [d[0] for d in con.description]
            assert len(rows) == 1, f"{app.rule}: build {b.name} ({b.op}) made no node in the replay"
            row = dict(zip(names, rows[0]))
            kids = set(op.child_columns)
            where, params = [], []
            for k in key_columns(op):
                v = row[k]
                if k in kids:
                    v = [self.saved.find(back[self.rfind(x)]) for x in v] if isinstance(v, list) else (
                        -1 if v == -1 else self.saved.find(back[self.rfind(v)]))
                where.append(f"{q(k)} IS NOT DISTINCT FROM ?")
                params.append(v)
            hit = self.saved.con.execute(f"SELECT out FROM {op.table} WHERE {' AND '.join(where)}", params).fetchall()
            assert hit, f"{app.rule}: the replay built a {b.op} the saved e-graph does not hold"
            self.cmap.setdefault(self.saved.find(hit[0][0]), row["out"])
            back.setdefault(row["out"], self.saved.find(hit[0][0]))
        for u in c.unions:
            self.g.union_from(u)
        for b in c.builds:
            con.execute(f"DROP TABLE IF EXISTS {b.name}")

    def holds(self, nid: int) -> bool:
        """Whether the saved e-node ``nid`` is here: a node of its op with its attributes over the e-classes
        its children's e-classes became."""
        op_type, _, kids, attrs = self.saved.node(nid)
        mapped = [self.mapped(k) if k != -1 else -1 for k in kids]
        assert not self.g.sql("SELECT count(*) FROM pending")[0][0]
        rows = self.g.con.execute("SELECT * FROM enodes WHERE op = ?", [op_type]).fetchall()
        names = [d[0] for d in self.g.con.description]
        for r in map(lambda r: dict(zip(names, r)), rows):
            if list(r["children"]) == mapped and json.loads(r["attrs"]) == attrs:  # (canonical after rebuild)
                return True
        return False


def _replay(model, db, nodes, rules) -> _Replay:
    """Replay the chains of ``nodes`` (saved e-node ids), together, on a fresh import; rebuilt per round."""
    saved = _Saved(db)
    ex = open_explanations(db)
    rp = _Replay(model, saved, rules)
    apps = sorted({(a.round, a.rule, a.mid): a for n in nodes for a in ex.chain(n)}.values(),
                  key=lambda a: (a.round, a.rule, a.mid))
    last = None
    for a in apps:
        if last is not None and a.round != last:
            rp.g.rebuild(ts=last)
        rp.apply(a)
        last = a.round
    rp.g.rebuild(ts=last)
    return rp


# mobilenet_v2 and nasrnn (~5 s each) with -m slow: bert_encoder replays every chain by default (and its saved
# e-graph is the one the tests below read)
@pytest.mark.parametrize("name", [pytest.param("mobilenet_v2", marks=pytest.mark.slow), "bert_encoder",
                                  pytest.param("nasrnn", marks=pytest.mark.slow)])
def test_replaying_each_chain_on_the_input_reproduces_the_written_node(saved, name):
    model, db = saved[name]
    rules = {r.name: r for r in load_rule_list(["default"])}
    ex = open_explanations(db)
    derived = [(w[0], w[3]) for w in ex.written if ex.derived(w[3])]
    assert derived, f"{name}: no written node is derived (the model is no longer rewritten)"
    for wname, nid in derived[:2]:  # each chain alone, on its own fresh import
        rp = _replay(model, db, [nid], rules)
        assert rp.holds(nid), f"{name}: replaying the chain of {wname} does not give {wname}'s node"
    rp = _replay(model, db, [n for _, n in derived], rules)  # every chain together: every written node
    for wname, nid in derived:
        assert rp.holds(nid), f"{name}: the replayed chains do not give {wname}'s node"


def test_a_wrong_or_cut_chain_does_not_replay(saved):
    """The replay can fail: an application with its bindings swapped does not match the input, and a
    two-step chain without its first step does not match (the e-node it needs is not there)."""
    from dataclasses import replace

    rules = {r.name: r for r in load_rule_list(["default"])}
    model, db = saved["bert_encoder"]
    ex = open_explanations(db)
    app = ex.chain(next(w[3] for w in ex.written if ex.derived(w[3])))[-1]
    swapped = dict(zip(app.classes, list(app.classes.values())[::-1]))
    assert swapped != app.classes
    with pytest.raises(AssertionError, match="does not match the replay"):
        _Replay(model, _Saved(db), rules).apply(replace(app, classes=swapped))
    model, db = saved["bert_encoder"]
    ex = open_explanations(db)
    chain = next(c for c in (ex.chain(w[3]) for w in ex.written if ex.derived(w[3])) if len(c) == 2)
    assert [a.rule for a in chain] == ["gelu-erf", "gelu-bias"]
    with pytest.raises(AssertionError, match="gelu-bias .* does not match the replay"):
        _Replay(model, _Saved(db), rules).apply(chain[1])


def test_explanations_view_and_written_nodes_are_queryable(saved):
    _, db = saved["bert_encoder"]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT w.name, x.rule, x.round, x.matched_ops, x.classes FROM written_nodes w "
            "JOIN explanations x ON x.node = w.node ORDER BY w.name").fetchall()
        assert rows and all(r[1] and r[2] >= 1 and r[3] for r in rows)
        # the Gelu after a bias as BiasGelu, the Add before a LayerNormalization as Sum
        matched = {"gelu-bias": ["Gelu", "Add"], "layernorm-add-as-sum": ["LayerNormalization", "Add"]}
        assert {r[1] for r in rows} == set(matched) and all(r[3] == matched[r[1]] for r in rows), rows
        # every e-node a rule added has its match; every match a rule and round of rule_stats
        assert con.execute("SELECT count(*) FROM explanations WHERE matched_nodes IS NULL").fetchall()[0][0] == 0
        assert con.execute("SELECT count(*) FROM explain_matches m ANTI JOIN rule_stats s USING (rule, round)"
                           ).fetchall()[0][0] == 0
        # the e-nodes a rule added are exactly the e-nodes newer than the import
        added, newer = con.execute(
            "SELECT (SELECT count(*) FROM explain_nodes), (SELECT count(*) FROM enodes WHERE id > "
            "(SELECT max(id) FROM enodes WHERE id NOT IN (SELECT id FROM explain_nodes)))").fetchall()[0]
        assert added == newer > 0


def test_explain_prints_the_chains_and_one_node(saved):
    _, db = saved["bert_encoder"]
    app = typer.Typer()
    app.command()(explain)
    res = CliRunner().invoke(app, [str(db)])
    assert res.exit_code == 0, res.output
    assert "round 1, rule gelu-erf" in res.output and "round 2, rule gelu-bias" in res.output
    assert "matched Gelu#" in res.output and "(round 1, gelu-erf)" in res.output  # back to the step before
    assert "written node(s) are not in the input graph" in res.output
    ex = open_explanations(db)
    name = next(w[0] for w in ex.written if ex.derived(w[3]))
    one = CliRunner().invoke(app, [str(db), "--node", name])
    assert one.exit_code == 0 and one.output.startswith(f"{name} (") and "matched" in one.output
    kept = next(w[0] for w in ex.written if w[3] is not None and not ex.derived(w[3]))
    assert "in the input graph" in explain_text(ex, kept)


def test_errors_are_one_line(saved, tmp_path):
    _, db = saved["bert_encoder"]
    app = typer.Typer()
    app.command()(explain)
    res = CliRunner().invoke(app, [str(db), "--node", "no_such_node"])
    assert res.exit_code == 1 and "no written node is named 'no_such_node'" in res.output
    assert len(res.output.strip().splitlines()) == 1
    text = tmp_path / "model.txt"
    text.write_text("not a database\n")
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE t (x INTEGER)")
    for bad, why in ((text, "cannot open it as a DuckDB database"), (other, "not a relsat e-graph"),
                     (tmp_path / "missing.duckdb", "no such e-graph database"), (tmp_path, "is a folder")):
        with pytest.raises(RelsatError, match=why) as e:
            open_explanations(bad)
        assert str(bad) in str(e.value) and "\n" not in str(e.value)
        res = CliRunner().invoke(app, [str(bad)])
        assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1


def test_an_egraph_without_explanations_is_named(tmp_path):
    """An e-graph saved without a written graph (here: only imported) says what it lacks, in one line."""
    db = tmp_path / "e.duckdb"
    g = EGraph(db)
    import_model(zoo.build("bert", small=True), egraph=g)
    g.close()
    with pytest.raises(RelsatError, match="has no explanations .*written_nodes"):
        open_explanations(db)


def _clip_of_relu_times_one():
    """``Clip(Relu(x) * 1, 0, 6)``: mul-one-same unions ``Relu(x) * 1`` with ``Relu(x)`` (round 1); only then
    does clip-relu's ``(Clip (Relu ?x))`` match the Clip, whose input e-class now holds the Relu (round 2)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    consts = [numpy_helper.from_array(np.ones([4, 8], np.float32), "ones"),
              numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "ones"], ["m"]),
         helper.make_node("Clip", ["m", "lo", "hi"], ["y"])], "clip_relu_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_chain_follows_the_union_that_made_its_match(tmp_path):
    """A match that held only because another rule's union brought an e-node into the matched e-class: the
    chain has that union's application too (before it), and replays; without it the match does not replay."""
    model = _clip_of_relu_times_one()
    db = tmp_path / "e.duckdb"
    res = optimize(model, cost_model="analytic", measure=False, candidates=0, db=db, output=tmp_path / "o.onnx")
    assert res.report["written"] == "optimized"
    ex = open_explanations(db)
    derived = [(w[0], w[3]) for w in ex.written if ex.derived(w[3])]
    assert [(name, w_op) for (name, w_op, *_) in ex.written] == [("y", "Clip")] and len(derived) == 1
    chain = ex.chain(derived[0][1])
    assert [(a.rule, a.round) for a in chain] == [("mul-one-same", 1), ("clip-relu", 2)]
    union, clip = chain
    assert not union.added and union.nodes and clip.ops == ("Clip", "Relu")
    assert clip.nodes[1] not in union.nodes and not ex.derived(clip.nodes[1])  # the Relu: imported, not built
    text = explain_text(ex)
    assert "1. round 1, rule mul-one-same" in text and "added nothing new (a union)" in text
    assert "2. round 2, rule clip-relu" in text
    rules = {r.name: r for r in load_rule_list(["default"])}
    rp = _replay(model, db, [derived[0][1]], rules)
    assert rp.holds(derived[0][1])
    with pytest.raises(AssertionError, match="clip-relu .* does not match the replay"):
        _Replay(model, _Saved(db), rules).apply(clip)  # the match needs the union


@pytest.mark.parametrize("layout", ["map", "json", "no-terms"])
def test_an_older_database_is_migrated(tmp_path, layout):
    """An e-graph saved by an older relsat kept ``explain_matches`` as a table (``classes`` a MAP in the oldest,
    JSON later; ``terms`` added later still): opened for writing, its rows go into ``explain_match_rows`` as they
    were, the view of that name reads them beside rows recorded now, and the explanation reader takes both."""
    from relsat.driver.app.explain import _classes
    from relsat.relations.egraph import EGraph

    path = tmp_path / "old.duckdb"
    g = EGraph(path)
    classes = "MAP(VARCHAR, BIGINT)" if layout == "map" else "JSON"
    terms = "" if layout == "no-terms" else ", terms BIGINT[]"
    g.con.execute("DROP VIEW explanations")
    g.con.execute("DROP VIEW explain_matches")
    g.con.execute(f"CREATE TABLE explain_matches (rule VARCHAR, round INTEGER, mid BIGINT, nodes BIGINT[], "
                  f"ops VARCHAR[], roots BIGINT[], classes {classes}, bindings JSON{terms})")
    value = "MAP {'?x': 7}" if layout == "map" else "'{\"?x\":7}'"
    g.con.execute(f"INSERT INTO explain_matches (rule, round, mid, nodes, ops, roots, classes, bindings) VALUES "
                  f"('r', 1, 1, [5], ['Relu'], [6], {value}, '{{\"?k\":2}}')")
    g.close()
    g = EGraph(path)
    assert g.sql("SELECT table_type FROM information_schema.tables WHERE table_name = 'explain_matches'") == [("VIEW",)]
    assert g.sql("SELECT count(*) FROM explain_match_rows") == [(1,)]
    # a rule recorded now, beside it (its ops and variables in explain_rules)
    g.con.execute("INSERT INTO explain_rules VALUES ('s', ['Add', 'Add'], ['?a', '?b'])")
    g.con.execute("INSERT INTO explain_match_rows (rule, round, mid, nodes, roots, class_ids, terms) "
                  "VALUES ('s', 2, 1, [8, 9], [10], [3, 4], [10, 9])")
    rows = g.sql("SELECT rule, nodes, ops, roots, classes, bindings, terms FROM explain_matches ORDER BY rule")
    assert [(r[0], r[1], r[2], r[3], _classes(r[4]), json.loads(r[5]), r[6]) for r in rows] == [
        ("r", [5], ["Relu"], [6], {"?x": 7}, {"?k": 2}, None), ("s", [8, 9], ["Add", "Add"], [10], {"?a": 3, "?b": 4},
                                                              {}, [10, 9])]
    assert g.sql("SELECT count(*) FROM explanations") == [(0,)]  # (the view is there again)
    g.close()
    g = EGraph(path)  # opened again: nothing to migrate, the rows as they were
    assert g.sql("SELECT count(*) FROM explain_matches") == [(2,)]
    g.close()


def test_a_rule_named_like_another_keeps_its_own_ops_and_classes_in_its_rows():
    """Each match's row leaves the rule's ops and variables' names to ``explain_rules``, stored once with the first
    rule of that name; a rule of the same name with other ones (another rule file's) stores them in its rows, so
    ``explain_matches`` reads each match as its own rule matched it, and reads the same rows either way."""
    from pathlib import Path

    from relsat.driver.search.runner import Limits, Runner
    from relsat.programs.parser import load_rules
    from test_runner_phases import add_chain

    rules = list(load_rules(Path(__file__).parent.parent / "programs" / "rules" / "ac-add.rules").rules)
    cols = "rule, round, mid, nodes, ops, roots, classes::VARCHAR, bindings::VARCHAR, terms"
    seen = []
    for other in (False, True):
        g = add_chain(5)
        g.con.execute("SET threads = 1")  # (the match ids: the same in both runs)
        if other:  # the name taken by a rule with other ops and variables
            g.con.execute("INSERT INTO explain_rules VALUES ('add-assoc', ['Mul', 'Mul'], ['?p', '?q', '?r'])")
        Runner(g, rules, Limits(iterations=20, enodes=10**6, seconds=600)).run()
        rows = g.sql("SELECT count(*), count(ops), count(classes), count(class_ids) FROM explain_match_rows "
                     "WHERE rule = 'add-assoc'")[0]
        assert rows[0] > 0 and (rows[1:] == (rows[0], rows[0], 0) if other else rows[1:] == (0, 0, rows[0])), rows
        ops = {tuple(o) for (o,) in g.sql("SELECT DISTINCT ops FROM explain_matches WHERE rule = 'add-assoc'")}
        assert ops == {("Add", "Add")}
        assert {tuple(json.loads(c)) for (c,) in g.sql("SELECT DISTINCT classes FROM explain_matches "
                                                       "WHERE rule = 'add-assoc'")} == {("?a", "?b", "?c")}
        seen.append(g.sql(f"SELECT {cols} FROM explain_matches ORDER BY ALL"))
        g.close()
    assert seen[0] == seen[1] and seen[0]
