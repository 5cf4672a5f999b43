"""Shipped rule sets: every rule verified on random instances, wrong rules caught, merges fire on zoo models."""

import functools
from collections import defaultdict
from pathlib import Path

import pytest
from onnx import helper

import relsat.programs.rules
from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.runner import Limits, Runner, StopReason
from relsat.programs.parser import load_rules, parse_rules
from relsat.programs.verify import check_rule, check_ruleset

RULES_DIR = Path(relsat.programs.rules.__file__).parent
SHIPPED = {p.stem: load_rules(p) for p in sorted(RULES_DIR.glob("*.rules"))}
# generated.rules (thousands of rules) is checked by tests/test_generate.py: a sample here, all of it with -m slow
CASES = [(name, rule) for name, rs in SHIPPED.items() if name != "generated" for rule in rs.rules]


@functools.cache
def verdict(rule):
    """Rules repeated across files compare equal, so each is verified once."""
    return check_rule(rule)


def test_shipped_files_parse():
    assert {"ac-add", "taso", "merge", "fold", "default"} <= set(SHIPPED)
    for name, ruleset in SHIPPED.items():
        assert ruleset.rules, name


# 5-20 s each (their instances need per-channel operands, found only after hundreds of rejected draws, each shape
# check a DuckDB query): -m slow. By default tests/test_runtime_rules.py::test_affine_folding_into_conv applies
# the conv-*-fold-channel ones to a Conv with and without a bias and compares the written model under ONNX Runtime;
# ::test_an_affine_map_before_an_unpadded_conv_folds_into_it[True]/[False] does so for conv-input-affine-fold and
# its -nobias twin (and checks the padded variant is refuted); add-zero-channel-last is applied and compared in
# ::test_channel_last_mlp_with_global_response_norm_is_1x1_convs. add-zero-channel's family stays checked here
# (add-zero-one, -vector, -same) and applied by tests/test_value_predicates.py::test_a_zero_bias_and_a_unit_scale_go;
# its NCHW form itself only with -m slow.
SLOW_CHECKS = {"conv-add-fold-channel", "conv-add-fold-channel-nobias", "conv-mul-fold-channel-nobias",
               "conv-input-affine-fold", "conv-input-affine-fold-nobias", "add-zero-channel", "add-zero-channel-last"}


@pytest.mark.parametrize("file, rule", [pytest.param(f, r, marks=pytest.mark.slow) if r.name in SLOW_CHECKS
                                        else (f, r) for f, r in CASES], ids=[f"{f}:{r.name}" for f, r in CASES])
def test_rule_is_sound(file, rule):
    result = verdict(rule)
    assert result.skipped is None, result.skipped
    assert result.ok, result.message


def test_default_includes_its_rules():
    """default.rules copies no rule: each comes by include from the shipped file that states it (which ones:
    tests/test_rulesets.py)."""
    for rule in SHIPPED["default"].rules:
        home = Path(rule.source.file).resolve()
        assert home.parent == RULES_DIR.resolve() and home.stem != "default", rule.name
        assert rule in SHIPPED[home.stem].rules, rule.name


WRONG = [
    "sub-swap: (Sub ?a ?b) => (Sub ?b ?a)",
    "add-drop: (Add ?a ?b) => ?a",
    "conv-drop-term: (Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x (Add ?w1 ?w2))"
    " => (Conv :group ?g :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x ?w1)",
    "transpose-matmul-unswapped: (Transpose :perm (1 0) (MatMul ?a ?b))"
    " => (MatMul (Transpose :perm (1 0) ?a) (Transpose :perm (1 0) ?b))",
    "split-concat-any-sizes: (getitem 0 (Split :axis ?k :split (?s1 ?s2) (Concat :axis ?k ?a ?b))) => ?a",
    "pool-concat-spatial: (Concat :axis 2 (MaxPool :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x)"
    " (MaxPool :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?y))"
    " => (MaxPool :kernel_shape ?k :strides ?s :pads ?p :dilations ?d (Concat :axis 2 ?x ?y))",
    # a Gather along the axis a MatMul contracts does not commute with it
    "gather-matmul-any-axis: (Gather :axis ?a :indices ?i (MatMul ?x ?w)) => (MatMul (Gather :axis ?a :indices ?i ?x) ?w)"
    " if (rank ?w 2) (rank ?x 2)",
    # attention's keys split into heads: (0 2 3 1) is (0 2 1 3) then (0 1 3 2), not the other order
    "heads-keys-misordered: (Transpose :perm (0 2 3 1) (Reshape :shape (?b ?l ?h ?d) ?k))"
    " => (Transpose :perm (0 2 1 3) (Transpose :perm (0 1 3 2) (Reshape :shape (?b ?l ?h ?d) ?k))) if (rank ?k 3)",
]


@pytest.mark.parametrize("text", WRONG, ids=[t.split(":")[0] for t in WRONG])
def test_wrong_rule_is_caught(text):
    (result,) = check_ruleset(parse_rules(text))
    assert not result.ok and result.skipped is None
    assert "differ" in result.message or "shape" in result.message


