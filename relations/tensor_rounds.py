"""EinNet's derivation rules as SQL over the ``texpr_*`` tables, applied in rounds (issue 28, item 2).

relations/tensor_tables.py keeps tensor-expression programs as rows beside the e-graph; this module
derives new programs from them the way the saturation runner applies rewrite rules: each rule is a few
SQL statements over *every* program of the round's frontier at once (candidates found by joins over the
access, index and term rows, new programs written by ``INSERT ... SELECT``), so the statements per round
grow with the rules, never with the programs. The rules are those of relations/tensor_derive.py, which
states them over Python objects and serves as their reference (a test checks both derive the same
programs):

* ``split-summation`` (expression splitting with variable substitution): ``Σ_S A·B`` over a summation
  iterator read by some factors becomes ``T = Σ_c`` of those factors, read by the rest;
* ``merge`` (expression merging): a step read by exactly one later step, once, substituted into it;
* ``split-access`` (expression splitting of an access): a non-plain access becomes a gather step.

Derived programs are stored in the same tables under ``op = 'derived'``, one ``enode`` id each, and
``texpr_derived`` says where each came from: its root (the e-node program the search started from:
every derived program computes the root's e-class), its parent, the rule, the round, its expression
distance and its status (``kept``; ``duplicate``: the same program up to naming and commutation as one
seen before, rows deleted; ``refuted``: not equal to its root on random inputs, rows deleted).

**Every derived program is checked numerically** against its root before it is kept (``check``:
``tensor_derive.equivalent``, NumPy by the definition; programs larger than ``CHECK_ELEMENTS`` points
are left ``unchecked`` and never enter the frontier), and duplicates are found by canonical form; both
run in Python per derived program, bounded by the beam.

**Expression distance** (EinNet's guidance, ``DISTANCE_SQL``): the number of accesses that still read a
tensor through a non-plain index inside a computing step (one with a summation, or more than one bare
access): each needs one more expression split or substitution before the step is a plain contraction
the matcher (relations/tensor_match.py) maps to MatMul/Einsum (a broadcast axis, index 0 over a size-1 axis,
counts as plain), or a gather it maps to Reshape, Slice,
Pad and Concat. The search is EinNet's two stages: ``explore`` rounds apply every rule to every kept
program; later rounds (converging) keep only programs no farther than their parent, and every round
keeps at most ``beam`` programs per root in its frontier, nearest first (ties by id): the search is
bounded whatever the rules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .tensor_derive import canonical, equivalent
from .tensor_tables import DDL, TABLES, load_many, rows_of, write

RULES = ("merge", "split-access", "split-summation")
CHECK_ELEMENTS = 5_000_000  # iteration points (scope x summation) of the largest step a NumPy check evaluates

SETUP = """
CREATE TABLE IF NOT EXISTS texpr_derived (enode BIGINT, root_op VARCHAR, root_enode BIGINT, parent_op VARCHAR,
    parent_enode BIGINT, rule VARCHAR, round INTEGER, distance INTEGER, status VARCHAR);
CREATE OR REPLACE TEMP TABLE texpr_frontier (op VARCHAR, enode BIGINT, root_op VARCHAR, root_enode BIGINT);
"""

# every access axis of the frontier's programs: the plain iterator it is (or NULL), affine or not
AXES = """
CREATE OR REPLACE TEMP TABLE texpr_ax AS
SELECT i.op, i.enode, i.step, i.access, i.axis,
       CASE WHEN count(t.iter) = 1 AND min(t.coeff) = 1 AND count(t.floor_div) = 0 AND i."const" = 0
            AND i.div = 1 AND i.modulus IS NULL THEN min(t.iter) END AS plain,
       count(t.floor_div) = 0 AND i.div = 1 AND i.modulus IS NULL AS affine
FROM texpr_index i JOIN (SELECT DISTINCT op, enode FROM texpr_frontier) f USING (op, enode)
LEFT JOIN texpr_term t USING (op, enode, step, access, axis)
GROUP BY i.op, i.enode, i.step, i.access, i.axis, i."const", i.div, i.modulus
"""

# the expression distance of programs (see the module doc), for the programs in texpr_new
DISTANCE_SQL = """
SELECT a.op, a.enode, count(*) FILTER (WHERE nonplain AND (s.body <> '#0' OR coalesce(n.sums, 0) > 0)) AS distance
FROM (SELECT op, enode, step, access, bool_or(NOT ((count_terms = 1 AND coeff1 OR count_terms = 0) AND "const" = 0
                                                    AND div = 1 AND modulus IS NULL)) AS nonplain
      FROM (SELECT i.op, i.enode, i.step, i.access, i.axis, i."const", i.div, i.modulus, count(t.iter) AS count_terms,
                   coalesce(bool_and(t.coeff = 1 AND t.floor_div IS NULL), false) AS coeff1
            FROM texpr_index i JOIN texpr_new n USING (op, enode)
            LEFT JOIN texpr_term t USING (op, enode, step, access, axis) GROUP BY ALL)
      GROUP BY ALL) a
JOIN texpr_step s USING (op, enode, step)
LEFT JOIN (SELECT op, enode, step, count(*) FILTER (WHERE role = 'sum') AS sums FROM texpr_iter GROUP BY ALL) n
    USING (op, enode, step)
