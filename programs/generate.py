"""``relsat rules generate``: candidate rules from fingerprint groups, pruned, verified, proved, written.

The pipeline (TASO's, over relsat's catalog and rule language):

1. ``enumerate_family`` (``programs.enumerate``) gives every term of up to ``max_ops``
   operators of each family and the candidates ``member = representative`` of each
   fingerprint group.
2. Each candidate becomes a rule (``member => representative``; ``<=>`` when both sides have
   the same size and variables), with the conditions that make its variables an instance of
   the family's templates: ranks, equal dims, weights const.  Candidates that cannot be
   written are dropped and counted (a right side needing a variable or attribute the left
   side does not bind, a split size no variable's dim spells).
3. Pruning: renaming interchangeable variables (one canonical spelling per rule), and
   TASO's common-subgraph test (a rule whose sides share a subterm that a fresh variable can
   stand for, when the rule with that variable is itself a candidate).
4. Multi-pattern candidates: every candidate ``Concat(t1, t2) = T`` whose two operands share
   a variable gives ``t1, t2 => Split(T)``: two operators over a shared input merged into one
   followed by a Split (TENSAT's multi-pattern rules).
5. Verification: ``programs.verify.check_rule`` (both sides under ONNX Runtime on random
   shapes and data that satisfy the conditions) on every rule, in worker processes: first the
   rule without the family's shape conditions (ranks, equal dims), kept in that general form
   when ``GENERAL_TRIALS`` instances of any rank and broadcast agree, else the rule with them.
   Then a proof with z3 against TASO's operator properties where the fragment allows
   (``programs.prove``), marking each rule ``proved`` or ``tested``.
6. Rules that restate a hand-written rule are reported, not written; so are rules that are instances of
   another written rule (``programs.subsume``: the same rewrite over a subset of its matches), and a ``<=>``
   rule one direction of which is such an instance is written as the other direction alone. The rest go to
   the output file, with a header giving the command, the families and the counts.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from .enumerate import Enumeration, enumerate_family
from .universe import ASSIGNMENTS, FAMILIES, Family

MAX_OPS = 3  # default size bound (operators per side)
TRIALS = 5  # random instances per rule in verification


@dataclass
class Generated:
    """A generated rule: its text (one rule, maybe ``<=>``), and what became of it."""

    name: str
    text: str  # the rule as written: ``general`` when that verified, else ``strict``
    family: str
    multi: bool = False
    strict: str = ""  # the rule with every template condition (ranks, equal dims)
    general: bool = False  # the rule holds without the template's shape conditions
    verdict: str = ""  # "" until verified; "ok" | the failure message
    proof: str = "tested"  # "proved" | "tested"
    proof_reason: str = ""
    duplicate_of: str | None = None
    instance_of: str | None = None  # every direction is an instance of this other written rule (``subsume``)


@dataclass
class Report:
    command: str
    max_ops: int
    families: list[str]
    counts: Counter = field(default_factory=Counter)
    seconds: dict = field(default_factory=dict)
    rules: list[Generated] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)  # why candidates were not written as rules

    @property
    def kept(self) -> list[Generated]:
        return [r for r in self.rules if r.verdict == "ok" and r.duplicate_of is None and r.instance_of is None]


# ---------------------------------------------------------------- terms as trees


class _Terms:
    """Trees of an enumeration's terms: ("L", leaf name) or (op index, children...), with their term ids."""

    def __init__(self, e: Enumeration):
        self.e, self.f = e, e.family
        self.memo: dict[int, tuple] = {}

    def tree(self, t: int) -> tuple:
        if t not in self.memo:
            e = self.e
            if e.op[t] < 0:
                self.memo[t] = ("L", self.f.leaves[int(e.kid[t, 0])].name)
            else:
                o = self.f.ops[int(e.op[t])]
                kids = tuple(self.tree(int(k)) for k in e.kid[t, :o.arity])
                self.memo[t] = (int(e.op[t]), t) + kids
        return self.memo[t]

    def leaves(self, tree) -> list[str]:
        """Leaf names in first-occurrence order, an operator's fixed extra inputs included."""
        out: list[str] = []

        def walk(n):
            if n[0] == "L":
                out.append(n[1]) if n[1] not in out else None
                return
            for c in n[2:]:
                walk(c)
            for x in self.f.ops[n[0]].extra:
                out.append(x) if x not in out else None
        walk(tree)
        return out

    def subtrees(self, tree) -> dict[int, tuple]:
        out = {}

        def walk(n):
            if n[0] != "L":
                out[n[1]] = n
                for c in n[2:]:
                    walk(c)
        walk(tree)
        return out

    def ops(self, tree) -> list:
        return [self.f.ops[n[0]] for n in self.subtrees(tree).values()]


