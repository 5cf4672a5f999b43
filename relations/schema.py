"""DDL of the e-graph database, derived from the operator catalog.

One table per operator (``op_conv``, ``op_matmul``, ...) with a node id, one
BIGINT column per child e-class (-1 for an absent optional input; a BIGINT[]
list for a variadic input), one typed column per attribute, the node's e-class
``out``, the round ``ts`` it was added in, and ``touched`` (the rebuild pass
that last rewrote the row, for incremental congruence).  Around them: the
union-find (displaced ids only), pending unions, the per-e-class analyses, the
side tables of weights and opaque nodes, and the user-facing views.
"""

from __future__ import annotations

from .catalog import OPS, SQL_MACROS, OpDef
from .dims import bind_macro


def q(name: str) -> str:
    """Quote an identifier (attribute names such as ``group`` are SQL keywords)."""
    return '"' + name.replace('"', '""') + '"'


def literal(value) -> str:
    """A Python value as a SQL literal: strings quoted, floats as DOUBLE (infinities included), bools,
    lists as lists; everything else as an integer. The one literal printer of relsat."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == float("inf"):
            return "'inf'::DOUBLE"
        if value == float("-inf"):
            return "'-inf'::DOUBLE"
        return repr(value) + "::DOUBLE"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return str(int(value))


def key_columns(op: OpDef) -> tuple[str, ...]:
    """The hash-consing key of an op table: its children, then its attributes."""
    return op.child_columns + tuple(a.name for a in op.attrs)


def table_ddl(op: OpDef) -> str:
    cols = ["id BIGINT NOT NULL"]
    for inp in op.inputs:
        cols.append(f"{q(inp.column)} {'BIGINT[]' if inp.variadic else 'BIGINT'} NOT NULL")
    for a in op.attrs:
        cols.append(f"{q(a.name)} {a.sql_type}")
    cols += ["out BIGINT NOT NULL", "ts INTEGER NOT NULL DEFAULT 0", "touched INTEGER NOT NULL DEFAULT 0"]
    return f"CREATE TABLE IF NOT EXISTS {op.table} ({', '.join(cols)})"


CORE_DDL = """
CREATE SEQUENCE IF NOT EXISTS class_seq START 1;
CREATE SEQUENCE IF NOT EXISTS node_seq START 1;
CREATE TABLE IF NOT EXISTS op_opaque (id BIGINT NOT NULL, proto BIGINT NOT NULL, inputs BIGINT[] NOT NULL,
    out BIGINT NOT NULL, ts INTEGER NOT NULL DEFAULT 0, touched INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS opaque_nodes (proto BIGINT PRIMARY KEY, op_type VARCHAR, domain VARCHAR,
    node BLOB, n_outputs INTEGER, output_shapes BIGINT[][], output_dtypes INTEGER[]);
CREATE TABLE IF NOT EXISTS weights (ref BIGINT PRIMARY KEY, name VARCHAR, dtype INTEGER, shape BIGINT[],
    digest VARCHAR, fill DOUBLE);
ALTER TABLE weights ADD COLUMN IF NOT EXISTS fill DOUBLE;
CREATE TABLE IF NOT EXISTS eclass (id BIGINT NOT NULL, shape BIGINT[], dtype INTEGER, is_const BOOLEAN,
    tuple_shapes BIGINT[][], tuple_dtypes INTEGER[], ts INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS uf (id BIGINT NOT NULL, root BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS pending (a BIGINT NOT NULL, b BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS symbols (code BIGINT PRIMARY KEY, name VARCHAR, anonymous BOOLEAN, batch BOOLEAN,
    value BIGINT, second BIGINT);
CREATE TABLE IF NOT EXISTS iterations (round INTEGER, enodes BIGINT, eclasses BIGINT, match_s DOUBLE,
    apply_s DOUBLE, rebuild_s DOUBLE, applied BIGINT, unions BIGINT, stop_reason VARCHAR);
ALTER TABLE iterations ADD COLUMN IF NOT EXISTS temp_mib DOUBLE;
CREATE TABLE IF NOT EXISTS rule_stats (round INTEGER, rule VARCHAR, matches BIGINT, applied BIGINT,
    new_nodes BIGINT, seconds DOUBLE, banned BOOLEAN);
CREATE TABLE IF NOT EXISTS explain_nodes (op VARCHAR, id BIGINT, eclass BIGINT, fresh BOOLEAN, rule VARCHAR,
    round INTEGER, mid BIGINT);
CREATE TABLE IF NOT EXISTS explain_match_rows (rule VARCHAR, round INTEGER, mid BIGINT, nodes BIGINT[],
    roots BIGINT[], class_ids BIGINT[], bindings JSON, terms BIGINT[], ops VARCHAR[], classes JSON);
CREATE TABLE IF NOT EXISTS explain_rules (rule VARCHAR PRIMARY KEY, ops VARCHAR[], vars VARCHAR[]);
CREATE TABLE IF NOT EXISTS explain_unions (rule VARCHAR, round INTEGER, mid BIGINT, a BIGINT, b BIGINT);
"""

# the match each rule application applied at (``explain_matches``: the e-nodes the left side's terms matched, their
# ops, the roots, the e-class variables' classes as JSON ``{"?var": e-class}``, the other bindings and lets as JSON,
# and the e-class each term's e-node was in then). A row of ``explain_match_rows`` holds what varies from match to
# match (the classes as a list, in the order of its rule's ``explain_rules.vars``; bindings NULL where the rule has
# none); what is the rule's (its terms' ops, its variables' names) is stored once, in ``explain_rules``. Each
# match's ops list and JSON object cost a third of ac-add's saturation with an e-graph file, written row by row;
# the view builds them when read. ``ops`` and ``classes`` set in a row: written by an older relsat (as it was)
EXPLAIN_MATCHES_VIEW = """
CREATE OR REPLACE VIEW explain_matches AS
SELECT m.rule, m.round, m.mid, m.nodes, coalesce(m.ops, r.ops) AS ops, m.roots,
    coalesce(m.classes, to_json(map(r.vars, m.class_ids))) AS classes, coalesce(m.bindings, '{}'::JSON) AS bindings,
    m.terms
FROM explain_match_rows m LEFT JOIN explain_rules r USING (rule)
"""

# why each e-node exists: the rule application that added it (``explain_nodes``: its e-class then, and whether
# it made that e-class) and the match it applied at (``explain_matches``); e-nodes not listed were imported
EXPLANATIONS_VIEW = """
CREATE OR REPLACE VIEW explanations AS
SELECT n.op, n.id AS node, coalesce(u.root, n.eclass) AS eclass, n.eclass AS added_to, n.fresh, n.rule, n.round,
    n.mid AS match, m.nodes AS matched_nodes, m.ops AS matched_ops, m.roots, m.classes, m.bindings
FROM explain_nodes n LEFT JOIN explain_matches m USING (rule, round, mid) LEFT JOIN uf u ON u.id = n.eclass
"""


def _attrs_json(op: OpDef) -> str:
    if not op.attrs:
        return "'{}'::JSON"
    return "json_object(" + ", ".join(f"'{a.name}', {q(a.name)}" for a in op.attrs) + ")"


def _children_list(op: OpDef) -> str:
    if op.variadic:
        return q(op.inputs[0].column)
    if not op.inputs:
        return "[]::BIGINT[]"
    return "list_filter([" + ", ".join(q(c) for c in op.child_columns) + "], lambda c: c <> -1)"


def enodes_view() -> str:
    parts = [
        f"SELECT id, '{op.op_type}' AS op, out AS eclass, {_children_list(op)} AS children, "
        f"{_attrs_json(op)} AS attrs, ts FROM {op.table}"
        for op in OPS
    ]
    parts.append(
        "SELECT o.id, n.op_type AS op, o.out AS eclass, o.inputs AS children, "
        "json_object('domain', n.domain) AS attrs, o.ts FROM op_opaque o JOIN opaque_nodes n USING (proto)"
    )
    return "CREATE OR REPLACE VIEW enodes AS\n" + "\nUNION ALL\n".join(parts)


ECLASSES_VIEW = """
CREATE OR REPLACE VIEW eclasses AS
SELECT e.id, e.shape, e.dtype, e.is_const, e.tuple_shapes, coalesce(n.size, 0) AS size
FROM eclass e LEFT JOIN (SELECT eclass, count(*) AS size FROM enodes GROUP BY eclass) n ON n.eclass = e.id
"""


# the analyses with every symbol replaced by its costed binding (what costs read)
ECLASS_BOUND_VIEW = """
CREATE OR REPLACE VIEW eclass_bound AS
SELECT id, bind(shape) AS shape, dtype, is_const, list_transform(tuple_shapes, lambda s: bind(s)) AS tuple_shapes,
    tuple_dtypes, ts FROM eclass
"""


def tables_ddl() -> list[str]:
    """The e-graph's tables and macros (each ``CREATE ... IF NOT EXISTS`` or ``OR REPLACE``); its views come after
    them (``views_ddl``), once a database saved by an older relsat is migrated (``EGraph.__post_init__``)."""
    return [s for s in (SQL_MACROS + CORE_DDL).split(";\n") if s.strip()] + [table_ddl(op) for op in OPS]


def views_ddl() -> list[str]:
    return [bind_macro(None), enodes_view(), ECLASSES_VIEW, ECLASS_BOUND_VIEW, EXPLAIN_MATCHES_VIEW, EXPLANATIONS_VIEW]