GROUP BY a.op, a.enode
"""

# the steps a rule copies unchanged: texpr_map(nid, op, enode, old, new) -> the five step tables
COPY = [
    "INSERT INTO texpr_step SELECT 'derived', m.nid, m.new, s.name, s.combine, s.body FROM texpr_step s "
    "JOIN texpr_map m ON s.op = m.op AND s.enode = m.enode AND s.step = m.old",
    "INSERT INTO texpr_iter SELECT 'derived', m.nid, m.new, i.role, i.pos, i.name, i.extent FROM texpr_iter i "
    "JOIN texpr_map m ON i.op = m.op AND i.enode = m.enode AND i.step = m.old",
    "INSERT INTO texpr_access SELECT 'derived', m.nid, m.new, a.access, a.tensor, a.pad, a.path FROM texpr_access a "
    "JOIN texpr_map m ON a.op = m.op AND a.enode = m.enode AND a.step = m.old",
    'INSERT INTO texpr_index SELECT \'derived\', m.nid, m.new, i.access, i.axis, i."const", i.div, i.exact, i.modulus '
    "FROM texpr_index i JOIN texpr_map m ON i.op = m.op AND i.enode = m.enode AND i.step = m.old",
    "INSERT INTO texpr_term SELECT 'derived', m.nid, m.new, t.access, t.axis, t.pos, t.iter, t.coeff, t.floor_div "
    "FROM texpr_term t JOIN texpr_map m ON t.op = m.op AND t.enode = m.enode AND t.step = m.old",
]


def _program_rows(delta: int) -> list[str]:
    """The new programs' own rows (program, inputs) and their lineage, from texpr_c(nid, op, enode, rule)."""
    return [
        f"INSERT INTO texpr_program SELECT 'derived', c.nid, p.eclass, p.steps + ({delta}) FROM texpr_c c "
        "JOIN texpr_program p USING (op, enode)",
        "INSERT INTO texpr_input SELECT 'derived', c.nid, i.pos, i.tensor, i.shape FROM texpr_c c "
        "JOIN texpr_input i USING (op, enode)",
        "INSERT INTO texpr_derived SELECT c.nid, f.root_op, f.root_enode, c.op, c.enode, c.rule, $round, NULL, NULL "
        "FROM texpr_c c JOIN texpr_frontier f USING (op, enode)",
    ]


_BASE = "(SELECT coalesce(max(enode), 0) FROM texpr_derived)"  # ids never reused, deleted programs' included

# the steps around step k of a split (k becomes k and k + 1): copied, the later ones one further
_SPLIT_MAP = """
CREATE OR REPLACE TEMP TABLE texpr_map AS
SELECT c.nid, c.op, c.enode, s.step AS old, CASE WHEN s.step < c.k THEN s.step ELSE s.step + 1 END AS new
FROM texpr_c c JOIN texpr_step s ON s.op = c.op AND s.enode = c.enode AND s.step <> c.k
"""


# -- split-access ----------------------------------------------------------------------------------------------

SPLIT_ACCESS = [
    f"""CREATE OR REPLACE TEMP TABLE texpr_c AS
    SELECT {_BASE} + row_number() OVER (ORDER BY a.op, a.enode, a.step, a.access) AS nid, a.op, a.enode,
           a.step AS k, a.access AS a, s.name || '.gather' || a.access AS g, 'split-access' AS rule
    FROM (SELECT op, enode, step, access FROM texpr_ax GROUP BY ALL HAVING count(plain) < count(*)) a
    JOIN texpr_step s USING (op, enode, step)""",
    # the iterators the access uses, in order of first use: the gather's scope
    """CREATE OR REPLACE TEMP TABLE texpr_used AS
    SELECT c.nid, t.iter, row_number() OVER (PARTITION BY c.nid ORDER BY min(t.axis * 1000000 + t.pos)) - 1 AS q,
           any_value(i.extent) AS extent
    FROM texpr_c c JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode AND t.step = c.k AND t.access = c.a
    JOIN texpr_iter i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k AND i.name = t.iter
    GROUP BY c.nid, t.iter""",
    _SPLIT_MAP,
    *COPY,
    # the gather G = T[τ] at step k
    "INSERT INTO texpr_step SELECT 'derived', nid, k, g, 'sum', '#0' FROM texpr_c",
    "INSERT INTO texpr_iter SELECT 'derived', u.nid, c.k, 'scope', u.q, u.iter, u.extent FROM texpr_used u JOIN texpr_c c USING (nid)",
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.k, 0, a.tensor, a.pad, '' FROM texpr_c c JOIN texpr_access a "
    "ON a.op = c.op AND a.enode = c.enode AND a.step = c.k AND a.access = c.a",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.k, 0, i.axis, i."const", i.div, i.exact, i.modulus '
    "FROM texpr_c c JOIN texpr_index i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k AND i.access = c.a",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k, 0, t.axis, t.pos, t.iter, t.coeff, t.floor_div "
    "FROM texpr_c c JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode AND t.step = c.k AND t.access = c.a",
    # the step itself at k + 1, reading G plainly
    "INSERT INTO texpr_step SELECT 'derived', c.nid, c.k + 1, s.name, s.combine, s.body FROM texpr_c c "
    "JOIN texpr_step s ON s.op = c.op AND s.enode = c.enode AND s.step = c.k",
    "INSERT INTO texpr_iter SELECT 'derived', c.nid, c.k + 1, i.role, i.pos, i.name, i.extent FROM texpr_c c "
    "JOIN texpr_iter i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k",
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.k + 1, a.access, CASE WHEN a.access = c.a THEN c.g "
    "ELSE a.tensor END, CASE WHEN a.access = c.a THEN 0.0 ELSE a.pad END, a.path FROM texpr_c c "
    "JOIN texpr_access a ON a.op = c.op AND a.enode = c.enode AND a.step = c.k",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.k + 1, i.access, i.axis, i."const", i.div, i.exact, i.modulus '
    "FROM texpr_c c JOIN texpr_index i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k AND i.access <> c.a",
    "INSERT INTO texpr_index SELECT 'derived', c.nid, c.k + 1, c.a, u.q, 0, 1, true, NULL FROM texpr_c c "
    "JOIN texpr_used u USING (nid)",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k + 1, t.access, t.axis, t.pos, t.iter, t.coeff, t.floor_div "
    "FROM texpr_c c JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode AND t.step = c.k AND t.access <> c.a",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k + 1, c.a, u.q, 0, u.iter, 1, NULL FROM texpr_c c "
    "JOIN texpr_used u USING (nid)",
    *_program_rows(1),
]


