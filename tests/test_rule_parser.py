"""The rule front end: fixture tables of rule text -> core IR, of bad rule text -> error, and round trips."""

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relsat.programs.checker import check_ruleset
from relsat.programs.ir import (
    Absent, BinOp, Cmp, Dim, Len, Let, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule, RuleError, RuleSet, ShapeOf,
    Size, SourceLoc, Term, Var,
)  # fmt: skip
import relsat.programs.rulesets
from relsat.programs.parser import format_rule, load_rules, parse_rules


def T(op, *children, attrs=(), index=None):
    return Term(op, tuple(attrs), children, index)


a, b, c, d, g, k, n, p, s, v, w, x, y = (Var(name) for name in "abcdgknpsvwxy")
w1, w2, n1, n2, eps = Var("w1"), Var("w2"), Var("n1"), Var("n2"), Var("eps")
GEMM_DEFAULTS = (("alpha", Lit(1.0)), ("beta", Lit(1.0)), ("transA", Lit(0)), ("transB", Lit(0)))
CONV_ATTRS = (("group", g), ("kernel_shape", k), ("strides", s), ("pads", p), ("dilations", d))
ASSOC_L, ASSOC_R = T("MatMul", T("MatMul", a, b), c), T("MatMul", a, T("MatMul", b, c))
MERGED = T("Split", T("MatMul", x, T("Concat", w1, w2, attrs=[("axis", Lit(1))])),
           attrs=[("axis", Lit(-1)), ("split", ListOf((n1, n2)))])  # fmt: skip

MERGE_MATMUL = """\
# merge two matmuls that share an input
merge-matmul: (MatMul ?x ?w1), (MatMul ?x ?w2)   # two patterns
           => (getitem 0 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 1 ?w1 ?w2)))),
              (getitem 1 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 1 ?w1 ?w2))))
              if (const ?w1) (const ?w2) (rank ?w1 2) (= (dim ?w1 0) (dim ?w2 0))
                 (let ?n1 (dim ?w1 1)) (let ?n2 (dim ?w2 1))
"""