HEADS = [  # patterns that split a [batch, sequence, heads * size] tensor into heads, as attention does
    "heads-roundtrip: (Reshape :shape (?b ?s ?e) (Transpose :perm (0 2 1 3) (Transpose :perm (0 2 1 3)"
    " (Reshape :shape (?b ?s ?h ?d) ?q)))) => ?q if (rank ?q 3) (= ?e (* ?h ?d))",
    "heads-keys: (MatMul (Transpose :perm (0 2 1 3) (Reshape :shape (?b ?s ?h ?d) ?q))"
    " (Transpose :perm (0 2 3 1) (Reshape :shape (?b ?l ?h ?d) ?k)))"
    " => (MatMul (Transpose :perm (0 2 1 3) (Reshape :shape (?b ?s ?h ?d) ?q))"
    " (Transpose :perm (0 1 3 2) (Transpose :perm (0 2 1 3) (Reshape :shape (?b ?l ?h ?d) ?k)))) if (rank ?q 3) (rank ?k 3)",
]


@pytest.mark.parametrize("text", HEADS, ids=[t.split(":")[0] for t in HEADS])
def test_rules_over_reshapes_into_heads_have_instances(text):
    """A Reshape whose target the pattern fixes through variables bound elsewhere (the heads of q and k
    share ?b ?h ?d) draws its data from that target: such rules were skipped (no instance in 800 draws)."""
    (result,) = check_ruleset(parse_rules(text))
    assert result.skipped is None and result.ok, result.message


def test_pattern_that_never_matches_is_skipped():
    # every draw is rejected for the same reason, so 100 draws (not the default 800) show it
    result = check_rule(parse_rules("neg-axis: (Concat :axis -1 ?a ?b) => (Concat :axis -1 ?a ?b)").rules[0], draws=50)
    assert not result.ok and "stores :axis -1 as" in result.skipped


# ---------------------------------------------------------------- the rule sets on zoo models


def saturate(name: str, rules: str):
    model = zoo.build(name, small=True)
    imported = import_model(model)
    g = imported.egraph
    rounds = []
    report = Runner(g, list(SHIPPED[rules].rules), Limits(iterations=10, enodes=50_000, seconds=60),
                    on_round=lambda it: (g.check_invariants(), rounds.append(it))).run()
    assert report.stop_reason == StopReason.SATURATED and rounds
    return model, imported


def parallel(model, op_type: str, attrs=None) -> list[list[str]]:
    """Outputs of the ``op_type`` nodes over a weight (with one of ``attrs`` as attributes, when given)
    that share their first input, grouped by it (groups of 2 or more)."""
    weights = {t.name for t in model.graph.initializer}
    groups = defaultdict(list)
    for n in model.graph.node:
        if n.op_type == op_type and n.input[1] in weights and (
                attrs is None or {a.name: helper.get_attribute_value(a) for a in n.attribute} in attrs):
            groups[n.input[0]].append(n.output[0])
    return [outs for outs in groups.values() if len(outs) > 1]


def merged(imported, value: str, op_type: str, parts: int) -> bool:
    """Whether ``value``'s e-class holds a getitem of a Split of an ``op_type`` over a Concat of ``parts`` weights."""
    g = imported.egraph
    (cls,) = g.find([imported.values[value]])
    table, weight = ("op_conv", "w") if op_type == "Conv" else ("op_matmul", "b")
    return g.sql(
        f"SELECT count(*) FROM op_getitem gi JOIN op_split sp ON sp.out = gi.t JOIN {table} m ON m.out = sp.input "
        f"JOIN op_concat c ON c.out = m.{weight} WHERE gi.out = ? AND len(c.inputs) = ?", [int(cls), parts])[0][0] > 0


def test_bert_qkv_matmuls_merge():
    model, imported = saturate("bert", "merge")
    groups = parallel(model, "MatMul")
    assert len(groups) == 2 and all(len(qkv) == 3 for qkv in groups)  # Q, K, V of each layer
    for qkv in groups:
        for value in qkv:
            assert merged(imported, value, "MatMul", 3) and merged(imported, value, "MatMul", 2)


# convs that merge: 1x1 ones (enlarged to 3x3 first) and 3x3 ones with the same geometry, group 1
MERGEABLE = [{"kernel_shape": [k, k], "strides": [1, 1], "pads": [k // 2] * 4, "group": 1} for k in (1, 3)]


# inception_v3 (~5 s) with -m slow: squeezenet's parallel convs show the same merges by default
@pytest.mark.parametrize("name", ["squeezenet", pytest.param("inception_v3", marks=pytest.mark.slow)])
def test_parallel_convs_merge(name):
    model, imported = saturate(name, "merge")
    groups = parallel(model, "Conv", MERGEABLE)
    assert len(groups) >= 2
    for convs in groups:
        assert all(merged(imported, value, "Conv", 2) for value in convs), convs


def test_default_rules_fold_batchnorm_and_stay_small():
    model, imported = saturate("resnet50", "default")
    g = imported.egraph
    assert g.counts()["enodes"] < 4 * (len(model.graph.node) + len(model.graph.initializer))
    bns = [n.output[0] for n in model.graph.node if n.op_type == "BatchNormalization"]
    for value in bns:
        (cls,) = g.find([imported.values[value]])
        assert g.sql("SELECT count(*) FROM op_conv WHERE out = ?", [int(cls)])[0][0] >= 1, value


def test_taso_and_fold_rules_compile_and_run():
    """The rule sets the zoo tests above do not run: their SQL runs, and relu/pool/concat rules fire."""
    g = import_model(zoo.build("squeezenet", small=True)).egraph
    applied = {}
    for name in ("taso", "fold"):
        report = Runner(g, list(SHIPPED[name].rules), Limits(iterations=2, enodes=5_000, seconds=60),
                        on_round=lambda it: g.check_invariants()).run()
        applied.update(report.applied_by_rule)
    assert applied["relu-concat"] and applied["maxpool-concat-rev"]