def _renaming(f: Family, order: list[str]) -> dict[str, str]:
    """Interchangeable leaves (same kind) renamed by first occurrence: one spelling per rule."""
    pools: dict[tuple, list[str]] = {}
    for leaf in f.leaves:
        if not leaf.fixed:
            pools.setdefault(leaf.kind, []).append(leaf.name)
    used: Counter = Counter()
    out = {}
    for name in order:
        leaf = f.by_leaf[name]
        if leaf.fixed:
            out[name] = name
            continue
        out[name] = pools[leaf.kind][used[leaf.kind]]
        used[leaf.kind] += 1
    return out


def _spell(f: Family, n, names: dict[str, str]) -> str:
    """The rule text of a tree (split sizes as ?n_SYMBOL variables)."""
    if n[0] == "L":
        return "?" + names[n[1]]
    o = f.ops[n[0]]
    kids = [_spell(f, c, names) for c in n[2:]] + ["?" + names.get(x, x) for x in o.extra]
    if o.split:
        axis, s1, s2 = o.split
        inner = f"(Split :axis {axis} :split (?n_{s1} ?n_{s2}) {' '.join(kids)})"
        return f"(getitem {o.index} {inner})"
    attrs = (" " + o.attrs) if o.attrs else ""
    return f"({o.op}{attrs} {' '.join(kids)})"


def _key(T: _Terms, lhs, rhs, *, loose: bool = False) -> str:
    """The rule up to renaming interchangeable variables and to commutativity and associativity of
    Add and Mul (operands sorted; nested Concats on one axis flattened), either direction:
    candidates with one key are one rule.  ``loose``: variables told apart by role only (data or
    weight), not shape, and ``_G`` (a generalised subterm) is data."""
    f = T.f
    used = T.leaves(lhs) + [x for x in T.leaves(rhs) if x not in T.leaves(lhs)]

    def kind(x):
        if x == "_G":
            return "data"
        leaf = f.by_leaf[x]
        return leaf.role if loose else leaf.kind

    pools: dict = {}
    for x in used:
        if x == "_G" or not f.by_leaf[x].fixed:
            pools.setdefault(kind(x), []).append(x)
    best = None
    for perms in itertools.product(*(itertools.permutations(v) for v in pools.values())):
        names = {x: x for x in used}
        for k, perm in zip(pools, perms):
            names.update((x, f"{k}{i}") for i, x in enumerate(perm))
        a, b = _ac(f, lhs, names), _ac(f, rhs, names)
        key = min(a + " = " + b, b + " = " + a)
        best = key if best is None or key < best else best
    return best


def _replace(n, target: int, leaf: str):
    if n[0] == "L":
        return n
    if n[1] == target:
        return ("L", leaf)
    return n[:2] + tuple(_replace(c, target, leaf) for c in n[2:])


def _ac(f: Family, n, names: dict) -> str:
    """A tree's spelling with nested Add (Mul) flattened and their operands sorted, and nested
    Concats on one axis flattened."""
    if n[0] == "L":
        return str(names[n[1]])
    o = f.ops[n[0]]
    if o.op in ("Add", "Mul", "Concat"):
        items = []

        def flat(m):
            if m[0] != "L" and f.ops[m[0]].key == o.key:
                for c in m[2:]:
                    flat(c)
            else:
                items.append(_ac(f, m, names))
        flat(n)
        return f"{o.key}[{' '.join(sorted(items) if o.op != 'Concat' else items)}]"
    return f"{o.key}({' '.join(_ac(f, c, names) for c in n[2:])})"


