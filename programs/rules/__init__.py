"""The shipped rule sets: one ``NAME.rules`` file each, in this folder.

``shipped()`` lists their names and ``shipped_file(name)`` finds one; the parser resolves
``include NAME`` with it and ``relsat.programs.rulesets`` resolves ``--rules NAME``.
"""

from __future__ import annotations

from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent


def shipped() -> list[str]:
    """The names of the shipped rule sets, sorted."""
    return sorted(p.stem for p in RULES_DIR.glob("*.rules"))


def shipped_file(name: str) -> Path | None:
    """The file of the shipped set ``name``, or None when there is no such set."""
    if not name or any(sep in name for sep in "/\\") or name.startswith("."):
        return None
    path = RULES_DIR / f"{name}.rules"
    return path if path.is_file() else None