# (rule text, the core rules it desugars to)
GOOD = [
    ("relu-idem: (Relu (Relu ?x)) => (Relu ?x)",
     [Rule("relu-idem", (T("Relu", T("Relu", x)),), (T("Relu", x),))]),
    # a bare variable on the right side
    ("identity: (Identity ?x) => ?x",
     [Rule("identity", (T("Identity", x),), (x,))]),
    # an attribute variable; a variadic op
    ("relu-concat:  (Concat :axis ?k (Relu ?x) (Relu ?y)) => (Relu (Concat :axis ?k ?x ?y))",
     [Rule("relu-concat", (T("Concat", T("Relu", x), T("Relu", y), attrs=[("axis", k)]),),
           (T("Relu", T("Concat", x, y, attrs=[("axis", k)])),))]),
    # attributes among the children, put in catalog order; 1 for a float is 1.0; on the left the omitted
    # :beta matches any value and the omitted optional C means absent
    ("gemm-matmul: (Gemm ?a :transB 0 ?b :alpha 1 :transA 0) => (MatMul ?a ?b)",
     [Rule("gemm-matmul", (T("Gemm", a, b, Absent(), attrs=[("alpha", Lit(1.0)), ("transA", Lit(0)), ("transB", Lit(0))]),),
           (T("MatMul", a, b),))]),
    # on the right every attribute is present, defaults filled; (rank ?v N) is a comparison
    ("matmul-gemm: (MatMul ?a ?b) => (Gemm ?a ?b) if (rank ?a 2) (rank ?b 2)",
     [Rule("matmul-gemm", (T("MatMul", a, b),), (T("Gemm", a, b, Absent(), attrs=GEMM_DEFAULTS),),
           conditions=(Cmp("=", Rank(a), Lit(2)), Cmp("=", Rank(b), Lit(2))))]),
    # <=> gives two core rules
    ("matmul-assoc: (MatMul (MatMul ?a ?b) ?c) <=> (MatMul ?a (MatMul ?b ?c))   # trailing comment",
     [Rule("matmul-assoc", (ASSOC_L,), (ASSOC_R,), bidirectional_of="matmul-assoc"),
      Rule("matmul-assoc-rev", (ASSOC_R,), (ASSOC_L,), bidirectional_of="matmul-assoc")]),
    # <=>: both sides get defaults; the reverse checks the let instead of binding it
    ("flatten-reshape: (Flatten ?x) <=> (Reshape :shape ?s ?x) if (rank ?x 2) (let ?s (shape ?x))",
     [Rule("flatten-reshape", (T("Flatten", x, attrs=[("axis", Lit(1))]),), (T("Reshape", x, attrs=[("shape", s)]),),
           conditions=(Cmp("=", Rank(x), Lit(2)),), lets=(Let(s, ShapeOf(x)),), bidirectional_of="flatten-reshape"),
      Rule("flatten-reshape-rev", (T("Reshape", x, attrs=[("shape", s)]),), (T("Flatten", x, attrs=[("axis", Lit(1))]),),
           conditions=(Cmp("=", Rank(x), Lit(2)), Cmp("=", s, ShapeOf(x))), bidirectional_of="flatten-reshape")]),
    # multi-pattern, getitem, conditions and lets, comments and a multi-line layout
    (MERGE_MATMUL,
     [Rule("merge-matmul", (T("MatMul", x, w1), T("MatMul", x, w2)),
           (T("getitem", MERGED, index=0), T("getitem", MERGED, index=1)),
           conditions=(Pred("const", w1), Pred("const", w2), Cmp("=", Rank(w1), Lit(2)), Cmp("=", Dim(w1, 0), Dim(w2, 0))),
           lets=(Let(n1, Dim(w1, 1)), Let(n2, Dim(w2, 1))))]),
    # _ says the optional bias is absent; a list-valued let
    ("conv-add-bias: (Add (Conv ?x ?w _ :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d) ?b)\n"
     "  => (Conv ?x ?w (Reshape :shape ?n ?b) :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d)\n"
     "  if (const ?b) (= (shape ?b) (list (dim ?w 0) 1 1)) (let ?n (list (dim ?w 0)))",
     [Rule("conv-add-bias", (T("Add", T("Conv", x, w, Absent(), attrs=CONV_ATTRS), b),),
           (T("Conv", x, w, T("Reshape", b, attrs=[("shape", n)]), attrs=CONV_ATTRS),),
           conditions=(Pred("const", b), Cmp("=", ShapeOf(b), ListExpr((Dim(w, 0), Lit(1), Lit(1))))),
           lets=(Let(n, ListExpr((Dim(w, 0),))),))]),
    # an attribute variable feeding a leaf; defaults on the right (momentum)
    ("bn-eps: (BatchNormalization ?x ?s ?b ?m ?v :epsilon ?eps)\n"
     "     => (BatchNormalization ?x ?s ?b ?m (Add ?v (Constant :value_float ?eps)) :epsilon 0)",
     [Rule("bn-eps", (T("BatchNormalization", x, s, b, Var("m"), v, attrs=[("epsilon", eps)]),),
           (T("BatchNormalization", x, s, b, Var("m"), T("Add", v, T("Constant", attrs=[("value_float", eps)])),
              attrs=[("epsilon", Lit(0.0)), ("momentum", Lit(0.9))]),))]),
    # a repeated variable; dtype and not-const
    ("add-self: (Add ?x ?x) => (Mul ?x (Constant :value_float 2)) if (dtype ?x float32) (not-const ?x)",
     [Rule("add-self", (T("Add", x, x),), (T("Mul", x, T("Constant", attrs=[("value_float", Lit(2.0))])),),
           conditions=(Pred("dtype", x, 1), Pred("not-const", x)))]),
    # string attribute, list comparison, same-shape, len and arithmetic
    ('pad-nothing: (Pad :mode "constant" :pads ?p (Add ?x ?y)) => (Add ?x ?y)\n'
     "  if (same-shape ?x ?y) (= (len ?p) (* 2 (rank ?x))) (= ?p (list 0 0 0 0))",
     [Rule("pad-nothing", (T("Pad", T("Add", x, y), attrs=[("mode", Lit("constant")), ("pads", p)]),), (T("Add", x, y),),
           conditions=(Cmp("=", ShapeOf(x), ShapeOf(y)), Cmp("=", Len(p), BinOp("*", Lit(2), Rank(x))),
                       Cmp("=", p, ListExpr((Lit(0),) * 4))))]),
    # numel, integer division, >= and !=
    ("flatten-as-reshape: (Flatten :axis 1 ?x) => (Reshape :shape ?s ?x)\n"
     "  if (>= (rank ?x) 1) (!= (dim ?x 0) 0) (let ?s (list (dim ?x 0) (/ (numel ?x) (dim ?x 0))))",
     [Rule("flatten-as-reshape", (T("Flatten", x, attrs=[("axis", Lit(1))]),), (T("Reshape", x, attrs=[("shape", s)]),),
           conditions=(Cmp(">=", Rank(x), Lit(1)), Cmp("!=", Dim(x, 0), Lit(0))),
           lets=(Let(s, ListExpr((Dim(x, 0), BinOp("/", Numel(x), Dim(x, 0))))),))]),
    # getitem; a list attribute of variables (binds the elements)
    ("split-concat: (Concat :axis ?k (getitem 0 (Split :axis ?k :split (?a ?b) ?x)) (getitem 1 (Split :axis ?k :split (?a ?b) ?x))) => ?x",
     [Rule("split-concat", (T("Concat", *(T("getitem", T("Split", x, attrs=[("axis", k), ("split", ListOf((a, b)))]), index=i)
                                         for i in (0, 1)), attrs=[("axis", k)]),), (x,))]),
]  # fmt: skip