def _is_ac_axiom(f: Family, lhs) -> bool:
    """Commutativity or associativity itself: one operator, Add, Mul or Concat, over distinct leaves."""
    ops, leaves = set(), []

    def walk(n):
        if n[0] == "L":
            leaves.append(n[1])
            return
        ops.add(f.ops[n[0]].key)
        for c in n[2:]:
            walk(c)
    walk(lhs)
    return len(ops) == 1 and len(leaves) == len(set(leaves)) <= 3 and \
        f.ops[lhs[0]].op in ("Add", "Mul", "Concat")


# ---------------------------------------------------------------- conditions


def _dim_refs(f: Family, leaves: list[str]) -> dict[str, str]:
    """symbol -> ``(dim ?leaf i)`` of the first leaf that has it."""
    refs = {}
    for name in leaves:
        for i, d in enumerate(f.by_leaf[name].shape):
            if isinstance(d, str):
                refs.setdefault(d, f"(dim ?{name} {i})")
    return refs


def _conditions(f: Family, leaves: list[str]) -> list[str]:
    """Ranks, equal dims and const-ness that make ``leaves`` an instance of the family's templates."""
    out, refs, seen = [], _dim_refs(f, leaves), {}
    for name in leaves:
        leaf = f.by_leaf[name]
        out.append(f"(rank ?{name} {len(leaf.shape)})")
        if leaf.shape and leaf.shape in seen:
            out.append(f"(same-shape ?{name} ?{seen[leaf.shape]})")
        else:
            seen.setdefault(leaf.shape, name)
            for i, d in enumerate(leaf.shape):
                if isinstance(d, int):
                    out.append(f"(= (dim ?{name} {i}) {d})")
                elif refs[d] != f"(dim ?{name} {i})":
                    out.append(f"(= (dim ?{name} {i}) {refs[d]})")
        if leaf.const:
            out.append(f"(const ?{name})")
    return out


def _split_syms(T: _Terms, tree) -> list[str]:
    return [s for o in T.ops(tree) if o.split for s in o.split[1:]]


def _rule_text(T: _Terms, name: str, lhs, rhs, both: bool) -> tuple[str | None, str]:
    """(the rule, "") or (None, why it cannot be written)."""
    f = T.f
    left, right = T.leaves(lhs), T.leaves(rhs)
    if not set(right) <= set(left):
        return None, "the right side has a variable the left side does not bind"
    lparams = {p for o in T.ops(lhs) for p in o.params}
    if not {p for o in T.ops(rhs) for p in o.params} <= lparams:
        return None, "the right side has an attribute the left side does not bind"
    names = _renaming(f, left)  # interchangeable leaves have one template: the same symbols
    left = [names[x] for x in left]
    refs = _dim_refs(f, left)
    lsyms, rsyms = _split_syms(T, lhs), _split_syms(T, rhs)
    if any(s not in refs for s in lsyms + rsyms):
        return None, "a split size that no variable's dim spells"
    if both and set(rsyms) != set(lsyms):
        both = False
    conds = [f"(let ?n_{s} {refs[s]})" for s in dict.fromkeys(rsyms) if s not in lsyms]
    conds += [f"(= ?n_{s} {refs[s]})" for s in dict.fromkeys(lsyms)]
    arrow = "<=>" if both else "=>"
    text = f"{name}: {_spell(f, lhs, names)} {arrow} {_spell(f, rhs, names)}"
    return _with_conditions(text, conds, _conditions(f, left)), ""


def _with_conditions(text: str, conds: list[str], shape: list[str]) -> tuple[str, str]:
    """(the rule with only its split and const conditions, the rule with every template condition):
    verification tries the general one first."""
    general = conds + [c for c in shape if c.startswith("(const")]
    return tuple(text + ("\n    if " + " ".join(c) if c else "") for c in (general, conds + shape))


