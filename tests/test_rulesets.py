"""Rule-set lookup (programs/rulesets.py) and the shipped sets composed by include."""

from pathlib import Path

import pytest

from relsat.programs import rulesets
from relsat.programs.parser import format_rule, load_rules
from relsat.programs.rulesets import (
    RULES_DIR, RuleSetError, check_rule_files, is_shipped, load_rule_list, rule_files, rule_sources, shipped,
)  # fmt: skip

FIXTURES = Path(__file__).parent / "fixtures"

# what default.rules takes from each file, block by block, in its order
DEFAULT_BLOCKS = [
    ("runtime", None),  # all of it (issue 25)
    ("fold", ["bn-fold-conv-bias", "bn-fold-conv", "bn-fold-convtranspose-bias", "bn-fold-convtranspose",
              "bn-fold-gemm-t", "bn-fold-gemm"]),
    ("taso", ["matmul-add-distrib-right-rev", "conv-weight-distrib-rev"]),
    ("fold", ["identity", "reshape-reshape", "reshape-noop", "squeeze-unsqueeze", "split-one", "concat-one",
              "flatten-2d", "pad-zero-3", "pad-zero-4",
              "add-zero-one", "add-zero-vector", "add-zero-channel-last", "add-zero-channel", "add-zero-same",
              "matmul-zero-add", "add-matmul-zero",
              "mul-one-one", "mul-one-vector", "mul-one-same", "transpose-identity-2",
              "transpose-identity-3", "transpose-identity-4", "transpose-inverse-2", "transpose-compose-3",
              "transpose-compose-4"]),
    ("fold", ["relu-idempotent", "clip-relu", "relu-clip", "clip-as-relu"]),
    ("fold", ["gemm-matmul-add", "gemm-add-matmul"]),
]  # merge.rules left out since issue 25 (slower on the CPU provider; it filled transformers' node limit)  # fmt: skip


def test_default_is_the_concatenation_of_what_it_includes():
    default = load_rules(RULES_DIR / "default.rules")
    expected = []
    for name, names in DEFAULT_BLOCKS:
        rules = load_rules(RULES_DIR / f"{name}.rules").rules
        expected += [r for r in rules if names is None or r.name in names]
        assert names is None or [r.name for r in rules if r.name in names] == names  # listed in file order
    assert default.rules == tuple(expected)
    assert [r.source for r in default.rules] == [r.source for r in expected]  # where each is written
    assert all(Path(r.source.file).name != "default.rules" for r in default.rules)


def test_default_is_unchanged_by_the_move_to_includes():
    """tests/fixtures/default_before_include.rules is default.rules as it was, its rules copied verbatim."""
    merge = {r.name for r in load_rules(RULES_DIR / "merge.rules").rules}  # left out since issue 25
    later = {"split-one", "concat-one", "flatten-2d",  # (issue 25: a detector's one-part Splits and Concats)
             "pad-zero-3", "pad-zero-4", "add-zero-one", "add-zero-vector", "add-zero-same", "mul-one-one",
             "mul-one-vector", "mul-one-same",  # added since (issue 25: Swin's zero padding, zero biases)
             "add-zero-channel-last", "add-zero-channel",  # (ConvNeXt V2's zero GRN beta)
             "matmul-zero-add", "add-matmul-zero",  # (NasRNN's zero initial state)
             "bn-fold-convtranspose-bias", "bn-fold-convtranspose", "bn-fold-gemm-t", "bn-fold-gemm"}  # (issue 28: DCGAN, once ConvTranspose was cataloged)
    before = tuple(r for r in load_rules(FIXTURES / "default_before_include.rules").rules if r.name not in merge)
    after = [r for r in load_rules(RULES_DIR / "default.rules").rules
             if Path(r.source.file).name != "runtime.rules" and r.name not in later]
    assert [r.name for r in after] == [r.name for r in before]  # runtime.rules came later, in front
    assert [format_rule(r) for r in after] == [format_rule(r) for r in before]
    assert tuple(after) == before


def test_shipped_and_lookup():
    assert RULES_DIR == Path(rulesets.__file__).resolve().parent / "rules"
    assert {"ac-add", "default", "fold", "merge", "taso"} <= set(shipped()) and shipped() == sorted(shipped())
    assert rulesets.shipped_file("fold") == RULES_DIR / "fold.rules"
    assert rulesets.shipped_file("nope") is None and rulesets.shipped_file("../rules/fold") is None
    assert is_shipped(RULES_DIR / "taso.rules") and not is_shipped(FIXTURES / "default_before_include.rules")


def test_rule_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.rules").write_text("r: (Relu ?x) => ?x\n")
    (tmp_path / "noext").write_text("r: (Relu ?x) => ?x\n")
    assert rule_files(["default", "mine.rules", "noext"]) == [RULES_DIR / "default.rules", Path("mine.rules"),
                                                             Path("noext")]  # fmt: skip
    with pytest.raises(RuleSetError) as info:
        rule_files(["gone.rules"])
    assert str(info.value) == "gone.rules: rule file not found"
    with pytest.raises(RuleSetError) as info:
        rule_files(["fodl"])
    assert str(info.value) == f"--rules fodl: no such rule set (shipped: {', '.join(shipped())}) and no such file"
    assert isinstance(info.value, ValueError)


def test_rule_sources_are_transitive(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mine.rules").write_text('include "../other.rules"\ninclude ac-add: add-comm\n')
    (tmp_path / "other.rules").write_text("r: (Relu ?x) => ?x\ninclude fold: identity\n")
    top = tmp_path / "lib" / "mine.rules"
    assert [p.resolve() for p in rule_sources([str(top)])] == [
        top, tmp_path / "other.rules", RULES_DIR / "fold.rules", RULES_DIR / "ac-add.rules"]  # fmt: skip
    # each file once, across values too
    assert rule_sources(["default", "fold"]) == [RULES_DIR / f"{n}.rules"
                                                 for n in ("default", "runtime", "fold", "taso")]
    assert rule_sources(["ac-add"]) == [RULES_DIR / "ac-add.rules"]


def test_load_rule_list_concatenates():
    rules = load_rule_list(["ac-add", "default"])
    assert rules == list(load_rules(RULES_DIR / "ac-add.rules").rules) + list(load_rules(RULES_DIR / "default.rules").rules)


def test_check_rule_files_verifies_user_rules_only(tmp_path):
    (tmp_path / "sound.rules").write_text("include default\nrelu-idem-2: (Relu (Relu (Relu ?x))) => (Relu ?x)\n")
    assert check_rule_files([RULES_DIR / "default.rules", tmp_path / "sound.rules"]) == 1
    (tmp_path / "wrong.rules").write_text("# unsound\n\nsig-drop: (Sigmoid ?x) => ?x\n")
    (tmp_path / "user.rules").write_text('include fold: identity\ninclude "wrong.rules"\n')
    with pytest.raises(RuleSetError) as info:
        load_rule_list([str(tmp_path / "user.rules")], check=True)
    assert str(info.value).startswith(f"{tmp_path / 'wrong.rules'}:3:1: rule sig-drop is unsound: ")
