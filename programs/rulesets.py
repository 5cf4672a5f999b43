"""Rule-set lookup: the shipped sets, ``--rules`` values resolved to files, and their rules.

A ``--rules`` value is a shipped set name (``programs/rules/NAME.rules``) or a rule file path.
Rule files compose by reference (``include SET``, ``include "PATH"``, ``include SET: NAME...``;
see ``parser.py``), so one set may read several files: ``rule_sources`` lists them all.

Errors about the values themselves (no such set or file, an unsound user rule) are
``RuleSetError``, whose str is one line; errors inside a rule file are the parser's
``RuleError`` (``file:line:col: reason``).  This module imports nothing above ``programs``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from relsat.programs.ir import Rule
from relsat.programs.parser import load_rules
from relsat.programs.rules import RULES_DIR, shipped, shipped_file  # noqa: F401  (re-exported)



class RuleSetError(ValueError):
    """A bad rule-set value (unknown set, missing file) or an unsound user rule; str() is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def rule_files(names) -> list[Path]:
    """Resolve ``--rules`` values: a shipped set name (programs/rules/NAME.rules) or a file path."""
    out = []
    for name in names:
        path = Path(name)
        if path.suffix == ".rules" or path.exists():
            if not path.exists():
                raise RuleSetError(f"{name}: rule file not found")
            if not path.is_file():
                raise RuleSetError(f"{name}: is a folder, not a rule file")
            out.append(path)
            continue
        shipped_path = RULES_DIR / f"{name}.rules"
        if not shipped_path.exists():
            raise RuleSetError(f"--rules {name}: no such rule set (shipped: {', '.join(shipped())}) and no such file")
        out.append(shipped_path)
    return out


def is_shipped(path) -> bool:
    """A rule file of the shipped sets (verified by the test suite), not a user's."""
    return Path(path).resolve().parent == RULES_DIR


GENERATED = "generated"  # the shipped set that ``relsat rules generate`` writes (checked on random draws, not by hand)


def hand_written(rule: Rule) -> bool:
    """A rule of a shipped set written by hand (its every application is trusted to keep its e-class's shape: a
    conflict there is a bug, raised); a generated or user rule is checked per match (``Runner``: a match whose
    right side's shape is not its left side's is left out and reported)."""
    return rule.source is not None and _hand_written_file(rule.source.file)


@functools.lru_cache(maxsize=None)
def _hand_written_file(file: str) -> bool:
    """(Once per file: a path resolved per rule took 74 ms for the 1,745 default and generated rules, in every
    ``Runner.run``, and MCTS runs one per action.)"""
    return is_shipped(file) and Path(file).stem != GENERATED


def checked_rules(rules) -> frozenset[str]:
    """The names of the rules whose matches are checked one by one (not ``hand_written``)."""
    return frozenset(r.name for r in rules if not hand_written(r))


def rule_sources(names) -> list[Path]:
    """Every rule file that the ``--rules`` values ``names`` read, transitively through their
    includes, each once, in the order first read (a value's own file before those it includes):
    what a cache key must hash so that editing an included file invalidates it."""
    out: dict[Path, Path] = {}
    for path in rule_files(names):
        for file in load_rules(path).files:
            out.setdefault(Path(file).resolve(), Path(file))
    return list(out.values())


def check_rule_files(files) -> int:
    """Verify every rule of every user rule file (not the shipped sets) on random tensors, as
    ``relsat rules check`` does; RuleSetError naming file, line and rule for the first rule that
    differs or cannot be checked. A rule a user file includes from a shipped set is not verified
    again, nor a rule met twice. Returns the number of rules checked."""
    from relsat.programs.verify import check_rule

    checked, seen = 0, set()
    for path in files:
        if is_shipped(path):
            continue
        for rule in load_rules(path).rules:
            key = (rule.source, rule.name)  # the two directions of a <=> rule share their source
            if rule.source is not None and (key in seen or is_shipped(rule.source.file)):
                continue
            seen.add(key)
            verdict = check_rule(rule)
            checked += 1
            if verdict.ok:
                continue
            where = f"{rule.source}" if rule.source else str(path)
            if verdict.skipped:
                raise RuleSetError(f"{where}: rule {rule.name} cannot be verified ({verdict.skipped}); relsat "
                                   "uses only rules it has checked on random tensors")
            raise RuleSetError(f"{where}: rule {rule.name} is unsound: {verdict.message}")
    return checked


def load_rule_list(names, *, check: bool = False) -> list[Rule]:
    """The rules of ``--rules`` values, in order; ``check``: verify user rule files first (``check_rule_files``)."""
    files = rule_files(names)
    if check:
        check_rule_files(files)
    rules = []
    for path in files:
        rules += list(load_rules(path).rules)
    return rules