@pytest.mark.parametrize("text, expected", GOOD, ids=[e[0].name for _, e in GOOD])
def test_fixture(text, expected):
    ruleset = parse_rules(text)
    assert ruleset.rules == tuple(expected)
    assert [r.bidirectional_of for r in ruleset.rules] == [r.bidirectional_of for r in expected]


@pytest.mark.parametrize("text, expected", GOOD, ids=[e[0].name for _, e in GOOD])
def test_round_trip(text, expected):
    for rule in parse_rules(text).rules:
        assert parse_rules(format_rule(rule)).rules == (rule,)


def test_float_attributes_are_floats():
    (rule,) = parse_rules("r: (Relu ?x) => (LeakyRelu :alpha 1 ?x)").rules
    assert type(rule.rhs[0].attrs[0][1].value) is float


def test_sources_and_load_rules(tmp_path):
    path = tmp_path / "mine.rules"
    path.write_text("\ufeff# a BOM and a comment\n" + MERGE_MATMUL + "\nidentity: (Identity ?x) => ?x\n", encoding="utf-8")
    ruleset = load_rules(path)
    assert (ruleset.name, ruleset.source) == ("mine", str(path))
    assert [r.source for r in ruleset.rules] == [SourceLoc(str(path), 3, 1), SourceLoc(str(path), 9, 1)]
    path.write_text("identity: (Identity ?x) => ?y\n")
    with pytest.raises(RuleError, match=f"^{path}:1:28: "):
        load_rules(path)


def test_checker_accepts_hand_built_ir_and_reports_without_locations():
    check_ruleset(RuleSet("t", tuple(GOOD[0][1]), "t.rules"))
    bad = Rule("bad", (T("Relu", x),), (T("Relu", y),), source=SourceLoc("t.rules", 7, 1))
    with pytest.raises(RuleError, match=r"^t.rules:7:1: \?y on the right side is not bound"):
        check_ruleset(RuleSet("t", (bad,), "t.rules"))