def _multi_text(T: _Terms, name: str, lhs, rhs) -> tuple[str | None, str]:
    """``Concat(t1, t2) = T`` as the multi-pattern rule ``t1, t2 => getitem i (Split T)``."""
    f, concat = T.f, T.f.ops[lhs[0]]
    axis = int(concat.attrs.split()[-1])
    t1, t2 = lhs[2], lhs[3]
    if t1[0] == "L" or t2[0] == "L" or t1 == t2 or rhs[0] == "L" or f.ops[rhs[0]].op == "Concat":
        return None, ""
    # two operators over a shared input merged into one operator of the same kind over concatenated inputs:
    # one concatenation, or two of weights only (they fold at export)
    same = f.ops[t1[0]].op == f.ops[t2[0]].op == f.ops[rhs[0]].op and T.e.size[t1[1]] == T.e.size[t2[1]] == 1
    concats = [n for n in T.subtrees(rhs).values() if n is not rhs]
    weights = all(f.ops[n[0]].op == "Concat" and all(c[0] == "L" and f.by_leaf[c[1]].const for c in n[2:])
                  for n in concats)
    if not (same and set(T.leaves(t1)) & set(T.leaves(t2)) and
            (len(concats) == 1 and f.ops[concats[0][0]].op == "Concat" or len(concats) == 2 and weights)):
        return None, ""
    names = _renaming(f, T.leaves(lhs))
    if not set(T.leaves(rhs)) <= set(names):
        return None, "the right side has a variable the left side does not bind"
    left = list(names.values())
    refs = _dim_refs(f, left)
    sizes = []
    for t in (t1, t2):
        values = tuple(T.e.classes[int(T.e.cls[t[1]])][k][axis] for k in range(ASSIGNMENTS))
        sym = f.symbol(values)
        if sym is None or sym not in refs:
            return None, "a split size that no variable's dim spells"
        sizes.append(sym)
    if _split_syms(T, lhs) or _split_syms(T, rhs):
        return None, "a split inside a merge"
    body = _spell(f, rhs, names)
    split = f"(Split :axis {axis} :split (?m1 ?m2) {body})"
    conds = [f"(let ?m1 {refs[sizes[0]]})", f"(let ?m2 {refs[sizes[1]]})"]
    text = (f"{name}: {_spell(f, t1, names)}, {_spell(f, t2, names)}\n    => (getitem 0 {split}),\n"
            f"       (getitem 1 {split})")
    return _with_conditions(text, conds, _conditions(f, left)), ""


# ---------------------------------------------------------------- the pipeline


