"""Searched derivations inside ``relsat optimize`` (``--derive-search ROUNDS``, issue 28 item 2).

Where ``derive`` and ``derive_blocks`` find their sites by structure and constants, this runs EinNet's
derivation rules blindly over the model's contraction nodes, as SQL in rounds (relations/tensor_rounds.py),
and offers what they reach to the e-graph:

1. every ``Conv``, ``ConvTranspose``, ``MatMul``, ``Gemm`` and ``Einsum`` node whose inputs have static shapes
   is lowered to a tensor-expression program (relations/tensor_lower.py) and written into the ``texpr_*``
   tables on the e-graph's own connection (``op = 'node'``, ``enode`` = the node's position, ``eclass`` = the
   e-class of its output), so a saved e-graph shows them and everything derived from them;
2. one search from all of them at once (``tensor_rounds.search``: ``ROUNDS`` rounds, a beam per node, each
   derived program checked against its node numerically where the NumPy check is small enough, derived from
   unchecked otherwise: what is used is checked under ONNX Runtime below);
3. per node, the nearest derived programs (by expression distance) that match ONNX operators other than the
   node itself (relations/tensor_match.py; steps over constants folded into initializers) are checked under
   ONNX Runtime against the node on the model's values and random draws (``derive.check``);
4. up to ``ALTERNATIVES`` derived models (the k-th alternative of every node in the k-th) are imported into the
   same e-graph and each node's result unioned with its derived form's: extraction prices them like any
   rewrite, and the written model is verified against the input as always.

On a CPU the forms reached (a convolution as an Einsum over channels plus a sum of shifted slices, the
seed's motivating example; operands gathered into MatMul layouts) run slower than ONNX Runtime's own kernels
(issue 28's measurements), so the costs normally keep the original: the option exists for providers and
models where they do not, and for looking at the derivations in the saved e-graph.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import onnx
from onnx import helper

from relsat.relations import tensor_rounds, tensor_tables
from relsat.relations.tensor_lower import NotLowerable, lower
from relsat.relations.tensor_match import NoMatch, match

from .derive import Chain, Derivation, _constants, check, static

OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum")
ALTERNATIVES = 2  # derived forms per node offered to the e-graph
BEAM = 4  # programs per node kept in each round's frontier
CHECK_ELEMENTS = 2_000_000  # iteration points the search's NumPy check evaluates at most per step


@dataclass
class Site:
    index: int  # the node's position in the graph
    node: onnx.NodeProto
    chain: Chain


def sites(model: onnx.ModelProto, types: dict) -> list[Site]:
    """The nodes the search starts from: contractions with static shapes, in the default domain."""
    const = _constants(model.graph)
    out = []
    for k, n in enumerate(model.graph.node):
        if n.op_type not in OPS or n.domain not in ("", "ai.onnx") or not n.output or not n.output[0]:
            continue
        ins = [i for i in n.input if i]
        if not static(types, ins) or all(i in const for i in ins):
            continue
        out.append(Site(k, n, Chain([n], n.output[0], "", [i for i in ins if i in const],
                                    [i for i in ins if i not in const], kind="search")))
    return out


def _program(site: Site, types: dict):
    attrs = {a.name: helper.get_attribute_value(a) for a in site.node.attribute}
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    inputs = [(i, tuple(types[i][1])) for i in site.node.input if i]
    return lower(site.node.op_type, attrs, inputs)


def search(con, model: onnx.ModelProto, types: dict, eclass_of: dict, values: dict, rounds: int, threads: int,
           seed: int = 0) -> tuple[list[list[tuple[Chain, Derivation]]], list[tuple[str, str]], dict]:
    """The checked alternatives, by rank (``[k]``: the k-th alternative of each node that has one), the nodes
    skipped with why, and the search's figures (roots, programs kept per round, seconds)."""
    t0 = time.perf_counter()
    found = sites(model, types)
    rows: dict[str, list] = {t: [] for t in tensor_tables.TABLES}
    lowered, skipped = {}, []
    for s in found:
        try:
            p = _program(s, types)
        except NotLowerable as e:
            skipped.append((s.chain.root, f"not lowered: {e}"))
            continue
        lowered[s.index] = s
        for t, r in tensor_tables.rows_of("node", s.index, eclass_of.get(s.chain.root), p).items():
            rows[t] += r
    tensor_rounds.ensure_tables(con)
    con.execute("DELETE FROM texpr_program WHERE op = 'node'")
    tensor_tables.write(con, rows, replace=False)
    result = tensor_rounds.search(con, [("node", k) for k in lowered], rounds=rounds, beam=BEAM,
                                  check_elements=CHECK_ELEMENTS, go_on_unchecked=True)
    searched = time.perf_counter() - t0
    kept = con.execute("SELECT root_enode, enode, distance FROM texpr_derived WHERE status IN ('kept', 'unchecked') "
                       "AND rule <> 'canonical' AND root_op = 'node' ORDER BY root_enode, distance, enode").fetchall()
    programs = tensor_tables.load_many(con, [("derived", e) for _, e, _ in kept])
    ranked: list[list[tuple[Chain, Derivation]]] = [[] for _ in range(ALTERNATIVES)]
    taken: dict[int, int] = {}
    for root, enode, distance in kept:
        s = lowered[root]
        if taken.get(root, 0) >= ALTERNATIVES:
            continue
        t1 = time.perf_counter()
        consts = {n: values[n] for n in s.chain.consts if n in values}
        try:
            nodes, inits = match(programs[("derived", enode)], s.chain.root, consts, prefix=f"{s.chain.root}.d{enode}")
        except NoMatch:
            continue
        ops: dict[str, int] = {}
        for n in nodes:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        if set(ops) <= {s.node.op_type, "Identity"}:
            continue  # the node itself again
        err = check(s.chain, nodes, inits, values, threads, seed)
        if isinstance(err, str):
            skipped.append((s.chain.root, f"derived program {enode}: {err}"))
            continue
        how = con.execute("""WITH RECURSIVE up(enode, parent_op, parent_enode, rule) AS (
                SELECT enode, parent_op, parent_enode, rule FROM texpr_derived WHERE enode = ?
                UNION ALL SELECT d.enode, d.parent_op, d.parent_enode, d.rule FROM texpr_derived d
                JOIN up ON up.parent_op = 'derived' AND d.enode = up.parent_enode)
            SELECT list(rule ORDER BY enode) FROM up WHERE rule <> 'canonical'""", [enode]).fetchall()[0][0]
        detail = (f"derived program {enode} ({', '.join(how)}; expression distance {distance}) of "
                  f"{s.node.op_type} {s.node.name or s.chain.root}")
        d = Derivation(s.chain.root, "search", [s.node.name or s.chain.root], ops, detail, float(err),
                       time.perf_counter() - t1, nodes, [*inits])
        ranked[taken.get(root, 0)].append((s.chain, d))
        taken[root] = taken.get(root, 0) + 1
    figures = {"roots": len(lowered), "rounds": [{"round": r.number, "frontier": r.frontier, "written": r.written,
                                                  "kept": r.kept, "duplicate": r.duplicate, "refuted": r.refuted,
                                                  "unchecked": r.unchecked, "statements": r.statements,
                                                  "sql_s": round(r.sql_s, 3), "settle_s": round(r.settle_s, 3)}
                                                 for r in result.rounds],
               "search_seconds": round(searched, 3), "seconds": round(time.perf_counter() - t0, 3)}
    return [r for r in ranked if r], skipped, figures