# (bad rule text, line, column, part of the reason)
BAD = [
    # syntax
    ("r: (Relu ?x => ?x", 1, 13, "missing ')'"),
    ("r: (Relu ?x\n", 1, 4, "never closed"),
    ("r: (Relu ?x)) => ?x", 1, 13, "expected ',', '=>' or '<=>'"),
    ("r: (Relu ?x) => ?x)", 1, 19, "expected ',', 'if' or a new rule"),
    ("r: (Relu ?x) (Relu ?y)", 1, 14, "expected ',', '=>' or '<=>'"),
    ("r: (Relu ?x)", 1, 13, "got end of input"),
    ("(Relu ?x) => ?x", 1, 1, "expected a rule"),
    ("r: (Relu ?x) => ?x if ?x", 1, 23, "'(' starting a condition"),
    ("r: (Relu ?x) => ?x if", 1, 22, "'(' starting a condition"),
    ("r: (Relu ?x) => ?x if (const ?x) =>", 1, 34, "expected a condition"),
    ("r: (Add ?x 1) => ?x", 1, 12, "unexpected '1' in (Add ...)"),
    ("r: (Relu ?x) => ?x if (konst ?x)", 1, 24, "did you mean 'const'"),
    ("r: (Relu ?x) => ?x if (rank ?x)", 1, 31, "too few arguments; usage: (rank ?v e)"),
    ("r: (Relu ?x) => ?x if (const ?x ?x)", 1, 33, "usage: (const ?v)"),
    ("r: (Relu ?x) => ?x if (= (dimm ?x 0) 1)", 1, 27, "unknown expression 'dimm'"),
    ("r: (Relu ?x) => ?x if (= (dim ?x ?i) 1)", 1, 34, "expected an integer"),
    ("r: (Relu ?x) => ?x if (dtype ?x float33)", 1, 33, "unknown dtype"),
    ('r: (Gelu :approximate "tanh ?x) => ?x', 1, 23, "unterminated string"),
    ("r: (Relu ?x) => ?x $", 1, 20, "unexpected character"),
    ("r: (Concat :axis (1 (2)) ?x) => ?x", 1, 21, "an attribute list holds literals and variables"),
    ("r: (Concat :axis) => ?x", 1, 17, "expected an attribute value"),
    # operators, arity, attributes
    ("r: (Matmul ?a ?b) => ?a", 1, 5, "unknown operator 'Matmul'; did you mean 'MatMul'?"),
    ("r: (Relu ?x ?y) => ?x", 1, 13, "Relu takes 1 input(s) (X), got 2"),
    ("r: (MatMul ?a) => ?a", 1, 5, "MatMul is missing its required input B"),
    ("r: (Relu ?x) => (Concat :axis 0)", 1, 18, "Concat needs at least one input"),
    ("r: (Conv _ ?w) => ?w", 1, 10, "input X of Conv is required"),
    ("r: (Relu :alpha 1.0 ?x) => ?x", 1, 10, "Relu has no attribute :alpha"),
    ("r: (Conv ?x ?w :grop 2) => ?x", 1, 16, "did you mean :group?"),
    ("r: (Concat :axis 1 :axis 2 ?x) => ?x", 1, 20, "attribute :axis given twice"),
    ("r: (Concat :axis (1 2) ?x) => ?x", 1, 18, "takes an int, got a list"),
    ("r: (Concat :axis 1.5 ?x) => ?x", 1, 18, "takes an int, got a float 1.5"),
    ("r: (Clip :min \"low\" ?x) => ?x", 1, 15, "takes a float, got a string"),
    ("r: (Split :split (1 2.5) ?x) => ?x", 1, 21, "takes a list of ints, got a float 2.5"),
    ("r: (Transpose :perm 1 ?x) => ?x", 1, 21, "takes a list of ints, got an int 1"),
    ("r: (Relu ?x) => (Concat ?x)", 1, 18, "Concat on the right side needs :axis"),
    ("r: (Relu ?x) => (Conv ?x ?x :group 1)", 1, 18, "needs :kernel_shape :strides :pads :dilations"),
    ("r: (getitem (Split :split (1 1) ?x)) => ?x", 1, 5, "getitem takes a non-negative integer index"),
    ("r: (getitem -1 ?t) => ?t", 1, 5, "getitem takes a non-negative integer index"),
    ("r: (Relu ?x) => (Relu (Split :split (1 1) ?x))", 1, 24, "Split yields a tuple"),
    ("r: (getitem 0 (Relu ?x)) => ?x", 1, 16, "getitem takes a tuple-valued input"),
    # rule shape and variables
    ("r: ?x => (Identity ?x)", 1, 4, "the root of a left pattern must be an operator term"),
    ("r: (Relu ?x), (Relu ?y) => ?x", 1, 16, "2 left pattern(s) but 1 right term(s)"),
    ("r: (Relu ?x) => ?x, ?x", 1, 21, "1 left pattern(s) but 2 right term(s)"),
    ("r: (Relu ?x) => (Relu ?y)", 1, 23, "?y on the right side is not bound"),
    ("r: (Relu ?x) => ?x if (const ?y)", 1, 30, "?y in a condition is not bound"),
    ("r: (Relu ?x) => ?x if (let ?n (rank ?y))", 1, 37, "?y in a let is not bound"),
    ("r: (Relu ?x) => ?x if (let ?n ?m) (let ?m 1)", 1, 31, "?m in a let is not bound"),
    ("r: (Concat :axis ?k ?x) => (Relu ?k)", 1, 34, "?k is used as an e-class (an input) here but as an attribute value"),
    ("r: (Relu ?x) => ?x if (= ?x 1)", 1, 26, "?x is used as an attribute value here but as an e-class"),
    ("r: (Relu ?x) => (Relu ?n) if (let ?n 1)", 1, 23, "?n is used as an e-class"),
    ("r: (Concat :axis ?k ?x) => ?x if (let ?k 1)", 1, 39, "let redefines ?k"),
    ("r: (Relu ?x) => ?x\nr: (Sigmoid ?x) => ?x", 2, 1, "duplicate rule name 'r' (first defined at bad.rules:1:1)"),
    ("r: (Relu ?x) <=> ?x\nr-rev: (Tanh ?x) => ?x", 1, 18, "the root of a left pattern must be an operator term"),
    ("r: (Add ?x ?y) <=> (Relu ?x)", 1, 12, "?y on the right side is not bound by the left side or a let (in r-rev, the reverse"),
    ("r: (Concat ?x) <=> (Relu ?x)", 1, 5, "Concat on the right side needs :axis (no default; give it explicitly) (in r-rev"),
    ("r: (Relu ?x) <=> (Sigmoid ?x)\nr-rev: (Tanh ?x) => ?x", 2, 1, "duplicate rule name 'r-rev'"),
    # a size (a symbol where the dim is dynamic) only in a dims attribute
    ("r: (Relu ?x) => (Unsqueeze :axes (?n) ?x) if (let ?n (size ?x 0))", 1, 35,
     "?n is computed from a size (a symbol where the dim is dynamic): only a dims attribute such as Reshape's :shape"),
    ("r: (Relu ?x) => (Unsqueeze :axes (?m) ?x) if (let ?n (size ?x 0)) (let ?m (* ?n 2))", 1, 35,
     "?m is computed from a size"),
]  # fmt: skip