def candidates(family: Family, max_ops: int, report: Report, *, seed: int = 0) -> list[Generated]:
    """Steps 1-4 for one family: the rules to verify."""
    e = enumerate_family(family, max_ops, seed=seed)
    report.seconds[f"enumerate {family.name}"] = e.seconds
    c = report.counts
    c["terms enumerated"] += len(e.op)
    c["fingerprint groups"] += e.groups
    T = _Terms(e)
    pairs = [(T.tree(int(t)), T.tree(int(e.rep[t]))) for t in e.candidates]
    c["candidate pairs"] += len(pairs)
    keys = [_key(T, lhs, rhs) for lhs, rhs in pairs]
    loose = {_key(T, lhs, rhs, loose=True) for lhs, rhs in pairs}
    seen: set[str] = set()
    out: list[Generated] = []
    multi_seen: set[str] = set()
    for (lhs, rhs), key in zip(pairs, keys):
        if all(family.by_leaf[x].const for x in T.leaves(lhs)):
            report.dropped["weights only (constant folding's job)"] += 1
            continue
        if key in seen:
            report.dropped["a renaming of another candidate (or the same up to AC)"] += 1
            continue
        seen.add(key)
        ac_l, ac_r = key.split(" = ")
        if ac_l == ac_r and not _is_ac_axiom(family, lhs):
            report.dropped["commutativity and associativity of Add and Mul"] += 1
            continue
        if _implied_by_general(T, lhs, rhs, loose):
            report.dropped["a common subgraph: an instance of a smaller candidate"] += 1
            continue
        size_l, size_r = int(e.size[lhs[1]]), (0 if rhs[0] == "L" else int(e.size[rhs[1]]))
        both = size_l == size_r and rhs[0] != "L" and set(T.leaves(lhs)) == set(T.leaves(rhs))
        name = f"{family.name}-{len(out) + 1:04d}"
        texts, why = _rule_text(T, name, lhs, rhs, both)
        if texts is None:
            report.dropped[why] += 1
        else:
            out.append(Generated(name, texts[0], family.name, strict=texts[1]))
        if family.ops[lhs[0]].op == "Concat":
            mname = f"{family.name}-merge-{sum(g.multi for g in out) + 1:03d}"
            mtexts, _ = _multi_text(T, mname, lhs, rhs)
            patterns = mtexts and mtexts[0].split("\n")[0].split(": ", 1)[1]
            if mtexts is not None and patterns not in multi_seen:  # one merge per pair of patterns
                multi_seen.add(patterns)
                out.append(Generated(mname, mtexts[0], family.name, multi=True, strict=mtexts[1]))
    c["after pruning"] += sum(not g.multi for g in out)
    c["multi-pattern candidates"] += sum(g.multi for g in out)
    return out


def _implied_by_general(T: _Terms, lhs, rhs, loose: set[str]) -> bool:
    """TASO's common-subgraph pruning, and instances of smaller rules: a subterm on both sides
    replaced by a fresh variable gives a candidate (up to renaming, whatever its shape), of
    which this one is an instance."""
    common = set(T.subtrees(lhs)) & set(T.subtrees(rhs))
    return any(_key(T, _replace(lhs, t, "_G"), _replace(rhs, t, "_G"), loose=True) in loose for t in common)


GENERAL_TRIALS = 30  # instances a rule without the template's shape conditions must pass (10 let nine rules through
# that fail on a broadcast operand, matrix-1009 among them: the fuzzer crashed on it, seed 2032 model 536)
DRAWS = 150  # draws per rule before it counts as uncheckable
PROOF_MS = 1000  # z3's time per rule


def _check_text(text: str, trials: int) -> tuple[str, list]:
    """("ok", core rules) or (why not, [])."""
    from .parser import parse_rules
    from .verify import check_rule

    try:
        rules = parse_rules(text).rules
    except Exception as e:  # a candidate the rule language rejects
        return f"does not parse: {e}", []
    for r in rules:
        v = check_rule(r, trials=trials, draws=DRAWS)
        if not v.ok:
            return (v.skipped and f"cannot be checked: {v.skipped}") or v.message, []
    return "ok", list(rules)


