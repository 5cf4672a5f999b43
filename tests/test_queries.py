"""The README's five analysis queries, run against a saved e-graph and checked independently.

The queries are parsed out of the README's "Analysis queries" section and must agree with
benchmarks/queries.sql. Each one runs on the database that ``optimize(..., db=...)`` saves for
the small ResNet-50 (analytic costs: BatchNormalization folding makes the chosen graph differ
from the original), and its answer is checked against data the query does not compute: the
optimize report, the input model, the raw tables, and the ``relsat query`` command.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from relsat.driver.boundary import zoo
from relsat.driver.app.cli import app
from relsat.driver.app.optimize import optimize

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["rules_per_round", "egraph_size_per_round", "changed_eclasses", "most_expensive_chosen",
         "rejected_alternatives"]
LEAVES = {"Input", "Weight", "Constant"}


def _norm(sql: str) -> str:
    return " ".join(sql.split())


def readme_queries() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Analysis queries")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else None]
    blocks = re.findall(r"```bash\n(relsat query .*?)```", section, flags=re.S)
    return [b[b.index('"') + 1:b.rindex('"')].strip() for b in blocks]


def file_queries() -> dict[str, str]:
    text = (ROOT / "benchmarks" / "queries.sql").read_text()
    out = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = "\n".join(l for l in body.splitlines() if not l.startswith("--")).strip().rstrip(";")
    return out


QUERIES = dict(zip(NAMES, readme_queries()))


def test_readme_and_file_agree():
    readme, file = readme_queries(), file_queries()
    assert len(readme) == 5
    assert list(file) == NAMES
    assert [_norm(q) for q in readme] == [_norm(q) for q in file.values()]
    for q in readme:
        assert '"' not in q and "$" not in q and "`" not in q  # safe inside the README's double quotes


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    db = tmp_path_factory.mktemp("queries") / "resnet50.duckdb"
    model = zoo.build("resnet50", small=True)
    res = optimize(model, db=db, cost_model="analytic", measure=False)
    con = duckdb.connect(str(db), read_only=True)
    yield model, res.report, con, db
    con.close()


def rows(con, sql):
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_queries_run_through_the_cli(saved):
    _, _, con, db = saved
    runner = CliRunner()
    for name, sql in QUERIES.items():
        res = runner.invoke(app, ["query", str(db), sql, "--format", "json"])
        assert res.exit_code == 0, (name, res.output)
        assert len(json.loads(res.output)) == len(rows(con, sql)), name


def test_rules_per_round(saved):
    _, report, con, _ = saved
    got = rows(con, QUERIES["rules_per_round"])
    assert got, "BatchNormalization folding fires on ResNet-50"
    raw = rows(con, "SELECT * FROM rule_stats")
    expect = []
    for rnd in sorted({r["round"] for r in raw}):
        live = [r for r in raw if r["round"] == rnd and r["matches"] > 0 and not r["banned"]]
        top = [r for r in live if sum(x["matches"] > r["matches"] for x in live) < 3]  # rank() <= 3
        expect += sorted(((rnd, r["rule"], r["matches"], r["new_nodes"], r["applied"]) for r in top),
                         key=lambda t: (t[0], -t[2], t[1]))
    assert [(r["round"], r["rule"], r["matches"], r["new_nodes"], r["applications"]) for r in got] == expect
    # rule_stats agrees with the runner's own report
    for it in report["iterations"]:
        per = [r for r in raw if r["round"] == it["round"]]
        assert sum(r["applied"] for r in per) == it["applied"]
        assert sum(r["new_nodes"] for r in per) == it["new_nodes"]
    for rule, n in report["rules_applied"].items():
        assert sum(r["applied"] for r in raw if r["rule"] == rule) == n


def test_egraph_size_per_round(saved):
    _, report, con, _ = saved
    got = rows(con, QUERIES["egraph_size_per_round"])
    its = report["iterations"]
    assert [(r["round"], r["enodes"], r["eclasses"], r["unions"]) for r in got] == \
        [(i["round"], i["enodes"], i["eclasses"], i["unions"]) for i in its]
    for r, i in zip(got, its):
        assert 0 <= r["new_enodes_kept"] <= i["new_nodes"]
        assert r["match_s"] == pytest.approx(i["match_s"], abs=6e-4)
    assert got[-1]["stop_reason"] == report["stop_reason"]
    assert all(r["stop_reason"] is None for r in got[:-1])
    assert got[-1]["enodes"] == report["enodes"] == con.execute("SELECT count(*) FROM enodes").fetchone()[0]
    assert any(r["new_enodes_kept"] > 0 for r in got)


def test_changed_eclasses(saved):
    model, _, con, _ = saved
    got = rows(con, QUERIES["changed_eclasses"])
    first = {c: (n, op) for c, n, op in con.execute("SELECT eclass, min(id), arg_min(op, id) FROM enodes GROUP BY eclass").fetchall()}
    op_of = dict(con.execute("SELECT id, op FROM enodes").fetchall())
    chosen = dict(con.execute("SELECT eclass, node FROM extraction").fetchall())
    by = {r["eclass"]: r for r in got}
    assert len(by) == len(got)
    kinds = Counter(r["change"] for r in got)
    assert kinds["replaced"] > 0 and kinds["added"] > 0
    assert any(r["original_op"] == "BatchNormalization" and r["chosen_op"] == "Conv" for r in got)
    for r in got:
        c = r["eclass"]
        if r["change"] == "replaced":  # the chosen node really differs from the original one
            assert chosen[c] != first[c][0]
            assert (r["original_op"], r["chosen_op"]) == (first[c][1], op_of[chosen[c]])
        elif r["change"] == "added":
            assert c in chosen and r["original_op"] is None and r["chosen_op"] == op_of[chosen[c]]
        else:
            assert r["change"] == "dropped" and c not in chosen and r["chosen_op"] is None
    for c, n in chosen.items():  # every chosen e-class left out of the answer is unchanged
        if c not in by:
            assert n == first[c][0]
    # the original graph the query rebuilt (unchanged + replaced + dropped e-classes) is the input model
    original = [c for c in chosen if by.get(c, {}).get("change") != "added"] + \
        [r["eclass"] for r in got if r["change"] == "dropped"]
    ops = Counter(first[c][1] for c in original if first[c][1] not in LEAVES)
    assert dict(ops) == zoo.op_counts(model)
    # and it agrees with the original choice optimize recorded (when the extraction table has it)
    cols = {r[0] for r in con.execute("DESCRIBE extraction").fetchall()}
    if "original_node" in cols:
        for c, orig in con.execute("SELECT eclass, original_node FROM extraction").fetchall():
            kind = by.get(c, {}).get("change")
            if orig is None:
                assert kind == "added"
            elif orig != chosen[c]:
                assert kind == "replaced" and orig == first[c][0]
            else:
                assert kind is None


def test_most_expensive_chosen(saved):
    _, report, con, _ = saved
    got = rows(con, QUERIES["most_expensive_chosen"])
    chosen = con.execute("SELECT x.eclass, x.node, c.ms FROM extraction x JOIN costs c ON c.node = x.node").fetchall()
    expect = sorted(chosen, key=lambda t: (-t[2], t[0]))[:10]
    assert [(r["eclass"], r["node"]) for r in got] == [(c, n) for c, n, _ in expect]
    ms = [r["ms"] for r in got]
    assert ms == sorted(ms, reverse=True) and ms[0] > 0
    total = sum(m for _, _, m in chosen)
    assert total == pytest.approx(report["cost_after"], rel=1e-6)
    for r, (_, _, m) in zip(got, expect):
        assert r["pct_of_total"] == pytest.approx(100 * m / total, abs=0.051)


def _reaches(con, start: int, target: int) -> bool:
    """Does e-class ``start`` depend on ``target`` through the chosen nodes?"""
    kids = {c: ch for c, ch in con.execute(
        "SELECT x.eclass, n.children FROM extraction x JOIN enodes n ON n.id = x.node").fetchall()}
    stack, seen = [start], set()
    while stack:
        c = stack.pop()
        if c == target:
            return True
        if c not in seen:
            seen.add(c)
            stack.extend(kids.get(c, []))
    return False


def test_rejected_alternatives(saved):
    _, report, con, _ = saved
    got = rows(con, QUERIES["rejected_alternatives"])
    sizes = con.execute("SELECT x.eclass, count(*) FROM extraction x JOIN enodes n ON n.eclass = x.eclass "
                        "GROUP BY x.eclass").fetchall()
    pick = min(sizes, key=lambda t: (-t[1], t[0]))
    assert pick[1] > 1
    assert {r["eclass"] for r in got} == {pick[0]} and len(got) == pick[1]
    chosen = dict(con.execute("SELECT eclass, node FROM extraction").fetchall())
    cost = dict(con.execute("SELECT node, ms FROM costs").fetchall())
    assert [r["node"] for r in got if r["chosen"]] == [chosen[pick[0]]]
    assert got[0]["chosen"]
    rejected = [r for r in got if not r["chosen"]]
    assert rejected and not {r["node"] for r in rejected} & set(chosen.values())
    assert [r["ms"] for r in rejected] == sorted(r["ms"] for r in rejected)
    best = cost[chosen[pick[0]]]
    slack = 1e-9 + report["extraction"].get("mip_gap", 1e-4) * report["cost_after"]
    for r in got:
        outside = [k for k in r["children"] if k not in chosen]
        assert r["children_outside_graph"] == len(outside)
        assert r["ms"] == pytest.approx(cost[r["node"]], abs=5e-5)
        # an alternative whose inputs are all in the chosen graph (and that would not close a cycle)
        # could replace the chosen node for the difference of their own costs: an optimal ILP
        # solution cannot have rejected a cheaper one
        if (not r["chosen"] and not outside and report["extraction"]["status"] == "optimal"
                and not any(_reaches(con, k, pick[0]) for k in r["children"])):
            assert cost[r["node"]] >= best - slack