@pytest.mark.parametrize("text, line, column, reason", BAD, ids=[t for t, *_ in BAD])
def test_error(text, line, column, reason):
    with pytest.raises(RuleError) as info:
        parse_rules(text, "bad.rules")
    err = info.value
    assert (err.file, err.line, err.column) == ("bad.rules", line, column), err.reason
    assert reason in err.reason
    assert str(err) == f"bad.rules:{line}:{column}: {err.reason}"


# ---------------------------------------------------------------- round trips of literals and expressions

_ints = st.integers(-(2**40), 2**40)
_floats = st.floats(allow_nan=False)
_exprs = st.recursive(
    st.one_of(_ints.map(Lit), _floats.map(Lit), st.sampled_from([n, Dim(x, -1), Size(x, 0), Rank(x), Numel(y), ShapeOf(y)])),
    lambda inner: st.one_of(
        st.builds(BinOp, st.sampled_from("+-*/%"), inner, inner),
        st.lists(inner, max_size=3).map(lambda items: ListExpr(tuple(items))),
        st.builds(Len, inner),
    ),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None)  # hypothesis' default of 100 took ~4 s
@given(mode=st.text(), pads=st.lists(_ints, max_size=6), value=_floats,
       cond=st.builds(Cmp, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), _exprs, _exprs))  # fmt: skip
def test_round_trip_literals_and_expressions(mode, pads, value, cond):
    rule = Rule(
        "r",
        (T("Add", x, y),),
        (T("Pad", x, attrs=[("mode", Lit(mode)), ("pads", ListOf(tuple(map(Lit, pads)))), ("value", Lit(value))]),),
        conditions=(cond,),
        lets=(Let(n, Lit(3)),),
    )
    check_ruleset(RuleSet("t", (rule,), "t"))
    (back,) = parse_rules(format_rule(rule)).rules
    assert back == rule
    assert math.copysign(1, back.rhs[0].attrs[2][1].value) == math.copysign(1, value)


# ---------------------------------------------------------------- include


SHIPPED_DIR = Path(relsat.programs.rulesets.RULES_DIR)


