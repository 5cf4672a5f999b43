"""The z3 prover of rewrite rules (programs/prove.py): shipped rules prove, wrong ones do not."""

import sys
import time

import pytest

from relsat.programs.parser import parse_rules
from relsat.programs.prove import Proof, axioms, prove_rule
from relsat.programs.rulesets import load_rule_list

z3 = pytest.importorskip("z3")

TIMEOUT_MS = 10000  # per z3 run: a proof is no weaker for taking longer on a loaded machine (2 s timed out in one CI run)

MUST_PROVE = {
    "taso": ["add-comm", "add-assoc", "add-assoc-rev", "mul-assoc", "mul-assoc-rev", "mul-add-distrib",
             "mul-add-distrib-rev", "matmul-assoc", "matmul-assoc-rev", "transpose-involution", "transpose-matmul",
             "transpose-matmul-rev", "conv-weight-distrib", "conv-weight-distrib-rev", "conv-input-distrib",
             "conv-input-distrib-rev", "split-concat-0", "relu-concat", "relu-concat-rev"],
    "merge": ["merge-matmul", "merge-matmul-3", "merge-conv"],
    "fold": ["identity", "relu-idempotent", "transpose-inverse-2", "transpose-compose-3"],
}

_RULES: dict = {}


def _shipped(set_name: str, rule_name: str):
    if set_name not in _RULES:
        _RULES[set_name] = {r.name: r for r in load_rule_list([set_name])}
    return _RULES[set_name][rule_name]


def _rule(text: str):
    (rule,) = parse_rules(text).rules
    return rule


def test_axioms_are_data():
    axs = axioms()
    assert len(axs) >= 40
    assert len({a.name for a in axs}) == len(axs)
    for a in axs:
        assert a.comment and "\n" not in a.comment
        assert z3.is_quantifier(a.formula) and a.formula.num_patterns() >= 1, a.name
        assert a.ops, a.name


@pytest.mark.parametrize("set_name,rule_name", [(s, n) for s, names in MUST_PROVE.items() for n in names])
def test_shipped_rule_proves(set_name, rule_name):
    proof = prove_rule(_shipped(set_name, rule_name), timeout_ms=TIMEOUT_MS)
    assert proof.status == "proved", proof.reason
    assert proof.reason.startswith("from ")