def _check_one(general: str, strict: str, trials: int, prove: bool) -> tuple[str, bool, str, str]:
    """(verdict, whether the general form holds, proof, reason) of one candidate: the rule without the
    template's shape conditions first (more instances), else with them."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # a rejected draw's ONNX Runtime error is in the verdict already
    verdict, rules = _check_text(general, max(trials, GENERAL_TRIALS))
    is_general = verdict == "ok"
    if not is_general and strict != general:
        verdict, rules = _check_text(strict, trials)
    if verdict != "ok" or not prove:
        return verdict, is_general, "tested", "" if verdict != "ok" else "not attempted"
    from .prove import prove_rule

    proofs = [prove_rule(r, timeout_ms=PROOF_MS) for r in rules]
    if all(p.status == "proved" for p in proofs):
        return "ok", is_general, "proved", proofs[0].reason
    return "ok", is_general, "tested", next(p.reason for p in proofs if p.status != "proved")


def _check_chunk(chunk: list[tuple]) -> list[tuple[str, bool, str, str]]:
    return [_check_one(*a) for a in chunk]


def verify(rules: list[Generated], *, jobs: int = 2, trials: int = TRIALS, prove: bool = True,
           progress=lambda done, total: None) -> None:
    """Check every rule (and prove it where it can be) in ``jobs`` worker processes; ``progress(done, total)``
    hears how many rules are checked so far (first ``(0, total)``, last ``(total, total)``)."""
    items = [(g.text, g.strict or g.text, trials, prove) for g in rules]
    total = len(rules)
    progress(0, total)
    results: list = [None] * total
    if jobs <= 1:
        for i, a in enumerate(items):
            results[i] = _check_one(*a)
            progress(i + 1, total)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:  # chunks of 8, counted as each chunk ends
            chunks = {pool.submit(_check_chunk, items[i:i + 8]): i for i in range(0, total, 8)}
            done = 0
            try:
                for f in as_completed(chunks):
                    chunk = f.result()
                    results[chunks[f]:chunks[f] + len(chunk)] = chunk
                    done += len(chunk)
                    progress(done, total)
            except BaseException:  # Ctrl-C or a failed chunk: the chunks not begun are not run
                pool.shutdown(cancel_futures=True)
                raise
    for g, (verdict, general, proof, reason) in zip(rules, results):
        g.verdict, g.general, g.proof, g.proof_reason = verdict, general, proof, reason
        if verdict == "ok" and not general:
            g.text = g.strict


def generate(*, max_ops: int = MAX_OPS, families=tuple(FAMILIES), jobs: int = 2, trials: int = TRIALS,
             prove: bool = True, command: str = "", seed: int = 0, status=lambda text: None,
             progress=lambda done, total: None) -> Report:
    """Steps 1-6 over ``families``; ``status(text)`` hears each step as it begins, ``progress(done, total)``
    the rules verified so far in the long step (verification)."""
    report = Report(command, max_ops, list(families))
    t0 = time.perf_counter()
    rules: list[Generated] = []
    for name in families:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r} (one of {', '.join(FAMILIES)})")
        status(f"enumerating {name} up to {max_ops} operators ...")
        rules += candidates(FAMILIES[name](), max_ops, report, seed=seed)
    report.seconds["enumerate and prune"] = time.perf_counter() - t0
    status(f"verifying {len(rules)} rules under ONNX Runtime ...")
    t1 = time.perf_counter()
    verify(rules, jobs=jobs, trials=trials, prove=prove, progress=progress)
    report.seconds["verify and prove"] = time.perf_counter() - t1
    _mark_duplicates(rules)
    one_way = _mark_instances(rules)
    report.rules = rules
    c = report.counts
    c["verified"] = sum(g.verdict == "ok" and not g.multi for g in rules)
    c["verified multi-pattern"] = sum(g.verdict == "ok" and g.multi for g in rules)
    c["failed verification"] = sum(g.verdict != "ok" for g in rules)
    c["duplicates of hand-written rules"] = sum(g.duplicate_of is not None for g in rules if g.verdict == "ok")
    c["instances of other generated rules"] = sum(g.instance_of is not None for g in rules if g.verdict == "ok")
    c["written one way only (the other an instance)"] = one_way
    c["written"] = len(report.kept)
    c["written multi-pattern"] = sum(g.multi for g in report.kept)
    c["proved"] = sum(g.proof == "proved" for g in report.kept)
    report.seconds["total"] = time.perf_counter() - t0
    return report


def _shape_key(rule) -> str:
    """A core rule's sides up to variable names (conditions left out): what makes two rules the same rewrite."""
    from .checker import ECLASS, variables
    from .compiler import _rename
    from .parser import format_term

    sides = rule.patterns + rule.rhs
    order = dict.fromkeys(v.name for side in sides for v, _ in variables(side, ECLASS))
    sigma = {name: f"v{i}" for i, name in enumerate(order)}
    spell = [format_term(_rename(side, sigma)) for side in sides]
    return " ; ".join(spell[:len(rule.patterns)]) + " => " + " ; ".join(spell[len(rule.patterns):])