def test_include_a_shipped_set():
    ruleset = parse_rules("r: (Relu ?x) => ?x\ninclude ac-add\n", "main.rules")
    ac_add = load_rules(SHIPPED_DIR / "ac-add.rules")
    assert ruleset.rules[1:] == ac_add.rules and [r.name for r in ruleset.rules] == ["r", "add-comm", "add-assoc"]
    # each rule keeps where it is written; included_at says which include brought it
    assert [r.source for r in ruleset.rules] == [SourceLoc("main.rules", 1, 1)] + [r.source for r in ac_add.rules]
    assert ruleset.rules[1].source.file == str(SHIPPED_DIR / "ac-add.rules")
    assert ruleset.included_at == (None, SourceLoc("main.rules", 2, 9), SourceLoc("main.rules", 2, 9))
    assert ruleset.files == ("main.rules", str(SHIPPED_DIR / "ac-add.rules"))


def test_include_a_subset_keeps_the_files_order():
    taso = {r.name: r for r in load_rules(SHIPPED_DIR / "taso.rules").rules}
    text = "include taso: mul-comm add-assoc-rev\n   add-comm  # a comment\ninclude taso: matmul-assoc\n"
    ruleset = parse_rules(text)
    assert ruleset.rules == tuple(taso[n] for n in ("add-comm", "add-assoc-rev", "mul-comm", "matmul-assoc"))
    assert ruleset.rules[1].bidirectional_of == "add-assoc"
    # the other spelling of the same include
    assert parse_rules("include taso : add-comm").rules == (taso["add-comm"],)


def test_include_a_path_relative_to_the_including_file(tmp_path, monkeypatch):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "c.rules").write_text("c: (Tanh ?x) => ?x\ninclude fold: identity\n")
    (tmp_path / "sub" / "b.rules").write_text('b1: (Sigmoid ?x) => ?x\ninclude "deeper/c.rules"\nb2: (Sqrt ?x) => ?x\n')
    main = tmp_path / "main.rules"
    main.write_text('include "sub/b.rules": b2 c\nr: (Relu ?x) => ?x\n' f'include "{tmp_path}/sub/b.rules": b1\n')
    monkeypatch.chdir(SHIPPED_DIR)  # relative to the including file, not the working directory
    ruleset = load_rules(main)
    assert [r.name for r in ruleset.rules] == ["c", "b2", "r", "b1"]
    c_file, b_file = tmp_path / "sub" / "deeper" / "c.rules", tmp_path / "sub" / "b.rules"
    assert [r.source for r in ruleset.rules] == [
        SourceLoc(str(c_file), 1, 1), SourceLoc(str(b_file), 3, 1), SourceLoc(str(main), 2, 1),
        SourceLoc(str(b_file), 1, 1)]  # fmt: skip
    assert ruleset.included_at == (SourceLoc(str(main), 1, 9),) * 2 + (None, SourceLoc(str(main), 3, 9))
    # every file read, transitively, each once
    assert [Path(f).resolve() for f in ruleset.files] == [main, b_file, c_file, SHIPPED_DIR / "fold.rules"]


def test_an_included_file_is_parsed_once(tmp_path, monkeypatch):
    reads = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or real(self, *a, **k))
    load_rules(SHIPPED_DIR / "default.rules")
    assert sorted(reads) == ["default.rules", "fold.rules", "runtime.rules", "taso.rules"]


def _write(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)