WRONG = {
    "matmul-comm": "w: (MatMul ?a ?b) => (MatMul ?b ?a)",
    "add-mul-mixup": "w: (Add ?a (Mul ?b ?c)) => (Mul (Add ?a ?b) ?c)",
    "transpose-dropped": "w: (Transpose :perm (1 0) ?x) => ?x",
    "transpose-matmul-order": "w: (Transpose :perm (1 0) (MatMul ?a ?b)) "
                              "=> (MatMul (Transpose :perm (1 0) ?a) (Transpose :perm (1 0) ?b))",
    "transpose-not-involution": "w: (Transpose :perm (1 2 0) (Transpose :perm (1 2 0) ?x)) => ?x",
    "split-concat-wrong-index": "w: (getitem 1 (Split :axis ?k :split (?s1 ?s2) (Concat :axis ?k ?a ?b))) => ?a "
                                "if (> (numel ?a) 0) (= (* ?s1 (numel ?b)) (* ?s2 (numel ?a)))",
    "split-concat-no-sizes": "w: (getitem 0 (Split :axis ?k :split (?s1 ?s2) (Concat :axis ?k ?a ?b))) => ?a",
    "split-concat-other-axis": "w: (getitem 0 (Split :axis 0 :split (?s1 ?s2) (Concat :axis 1 ?a ?b))) => ?a "
                               "if (= ?s1 (dim ?a 1))",
    "concat-split-swapped": "w: (Concat :axis ?k (getitem 1 (Split :axis ?k :split (?s1 ?s2) ?x)) "
                            "(getitem 0 (Split :axis ?k :split (?s1 ?s2) ?x))) => ?x",
    "matmul-assoc-any-rank": "w: (MatMul ?a (MatMul ?b ?c)) => (MatMul (MatMul ?a ?b) ?c)",
    "conv-distrib-any-shape": "w: (Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x (Add ?v ?w)) "
                              "=> (Add (Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x ?v) "
                              "(Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x ?w))",
    "conv-concat-any-group": "w: (Concat :axis 1 "
                             "(Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x ?v) "
                             "(Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x ?w)) "
                             "=> (Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x "
                             "(Concat :axis 0 ?v ?w))",
    "maxpool-concat-spatial": "w: (Concat :axis ?a (MaxPool :kernel_shape ?k :strides ?s :pads ?p :dilations ?d "
                              ":ceil_mode ?c ?x) (MaxPool :kernel_shape ?k :strides ?s :pads ?p :dilations ?d "
                              ":ceil_mode ?c ?y)) => (MaxPool :kernel_shape ?k :strides ?s :pads ?p :dilations ?d "
                              ":ceil_mode ?c (Concat :axis ?a ?x ?y)) if (< ?a 3)",
    "transpose-compose-3-roles-swapped": "w: (Transpose :perm (?q0 ?q1 ?q2) (Transpose :perm (?p0 ?p1 ?p2) ?x)) "
                                         "=> (Transpose :perm (?r0 ?r1 ?r2) ?x) "
                                         "if (let ?d1 (- ?q1 ?q0)) (let ?d2 (+ (- ?q2 (* 2 ?q1)) ?q0)) "
                                         "(let ?r0 (+ ?q0 (+ (* ?p0 ?d1) (* (/ (* ?p0 (- ?p0 1)) 2) ?d2)))) "
                                         "(let ?r1 (+ ?q0 (+ (* ?p1 ?d1) (* (/ (* ?p1 (- ?p1 1)) 2) ?d2)))) "
                                         "(let ?r2 (+ ?q0 (+ (* ?p2 ?d1) (* (/ (* ?p2 (- ?p2 1)) 2) ?d2))))",
    "relu-additive": "w: (Relu (Add ?x ?y)) => (Add (Relu ?x) (Relu ?y))",
    "merge-matmul-swapped-sizes": "w: (MatMul ?x ?w1), (MatMul ?x ?w2) "
                                  "=> (getitem 0 (Split :axis -1 :split (?n1 ?n2) "
                                  "(MatMul ?x (Concat :axis 1 ?w1 ?w2)))), "
                                  "(getitem 1 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 1 ?w1 ?w2)))) "
                                  "if (rank ?w1 2) (rank ?w2 2) (let ?n1 (dim ?w2 1)) (let ?n2 (dim ?w1 1))",
    "merge-matmul-rows": "w: (MatMul ?x ?w1), (MatMul ?x ?w2) "
                         "=> (getitem 0 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 0 ?w1 ?w2)))), "
                         "(getitem 1 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 0 ?w1 ?w2)))) "
                         "if (rank ?w1 2) (rank ?w2 2) (let ?n1 (dim ?w1 1)) (let ?n2 (dim ?w2 1))",
    # every operator of the fragment at once, so every axiom is in play: they must not contradict each other
    "everything": "w: (Concat :axis 1 (Relu (Transpose :perm (1 0) (MatMul ?a (Mul ?b ?c)))) "
                  "(Concat :axis 0 (getitem 0 (Split :axis 1 :split (?s1 ?s2) "
                  "(Conv :group 1 :kernel_shape ?k :strides ?t :pads ?p :dilations ?d (Identity (Add ?x ?y)) "
                  "(Concat :axis 0 ?w1 ?w2)))) (Add (MaxPool :kernel_shape ?k :strides ?t :pads ?p :dilations ?d ?x) "
                  "(AveragePool :kernel_shape ?k :strides ?t :pads ?p :dilations ?d "
                  "(Conv :group 1 :kernel_shape ?k :strides ?t :pads ?p :dilations ?d ?x ?w1 ?b1))))) => ?a",
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_rule_is_not_proved(name):
    start = time.perf_counter()
    proof = prove_rule(_rule(WRONG[name]), timeout_ms=TIMEOUT_MS)
    assert proof.status == "tested", proof.reason
    assert proof.reason and "\n" not in proof.reason
    assert time.perf_counter() - start < TIMEOUT_MS / 1000 + 1.5


PROVABLE = {
    "split-concat-by-dims": "ok: (getitem 1 (Split :axis 1 :split (?s1 ?s2 ?s3) (Concat :axis 1 ?a ?b ?c))) => ?b "
                            "if (= ?s1 (dim ?a 1)) (= ?s2 (dim ?b 1))",
    "transpose-3-inverse": "ok: (Transpose :perm (2 0 1) (Transpose :perm (1 2 0) ?x)) => ?x",
    "transpose-concat-relu": "ok: (Relu (Transpose :perm (0 2 1) "
                             "(Concat :axis 0 (Relu ?x) (Transpose :perm (0 2 1) ?y)))) "
                             "=> (Concat :axis 0 (Relu (Transpose :perm (0 2 1) ?x)) (Relu ?y))",
    "distrib-ac": "ok: (Mul (Add ?a (Add ?b ?c)) (Add ?d ?e)) => (Add (Mul ?a ?d) (Add (Mul ?b ?d) (Add (Mul ?c ?d) "
                  "(Add (Mul ?a ?e) (Add (Mul ?b ?e) (Mul ?c ?e))))))",
}


@pytest.mark.parametrize("name", sorted(PROVABLE))
def test_handwritten_identity_proves(name):
    proof = prove_rule(_rule(PROVABLE[name]), timeout_ms=TIMEOUT_MS)
    assert proof.status == "proved", proof.reason


def test_operator_outside_the_fragment_is_tested():
    proof = prove_rule(_rule("s: (Sigmoid (Concat :axis ?k ?x ?y)) => (Concat :axis ?k (Sigmoid ?x) (Sigmoid ?y))"))
    assert proof == Proof("tested", "outside the fragment: Sigmoid")


def test_contradictory_conditions_prove_vacuously():
    proof = prove_rule(_rule("v: (Add ?a ?b) => ?a if (rank ?a 2) (rank ?a 3)"))
    assert proof.status == "proved" and "vacuous" in proof.reason


def test_timeout_gives_tested():
    text = ("t: (Mul (Add (Add ?a ?b) (Add ?c ?d)) (Add (Add ?e ?f) (Add ?g ?h))) "
            "=> (Mul (Add (Add ?a ?b) (Add ?c ?d)) (Add (Add ?e ?f) (Add ?h ?h)))")
    proof = prove_rule(_rule(text), timeout_ms=200)
    assert proof.status == "tested"


def test_without_z3(monkeypatch):
    monkeypatch.setitem(sys.modules, "z3", None)  # `import z3` raises ImportError
    proof = prove_rule(_shipped("taso", "add-comm"))
    assert proof == Proof("tested", "z3-solver is not installed (pip install relsat[prove])")


def test_every_taso_rule_gets_a_verdict_in_time():
    rules = load_rule_list(["taso"])
    proved = 0
    for rule in rules:
        start = time.perf_counter()
        proof = prove_rule(rule, timeout_ms=TIMEOUT_MS)
        assert proof.status in ("proved", "tested") and proof.reason, rule.name
        assert time.perf_counter() - start < TIMEOUT_MS / 1000 + 1.5, rule.name
        proved += proof.status == "proved"
    print(f"taso: {proved} of {len(rules)} rules proved")
    assert proved >= len(MUST_PROVE["taso"])