# -- split-summation -----------------------------------------------------------------------------------------

SPLIT_SUMMATION = [
    # steps that are a sum of a product of accesses, every index affine; each summation iterator a candidate
    """CREATE OR REPLACE TEMP TABLE texpr_sp AS
    SELECT s.op, s.enode, s.step AS k, s.name, i.name AS over, i.extent AS over_extent,
           (SELECT count(*) FROM texpr_iter j WHERE j.op = s.op AND j.enode = s.enode AND j.step = s.step
            AND j.role = 'sum') AS sums
    FROM texpr_step s JOIN (SELECT DISTINCT op, enode FROM texpr_frontier) f USING (op, enode)
    JOIN texpr_iter i ON i.op = s.op AND i.enode = s.enode AND i.step = s.step AND i.role = 'sum'
    WHERE s.combine = 'sum' AND regexp_full_match(s.body, '#[0-9]+|Mul\\(#[0-9]+(, #[0-9]+)*\\)')
      AND NOT EXISTS (SELECT 1 FROM texpr_ax x WHERE x.op = s.op AND x.enode = s.enode AND x.step = s.step
                      AND NOT x.affine)""",
    # each factor: whether it reads the summed iterator; each of its axes: sum, plain (another iterator) or fresh
    """CREATE OR REPLACE TEMP TABLE texpr_spa AS
    SELECT p.op, p.enode, p.k, p.over, a.access, a.tensor, a.pad,
           EXISTS (SELECT 1 FROM texpr_term t WHERE t.op = a.op AND t.enode = a.enode AND t.step = a.step
                   AND t.access = a.access AND t.iter = p.over) AS uses
    FROM texpr_sp p JOIN texpr_access a ON a.op = p.op AND a.enode = p.enode AND a.step = p.k""",
    """CREATE OR REPLACE TEMP TABLE texpr_spx AS
    SELECT f.op, f.enode, f.k, f.over, f.access, x.axis, x.plain,
           CASE WHEN x.plain = f.over THEN 'sum' WHEN x.plain IS NULL THEN 'fresh' ELSE 'plain' END AS kind,
           EXISTS (SELECT 1 FROM texpr_term t WHERE t.op = f.op AND t.enode = f.enode AND t.step = f.k
                   AND t.access = f.access AND t.axis = x.axis AND t.iter = f.over) AS reads_over
    FROM texpr_spa f JOIN texpr_ax x ON x.op = f.op AND x.enode = f.enode AND x.step = f.k AND x.access = f.access
    WHERE f.uses""",
    f"""CREATE OR REPLACE TEMP TABLE texpr_c AS
    SELECT {_BASE} + row_number() OVER (ORDER BY p.op, p.enode, p.k, p.over) AS nid, p.op, p.enode, p.k, p.over,
           p.over_extent, p.sums, p.name, p.name || '.split' || p.k AS t_name, 'split-summation' AS rule
    FROM texpr_sp p
    WHERE EXISTS (SELECT 1 FROM texpr_spa f WHERE f.op = p.op AND f.enode = p.enode AND f.k = p.k AND f.over = p.over
                  AND f.uses)
      AND NOT EXISTS (SELECT 1 FROM texpr_spa f WHERE f.op = p.op AND f.enode = p.enode AND f.k = p.k
                      AND f.over = p.over AND f.uses AND f.pad <> 0)
      AND NOT EXISTS (SELECT 1 FROM texpr_spx x WHERE x.op = p.op AND x.enode = p.enode AND x.k = p.k
                      AND x.over = p.over AND x.reads_over AND x.kind <> 'sum')
      AND NOT (p.sums = 1
               AND NOT EXISTS (SELECT 1 FROM texpr_spa f WHERE f.op = p.op AND f.enode = p.enode AND f.k = p.k
                               AND f.over = p.over AND NOT f.uses)
               AND NOT EXISTS (SELECT 1 FROM texpr_spx x WHERE x.op = p.op AND x.enode = p.enode AND x.k = p.k
                               AND x.over = p.over AND x.kind = 'fresh'))""",
    # the factors: T's (using, in order) and the rest's (the others, after T's read)
    """CREATE OR REPLACE TEMP TABLE texpr_cf AS
    SELECT c.nid, f.access, f.uses, f.tensor, f.pad,
           row_number() OVER (PARTITION BY c.nid, f.uses ORDER BY f.access) - 1 + CASE WHEN f.uses THEN 0 ELSE 1 END
               AS new_access,
           count(*) OVER (PARTITION BY c.nid, f.uses) AS n
    FROM texpr_c c JOIN texpr_spa f ON f.op = c.op AND f.enode = c.enode AND f.k = c.k AND f.over = c.over""",
    # the axes of T's factors: a fresh iterator for each affine non-plain index; T's scope (fresh ones and
    # each other plain iterator at its first use), with the index its reader puts back
    """CREATE OR REPLACE TEMP TABLE texpr_cx AS
    SELECT c.nid, x.access, x.axis, x.kind, x.plain,
           CASE WHEN x.kind = 'fresh' THEN 'split' || c.k || '.i' ||
               (row_number() OVER (PARTITION BY c.nid, x.kind = 'fresh' ORDER BY x.access, x.axis) - 1) END AS fresh,
           x.kind = 'fresh' OR (x.kind = 'plain' AND row_number() OVER (PARTITION BY c.nid, x.plain
               ORDER BY x.access, x.axis) = 1) AS in_scope
    FROM texpr_c c JOIN texpr_spx x ON x.op = c.op AND x.enode = c.enode AND x.k = c.k AND x.over = c.over""",
    """CREATE OR REPLACE TEMP TABLE texpr_cs AS
    SELECT x.nid, x.access, x.axis, coalesce(x.fresh, x.plain) AS iter,
           row_number() OVER (PARTITION BY x.nid ORDER BY x.access, x.axis) - 1 AS q,
           CASE WHEN x.kind = 'fresh' THEN coalesce(
               (SELECT i.shape[x.axis + 1] FROM texpr_input i WHERE i.op = c.op AND i.enode = c.enode
                AND i.tensor = a.tensor),
               (SELECT it.extent FROM texpr_step s JOIN texpr_iter it ON it.op = s.op AND it.enode = s.enode
                AND it.step = s.step AND it.role = 'scope' AND it.pos = x.axis
                WHERE s.op = c.op AND s.enode = c.enode AND s.name = a.tensor))
           ELSE (SELECT it.extent FROM texpr_iter it WHERE it.op = c.op AND it.enode = c.enode AND it.step = c.k
                 AND it.name = x.plain) END AS extent
    FROM texpr_cx x JOIN texpr_c c USING (nid)
    JOIN texpr_access a ON a.op = c.op AND a.enode = c.enode AND a.step = c.k AND a.access = x.access
    WHERE x.in_scope""",
    _SPLIT_MAP,
    *COPY,
    # T = Σ_over (the using factors) at step k
    "INSERT INTO texpr_step SELECT 'derived', c.nid, c.k, c.t_name, 'sum', CASE WHEN n = 1 THEN '#0' ELSE "
    "'Mul(' || string_agg('#' || f.new_access, ', ' ORDER BY f.new_access) || ')' END FROM texpr_c c "
    "JOIN texpr_cf f USING (nid) WHERE f.uses GROUP BY c.nid, c.k, c.t_name, f.n",
    "INSERT INTO texpr_iter SELECT 'derived', c.nid, c.k, 'scope', s.q, s.iter, s.extent FROM texpr_c c "
    "JOIN texpr_cs s USING (nid)",
    "INSERT INTO texpr_iter SELECT 'derived', nid, k, 'sum', 0, over, over_extent FROM texpr_c",
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.k, f.new_access, f.tensor, f.pad, "
    "CASE WHEN f.n = 1 THEN '' ELSE 'Mul' END FROM texpr_c c JOIN texpr_cf f USING (nid) WHERE f.uses",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.k, f.new_access, i.axis, '
    'CASE WHEN x.kind = \'fresh\' THEN 0 ELSE i."const" END, CASE WHEN x.kind = \'fresh\' THEN 1 ELSE i.div END, '
    "x.kind = 'fresh' OR i.exact, CASE WHEN x.kind <> 'fresh' THEN i.modulus END FROM texpr_c c "
    "JOIN texpr_cf f USING (nid) JOIN texpr_cx x ON x.nid = c.nid AND x.access = f.access "
    "JOIN texpr_index i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k AND i.access = f.access "
    "AND i.axis = x.axis WHERE f.uses",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k, f.new_access, t.axis, t.pos, t.iter, t.coeff, t.floor_div "
    "FROM texpr_c c JOIN texpr_cf f USING (nid) JOIN texpr_cx x ON x.nid = c.nid AND x.access = f.access "
    "JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode AND t.step = c.k AND t.access = f.access "
    "AND t.axis = x.axis WHERE f.uses AND x.kind <> 'fresh'",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k, f.new_access, x.axis, 0, x.fresh, 1, NULL "
    "FROM texpr_c c JOIN texpr_cf f USING (nid) JOIN texpr_cx x ON x.nid = c.nid AND x.access = f.access "
    "WHERE f.uses AND x.kind = 'fresh'",
    # the rest at k + 1: T read at the indices put back, times the other factors, summed over the other iterators
    "INSERT INTO texpr_step SELECT 'derived', c.nid, c.k + 1, c.name, 'sum', CASE WHEN o.n IS NULL THEN '#0' ELSE "
    "'Mul(#0, ' || o.refs || ')' END FROM texpr_c c LEFT JOIN (SELECT nid, any_value(n) AS n, "
    "string_agg('#' || new_access, ', ' ORDER BY new_access) AS refs FROM texpr_cf WHERE NOT uses GROUP BY nid) o "
    "USING (nid)",
    "INSERT INTO texpr_iter SELECT 'derived', c.nid, c.k + 1, i.role, CASE WHEN i.role = 'sum' THEN "
    "row_number() OVER (PARTITION BY c.nid, i.role ORDER BY i.pos) - 1 ELSE i.pos END, i.name, i.extent "
    "FROM texpr_c c JOIN texpr_iter i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k "
    "AND NOT (i.role = 'sum' AND i.name = c.over)",
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.k + 1, 0, c.t_name, 0.0, CASE WHEN EXISTS (SELECT 1 "
    "FROM texpr_cf f WHERE f.nid = c.nid AND NOT f.uses) THEN 'Mul' ELSE '' END FROM texpr_c c",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.k + 1, 0, s.q, i."const", i.div, i.exact, i.modulus '
    "FROM texpr_c c JOIN texpr_cs s USING (nid) JOIN texpr_index i ON i.op = c.op AND i.enode = c.enode "
    "AND i.step = c.k AND i.access = s.access AND i.axis = s.axis",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k + 1, 0, s.q, t.pos, t.iter, t.coeff, t.floor_div "
    "FROM texpr_c c JOIN texpr_cs s USING (nid) JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode "
    "AND t.step = c.k AND t.access = s.access AND t.axis = s.axis",
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.k + 1, f.new_access, f.tensor, f.pad, 'Mul' "
    "FROM texpr_c c JOIN texpr_cf f USING (nid) WHERE NOT f.uses",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.k + 1, f.new_access, i.axis, i."const", i.div, i.exact, '
    "i.modulus FROM texpr_c c JOIN texpr_cf f USING (nid) JOIN texpr_index i ON i.op = c.op AND i.enode = c.enode "
    "AND i.step = c.k AND i.access = f.access WHERE NOT f.uses",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.k + 1, f.new_access, t.axis, t.pos, t.iter, t.coeff, "
    "t.floor_div FROM texpr_c c JOIN texpr_cf f USING (nid) JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode "
    "AND t.step = c.k AND t.access = f.access WHERE NOT f.uses",
    *_program_rows(1),
]


# -- merge ------------------------------------------------------------------------------------------------------

MERGE = [
    # a producer step k read by exactly one later step r, through exactly one access a: affine, padded with 0; every
    # index of the producer affine; a producer with a summation only into a summing reader that is a product of it
    f"""CREATE OR REPLACE TEMP TABLE texpr_c AS
    WITH reads AS (
        SELECT p.op, p.enode, p.step AS k, p.name, p.combine AS p_combine, p.body AS p_body, a.step AS r,
               a.access AS a, a.pad, a.path, count(*) OVER (PARTITION BY p.op, p.enode, p.step) AS n_reads
        FROM texpr_step p JOIN (SELECT DISTINCT op, enode FROM texpr_frontier) f USING (op, enode)
        JOIN texpr_access a ON a.op = p.op AND a.enode = p.enode AND a.tensor = p.name)
    SELECT {_BASE} + row_number() OVER (ORDER BY d.op, d.enode, d.k) AS nid, d.*, r.name AS r_name,
           r.combine AS r_combine, r.body AS r_body,
           (SELECT count(*) FROM texpr_access x WHERE x.op = d.op AND x.enode = d.enode AND x.step = d.k) AS m,
           (SELECT count(*) FROM texpr_iter x WHERE x.op = d.op AND x.enode = d.enode AND x.step = d.r
            AND x.role = 'sum') AS r_sums,
           'merge' AS rule
    FROM reads d JOIN texpr_step r ON r.op = d.op AND r.enode = d.enode AND r.step = d.r
    JOIN texpr_program pr ON pr.op = d.op AND pr.enode = d.enode
    WHERE d.n_reads = 1 AND d.k < pr.steps - 1 AND d.pad = 0
      AND NOT EXISTS (SELECT 1 FROM texpr_ax x WHERE x.op = d.op AND x.enode = d.enode AND NOT x.affine
                      AND ((x.step = d.r AND x.access = d.a) OR x.step = d.k))
      AND (NOT EXISTS (SELECT 1 FROM texpr_iter x WHERE x.op = d.op AND x.enode = d.enode AND x.step = d.k
                       AND x.role = 'sum')
           OR (d.p_combine = 'sum' AND r.combine = 'sum' AND regexp_full_match(d.path, '(Mul(/Mul)*)?')))""",
    """CREATE OR REPLACE TEMP TABLE texpr_map AS
    SELECT c.nid, c.op, c.enode, s.step AS old, CASE WHEN s.step < c.k THEN s.step ELSE s.step - 1 END AS new
    FROM texpr_c c JOIN texpr_step s ON s.op = c.op AND s.enode = c.enode AND s.step <> c.k AND s.step <> c.r""",
    *COPY,
    # the producer's summation iterators, renamed where the reader has the name
    """CREATE OR REPLACE TEMP TABLE texpr_ren AS
    SELECT c.nid, i.pos, i.name AS old, i.extent, CASE WHEN EXISTS (SELECT 1 FROM texpr_iter j WHERE j.op = c.op
        AND j.enode = c.enode AND j.step = c.r AND j.name = i.name) THEN i.name || '.' || c.name ELSE i.name END AS new
    FROM texpr_c c JOIN texpr_iter i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k AND i.role = 'sum'""",
    # the reader at r - 1: its body with the producer's body in place of access a, accesses renumbered
    """INSERT INTO texpr_step SELECT 'derived', c.nid, c.r - 1, c.r_name, c.r_combine,
        array_to_string(list_transform(regexp_extract_all(c.r_body, '#[0-9]+|[^#]+'), lambda x:
            CASE WHEN x[1] <> '#' THEN x WHEN x[2:]::INT < c.a THEN x WHEN x[2:]::INT > c.a
                 THEN '#' || (x[2:]::INT + c.m - 1)::VARCHAR
                 ELSE array_to_string(list_transform(regexp_extract_all(c.p_body, '#[0-9]+|[^#]+'), lambda y:
                     CASE WHEN y[1] = '#' THEN '#' || (y[2:]::INT + c.a)::VARCHAR ELSE y END), '') END), '')
    FROM texpr_c c""",
    "INSERT INTO texpr_iter SELECT 'derived', c.nid, c.r - 1, i.role, i.pos, i.name, i.extent FROM texpr_c c "
    "JOIN texpr_iter i ON i.op = c.op AND i.enode = c.enode AND i.step = c.r",
    "INSERT INTO texpr_iter SELECT 'derived', c.nid, c.r - 1, 'sum', c.r_sums + n.pos, n.new, n.extent "
    "FROM texpr_c c JOIN texpr_ren n USING (nid)",
    # the reader's other accesses, as they were (renumbered past a)
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.r - 1, CASE WHEN a.access < c.a THEN a.access ELSE "
    "a.access + c.m - 1 END, a.tensor, a.pad, a.path FROM texpr_c c JOIN texpr_access a ON a.op = c.op "
    "AND a.enode = c.enode AND a.step = c.r AND a.access <> c.a",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.r - 1, CASE WHEN i.access < c.a THEN i.access ELSE '
    'i.access + c.m - 1 END, i.axis, i."const", i.div, i.exact, i.modulus FROM texpr_c c JOIN texpr_index i '
    "ON i.op = c.op AND i.enode = c.enode AND i.step = c.r AND i.access <> c.a",
    "INSERT INTO texpr_term SELECT 'derived', c.nid, c.r - 1, CASE WHEN t.access < c.a THEN t.access ELSE "
    "t.access + c.m - 1 END, t.axis, t.pos, t.iter, t.coeff, t.floor_div FROM texpr_c c JOIN texpr_term t "
    "ON t.op = c.op AND t.enode = c.enode AND t.step = c.r AND t.access <> c.a",
    # the producer's accesses at a, a + 1, ...: its scope iterators replaced by the reader's indices
    "INSERT INTO texpr_access SELECT 'derived', c.nid, c.r - 1, c.a + a.access, a.tensor, a.pad, "
    "CASE WHEN c.path = '' THEN a.path WHEN a.path = '' THEN c.path ELSE c.path || '/' || a.path END "
    "FROM texpr_c c JOIN texpr_access a ON a.op = c.op AND a.enode = c.enode AND a.step = c.k",
    """CREATE OR REPLACE TEMP TABLE texpr_sub AS
    SELECT c.nid, t.access, t.axis, t.pos, 0 AS sub, coalesce(n.new, t.iter) AS iter, t.coeff, 0 AS add_const
    FROM texpr_c c JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode AND t.step = c.k
    LEFT JOIN texpr_iter s ON s.op = c.op AND s.enode = c.enode AND s.step = c.k AND s.role = 'scope'
        AND s.name = t.iter
    LEFT JOIN texpr_ren n ON n.nid = c.nid AND n.old = t.iter
    WHERE s.name IS NULL
    UNION ALL
    SELECT c.nid, t.access, t.axis, t.pos, coalesce(rt.pos, -1), rt.iter, t.coeff * rt.coeff,
           CASE WHEN coalesce(rt.pos, 0) = 0 THEN t.coeff * ri."const" ELSE 0 END
    FROM texpr_c c JOIN texpr_term t ON t.op = c.op AND t.enode = c.enode AND t.step = c.k
    JOIN texpr_iter s ON s.op = c.op AND s.enode = c.enode AND s.step = c.k AND s.role = 'scope' AND s.name = t.iter
    JOIN texpr_index ri ON ri.op = c.op AND ri.enode = c.enode AND ri.step = c.r AND ri.access = c.a
        AND ri.axis = s.pos
    LEFT JOIN texpr_term rt ON rt.op = c.op AND rt.enode = c.enode AND rt.step = c.r AND rt.access = c.a
        AND rt.axis = s.pos""",
    'INSERT INTO texpr_index SELECT \'derived\', c.nid, c.r - 1, c.a + i.access, i.axis, i."const" + coalesce(('
    "SELECT sum(add_const) FROM texpr_sub u WHERE u.nid = c.nid AND u.access = i.access AND u.axis = i.axis), 0), "
    "1, true, NULL FROM texpr_c c JOIN texpr_index i ON i.op = c.op AND i.enode = c.enode AND i.step = c.k",
    """INSERT INTO texpr_term SELECT 'derived', c.nid, c.r - 1, c.a + g.access, g.axis,
        row_number() OVER (PARTITION BY c.nid, g.access, g.axis ORDER BY g.first) - 1, g.iter, g.coeff, NULL
    FROM texpr_c c JOIN (SELECT nid, access, axis, iter, sum(coeff) AS coeff, min(pos * 1000 + sub) AS first
                         FROM texpr_sub WHERE iter IS NOT NULL GROUP BY ALL) g USING (nid)
    WHERE g.coeff <> 0""",
    *_program_rows(-1),
]

STATEMENTS = {"merge": MERGE, "split-access": SPLIT_ACCESS, "split-summation": SPLIT_SUMMATION}


# -- the rounds -------------------------------------------------------------------------------------------------


@dataclass
class Round:
    """What one round did: per rule, the programs it wrote; how many were kept, duplicates, refuted, unchecked."""

    number: int
    written: dict[str, int] = field(default_factory=dict)
    kept: int = 0
    duplicate: int = 0
    refuted: int = 0
    unchecked: int = 0
    statements: int = 0
    frontier: int = 0
    sql_s: float = 0.0  # the rules' statements
    settle_s: float = 0.0  # distances, canonical forms, the numeric check, the next frontier


@dataclass
class Search:
    """A derivation search: its rounds and the kept programs (enode ids under ``op = 'derived'``)."""

    rounds: list[Round]
    kept: list[int]


def _points(p) -> int:
    worst = 0
    for _, e in p.steps:
        n = 1
        for i in (*e.scope, *e.sums):
            n *= i.extent
        worst = max(worst, n)
    return worst


def search(con, roots, rounds: int = 2, explore: int = 1, beam: int | None = 8, rules=RULES,
           check_elements: int = CHECK_ELEMENTS, draws: int = 2, go_on_unchecked: bool = False) -> Search:
    """Derive from the programs ``roots`` ((op, enode) pairs already in the ``texpr_*`` tables) for ``rounds``
    rounds (see the module doc: ``explore`` rounds unguided, then only programs no farther than their parent;
    at most ``beam`` per root in each frontier, None: no bound). Returns the rounds and the kept programs.
    ``go_on_unchecked``: programs too large for the NumPy check are derived from too (status ``unchecked``;
    for a caller that checks what it uses some other way, e.g. under ONNX Runtime), and returned with them."""
    con.execute(SETUP)
    roots = list(dict.fromkeys((str(o), int(e)) for o, e in roots))
    root_programs = load_many(con, roots)
    seen: dict[tuple, set] = {r: {canonical(p)} for r, p in root_programs.items()}
    first = con.execute(f"SELECT {_BASE}").fetchone()[0]
    frontier = _start(con, [r for r in roots if r in root_programs])
    starts = len(frontier)
    out = Search([], [])
    for number in range(1, rounds + 1):
        if not frontier:
            break
        rnd = Round(number, frontier=len(frontier))
        con.execute("DELETE FROM texpr_frontier")
        con.executemany("INSERT INTO texpr_frontier VALUES (?, ?, ?, ?)", frontier)
        t0 = time.perf_counter()
        con.execute(AXES)
        rnd.statements += 2
        for rule in rules:
            for sql in STATEMENTS[rule]:
                con.execute(sql, {"round": number} if "$round" in sql else None)
            rnd.statements += len(STATEMENTS[rule])
            rnd.written[rule] = con.execute("SELECT count(*) FROM texpr_c").fetchone()[0]
        t1 = time.perf_counter()
        frontier = _settle(con, rnd, root_programs, seen, number > explore, beam, check_elements, draws,
                           go_on_unchecked)
        rnd.sql_s, rnd.settle_s = t1 - t0, time.perf_counter() - t1
        out.rounds.append(rnd)
    statuses = ["kept", "unchecked"] if go_on_unchecked else ["kept"]
    out.kept = [e for e, in con.execute("SELECT enode FROM texpr_derived WHERE enode > ? AND status IN "
                                         "(SELECT unnest(?::VARCHAR[])) ORDER BY enode",
                                         [first + starts, statuses]).fetchall()]
    con.execute("DROP TABLE IF EXISTS texpr_new")
    for t in ("texpr_c", "texpr_map", "texpr_used", "texpr_sp", "texpr_spa", "texpr_spx", "texpr_cf", "texpr_cx",
              "texpr_cs", "texpr_ren", "texpr_sub", "texpr_ax"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return out


def _settle(con, rnd: Round, root_programs, seen, converging: bool, beam, check_elements, draws,
            go_on_unchecked: bool = False) -> list[tuple]:
    """The round's new programs: distances (SQL), duplicates and the numeric check (per program), the next
    frontier; duplicate and refuted programs' rows deleted."""
    _new(con, [e for e, in con.execute("SELECT enode FROM texpr_derived WHERE round = ? AND status IS NULL",
                                       [rnd.number]).fetchall()])
    _distances(con)
    rows = con.execute("SELECT d.enode, d.root_op, d.root_enode, d.parent_op, d.parent_enode, d.distance, p.distance "
                       "FROM texpr_derived d LEFT JOIN texpr_derived p ON d.parent_op = 'derived' "
                       "AND p.enode = d.parent_enode WHERE d.status IS NULL ORDER BY d.enode").fetchall()
    programs = load_many(con, [("derived", r[0]) for r in rows])
    status: dict[int, str] = {}
    forms: dict = {}
    for enode, root_op, root_enode, parent_op, parent_enode, distance, _ in rows:
        root = (root_op, root_enode)
        c = forms[enode] = canonical(programs[("derived", enode)])
        if c in seen[root]:
            status[enode] = "duplicate"
            continue
        seen[root].add(c)
        if max(_points(c), _points(root_programs[root])) > check_elements:
            status[enode] = "unchecked"
        else:
            status[enode] = "kept" if equivalent(root_programs[root], c, draws=draws) else "refuted"
    if status:
        con.executemany("UPDATE texpr_derived SET status = ? WHERE enode = ?", [(s, e) for e, s in status.items()])
    for s in ("kept", "duplicate", "refuted", "unchecked"):
        setattr(rnd, s, sum(1 for v in status.values() if v == s))
    con.execute("DELETE FROM texpr_new WHERE enode NOT IN (SELECT enode FROM texpr_derived "
                "WHERE status IN ('duplicate', 'refuted'))")
    for t in TABLES:
        con.execute(f"DELETE FROM {t} WHERE op = 'derived' AND enode IN (SELECT enode FROM texpr_new)")
    kept = [r for r in rows if status[r[0]] == "kept" or (go_on_unchecked and status[r[0]] == "unchecked")]
    # stored canonical (the rules then see one naming and factor order); rows already so are left as written
    _store_canonical(con, {r[0]: forms[r[0]] for r in kept if forms[r[0]] != programs[("derived", r[0])]})
    if converging:
        kept = [r for r in kept if r[6] is None or r[5] <= r[6]]  # no farther than a derived parent
    by_root: dict = {}
    for r in sorted(kept, key=lambda r: (r[5], r[0])):
        by_root.setdefault((r[1], r[2]), []).append(r)
    nxt = [("derived", r[0], r[1], r[2]) for rs in by_root.values() for r in (rs if beam is None else rs[:beam])]
    return sorted(nxt, key=lambda f: f[1])


def _distances(con) -> None:
    """The expression distance of the programs in ``texpr_new`` (0 for one with no non-plain access)."""
    con.execute(f"UPDATE texpr_derived d SET distance = coalesce(x.distance, 0) FROM texpr_new n "
                f"LEFT JOIN ({DISTANCE_SQL}) x USING (op, enode) WHERE d.enode = n.enode")


def _new(con, enodes) -> None:
    """``texpr_new``: the derived programs ``enodes`` (what the next statements work on)."""
    con.execute("CREATE OR REPLACE TEMP TABLE texpr_new AS SELECT 'derived' AS op, unnest(?::BIGINT[]) AS enode",
                [list(enodes)])


def _write_programs(con, programs: dict[int, tuple]) -> None:
    """The rows of derived programs (enode -> (e-class, program)), one insert per table."""
    rows: dict[str, list] = {t: [] for t in TABLES}
    for enode, (eclass, p) in programs.items():
        for t, r in rows_of("derived", enode, eclass, p).items():
            rows[t] += r
    write(con, rows, replace=False)


def _store_canonical(con, programs: dict[int, object]) -> None:
    """Replace the rows of derived programs by their canonical forms' (the rules then see every program in one
    naming and factor order, as tensor_derive.derive does)."""
    if not programs:
        return
    _new(con, programs)
    eclass = dict(con.execute("SELECT enode, eclass FROM texpr_program JOIN texpr_new USING (op, enode)").fetchall())
    for t in TABLES:
        con.execute(f"DELETE FROM {t} WHERE op = 'derived' AND enode IN (SELECT enode FROM texpr_new)")
    _write_programs(con, {e: (eclass.get(e), p) for e, p in programs.items()})


def _start(con, roots: list) -> list[tuple]:
    """Each root's canonical form as a derived program of round 0 (status ``kept``, rule ``canonical``): the
    search's first frontier."""
    base = con.execute(f"SELECT {_BASE}").fetchone()[0]
    programs = load_many(con, roots)
    eclass = {(o, e): c for o, e, c in con.execute("SELECT op, enode, eclass FROM texpr_program "
                                                   "WHERE op <> 'derived'").fetchall()}
    rows, start = [], {}
    for enode, root in enumerate((r for r in roots if r in programs), start=base + 1):
        rows.append((enode, root[0], root[1], root[0], root[1], "canonical", 0, None, "kept"))
        start[enode] = (eclass.get(root), canonical(programs[root]))
    if rows:
        con.executemany("INSERT INTO texpr_derived VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    _write_programs(con, start)
    _new(con, start)
    _distances(con)
    return [("derived", row[0], row[1], row[2]) for row in rows]


def ensure_tables(con) -> None:
    """The ``texpr_*`` tables, made if missing (``lower_egraph`` makes them anew)."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'texpr_program'").fetchone()[0]:
        con.execute(DDL)