# (other files, the text of main.rules, the error's file, line, column, part of the reason)
INCLUDE_BAD = [
    ({}, "include fodl", "main.rules", 1, 9, "no shipped rule set 'fodl' (shipped: ac-add, default, fold, generated, "
     "merge, runtime, taso); did you mean 'fold'?"),
    ({}, "include fold.rules", "main.rules", 1, 9, 'a file path is quoted: include "fold.rules"'),
    ({}, 'r: (Relu ?x) => ?x\ninclude "nope.rules"', "main.rules", 2, 9, "rule file {tmp}/nope.rules not found"),
    ({}, "include fold: identity\n  idenity", "main.rules", 2, 3,
     "no rule 'idenity' in {shipped}/fold.rules; did you mean 'identity'?"),
    ({}, "include ac-add: add-assoc add-comm add-assoc", "main.rules", 1, 36, "rule 'add-assoc' is named twice"),
    ({}, "include fold:\nr: (Relu ?x) => ?x", "main.rules", 2, 1, "expected the names of the rules to take from fold"),
    ({}, "include fold identity", "main.rules", 1, 14, "expected ':' and rule names, a new rule 'NAME:' or 'include'"),
    ({}, "include fold: identity (Relu ?x)", "main.rules", 1, 24, "expected another rule name, a new rule"),
    ({}, "include (Relu ?x)", "main.rules", 1, 9, "expected a rule set name or a quoted file path after 'include'"),
    ({}, "r: (Relu ?x) => ?x\ninclude", "main.rules", 2, 8, "expected a rule set name or a quoted file path"),
    ({"b.rules": "b: (Relu ?x) => ?x"}, 'include "b.rules":b', "main.rules", 1, 18, "put a space between ':'"),
    ({}, "include fold:identity", "main.rules", 1, 13, "put a space between ':' and the first rule name after fold"),
    # duplicate names after inclusion: at the later rule, or at the include that brings the later one
    ({}, "include ac-add\nadd-comm: (Add ?a ?b) => (Add ?b ?a)", "main.rules", 2, 1,
     "duplicate rule name 'add-comm' (first defined at {shipped}/ac-add.rules:2:1, included at {tmp}/main.rules:1:9)"),
    ({}, "add-comm: (Add ?a ?b) => (Add ?b ?a)\ninclude ac-add: add-assoc add-comm", "main.rules", 2, 9,
     "duplicate rule name 'add-comm': this include brings the rule defined at {shipped}/ac-add.rules:2:1, but the "
     "set already has one (defined at {tmp}/main.rules:1:1)"),
    ({}, "include ac-add\ninclude taso: add-comm", "main.rules", 2, 9,
     "duplicate rule name 'add-comm': this include brings the rule defined at {shipped}/taso.rules:8:1, but the set "
     "already has one (defined at {shipped}/ac-add.rules:2:1, included at {tmp}/main.rules:1:9)"),
    # cycles, at the include that closes one, with the chain
    ({}, 'r: (Relu ?x) => ?x\ninclude "main.rules"', "main.rules", 2, 9,
     "include cycle: {tmp}/main.rules -> {tmp}/main.rules"),
    ({"a.rules": 'include "b.rules"', "b.rules": 'b: (Relu ?x) => ?x\n\ninclude "./a.rules": b'},
     'include "a.rules"', "b.rules", 3, 9,
     "include cycle: {tmp}/a.rules -> {tmp}/b.rules -> {tmp}/a.rules (included at {tmp}/a.rules:1:9) "
     "(included at {tmp}/main.rules:1:9)"),
    ({"a.rules": 'include "main.rules"'}, 'include "a.rules"', "a.rules", 1, 9,
     "include cycle: {tmp}/main.rules -> {tmp}/a.rules -> {tmp}/main.rules (included at {tmp}/main.rules:1:9)"),
    # an error inside an included file is reported where it is
    ({"b.rules": "ok: (Relu ?x) => ?x\nbad: (Relu ?x) => ?y"}, 'include "b.rules": ok', "b.rules", 2, 19,
     "?y on the right side is not bound by the left side or a let (included at {tmp}/main.rules:1:9)"),
    ({"b.rules": "include fodl"}, 'include "b.rules"', "b.rules", 1, 9,
     "no shipped rule set 'fodl'"),
]  # fmt: skip


@pytest.mark.parametrize("files, text, file, line, column, reason", INCLUDE_BAD, ids=[t for _, t, *_ in INCLUDE_BAD])
def test_include_error(tmp_path, files, text, file, line, column, reason):
    _write(tmp_path, dict(files, **{"main.rules": text}))
    with pytest.raises(RuleError) as info:
        load_rules(tmp_path / "main.rules")
    err = info.value
    assert (err.file, err.line, err.column) == (str(tmp_path / file), line, column), err.reason
    assert reason.format(tmp=tmp_path, shipped=SHIPPED_DIR) in err.reason
    assert str(err) == f"{tmp_path / file}:{line}:{column}: {err.reason}"


def test_include_ends_a_rule_and_a_rule_named_include_is_fine():
    ruleset = parse_rules("r: (Relu ?x) => ?x if (const ?x) include ac-add: add-comm\ninclude: (Tanh ?x) => ?x")
    assert [r.name for r in ruleset.rules] == ["r", "add-comm", "include"]
    assert ruleset.rules[0].conditions == (Pred("const", x),)