def _mark_duplicates(rules: list[Generated]) -> None:
    """Mark generated rules that restate a hand-written rule of the shipped sets."""
    from .parser import load_rules, parse_rules
    from .rules import RULES_DIR

    hand: dict[str, str] = {}
    named: list[tuple[bool, str, str]] = []  # (conditional, shape key, set:name)
    for path in sorted(RULES_DIR.glob("*.rules")):
        if path.stem == "generated":
            continue
        named += [(bool(r.conditions), _shape_key(r), f"{path.stem}:{r.name}") for r in load_rules(path).rules]
    for _, key, name in sorted(named, key=lambda t: t[0]):  # an unconditional statement is named first
        hand.setdefault(key, name)
    for g in rules:
        if g.verdict != "ok":
            continue
        g.duplicate_of = next((hand[k] for k in map(_shape_key, parse_rules(g.text).rules) if k in hand), None)


def _mark_instances(rules: list[Generated]) -> int:
    """Step 6, second half: a verified rule each of whose directions is an instance of another written rule
    (``programs.subsume``: the same rewrite over fewer matches) is marked and not written; a ``<=>`` rule with one
    direction such an instance is written as the other direction alone (``NAME: l => r`` or ``NAME-rev: r => l``).
    Left in, they cost a match statement each wherever they can match and add nothing (924 of the 2,543 directed
    rules of the shipped file of 2026-11-23: renamings that became the same once the shape conditions were dropped,
    the same rule found in both families, ``?x ?x`` beside ``?x ?y``). Returns the rules written one way only."""
    from .parser import format_rule, parse_rules
    from .subsume import redundant

    kept = [g for g in rules if g.verdict == "ok" and g.duplicate_of is None]
    core = {g.name: parse_rules(g.text).rules for g in kept}
    cover = redundant(r for rs in core.values() for r in rs)
    one_way = 0
    for g in kept:
        left = [r for r in core[g.name] if r.name not in cover]
        if not left:
            g.instance_of = cover[core[g.name][0].name]
        elif len(left) < len(core[g.name]):
            g.text, one_way = format_rule(left[0]), one_way + 1
    return one_way


def render(report: Report) -> str:
    """The output rule file: a header (command, families, counts), then every kept rule with its verdict."""
    lines = ["# Generated by relsat rules generate (TASO's method over relsat's catalog): do not edit by hand.",
             f"# command: {report.command}", f"# size bound: {report.max_ops} operators per side"]
    for name in report.families:
        f = FAMILIES[name]()
        leaves = ", ".join(f"{l.name}{list(l.shape)}{'' if l.role == 'data' else ' ' + l.role}" for l in f.leaves)
        lines += [f"# family {name}: operators {', '.join(dict.fromkeys(o.op for o in f.ops))}",
                  f"#   inputs and weights: {leaves}"]
    lines.append("# counts: " + ", ".join(f"{k} {v}" for k, v in report.counts.items()))
    dups = [g for g in report.rules if g.duplicate_of and g.verdict == "ok"]
    if dups:
        lines.append("# restating hand-written rules, so not written: " +
                     ", ".join(f"{g.name} ({g.duplicate_of})" for g in dups))
    lines.append("")
    for g in report.kept:
        lines.append(f"# {g.proof}" + (f": {g.proof_reason}" if g.proof_reason and g.proof == "proved" else ""))
        lines.append(g.text)
    return "\n".join(lines) + "\n"


def report_json(report: Report) -> dict:
    """The counts, times and every candidate's verdict, as JSON data."""
    return {"command": report.command, "max_ops": report.max_ops, "families": report.families,
            "counts": dict(report.counts), "dropped": dict(report.dropped),
            "seconds": {k: round(v, 2) for k, v in report.seconds.items()},
            "rules": [{"name": g.name, "family": g.family, "multi": g.multi, "verdict": g.verdict, "general": g.general,
                       "proof": g.proof,
                       "proof_reason": g.proof_reason, "duplicate_of": g.duplicate_of, "instance_of": g.instance_of,
                       "text": g.text}
                      for g in report.rules]}
