"""The rule-file front end: tokenizer, parser, desugaring into core IR, and the printer back.

Owns the surface syntax of ``*.rules`` files (UTF-8: another encoding is a ``RuleError`` at the
line and column of its first non-UTF-8 byte; parentheses nest at most ``MAX_NESTING`` deep, deeper
is a ``RuleError`` at the ``(`` that goes too deep)::

    # comment to end of line
    NAME: LHS (=> | <=>) RHS [if CONDITION...]

A rule starts at a ``NAME:`` token (by convention at the start of a line) and runs
until the next one (or the next ``include``), so it may span lines.  LHS and RHS are
comma-separated lists of terms ``(OP :attr VALUE ... child ...)`` (children: terms,
``?var``, ``_``), with ``(getitem I child)`` taking a literal index first; an RHS item
may be a bare ``?var``.
Attribute values are ints, floats (``1.5``, ``1e-5``, ``inf``), double-quoted JSON
strings, variables, or lists ``(1 ?n 3)`` of those.

Includes compose rule files by reference; each puts the rules of another file at its place,
in that file's order, and may stand wherever a rule may::

    include SET                  # a shipped set: programs/rules/SET.rules (``relsat.programs.rules.RULES_DIR``)
    include "PATH"               # a rule file; a relative PATH is relative to the including file
    include SET: NAME NAME ...   # only the rules of these (core) names, still in the file's order
    include "PATH": NAME ...

The name list runs to the next ``NAME:``, ``include`` or the end, so it may span lines; a ``<=>``
rule NAME gives the core rules NAME and NAME-rev, each named on its own.  An included rule keeps
its ``source`` (where it is written); ``RuleSet.included_at`` records the include that brought it
and ``RuleSet.files`` every file read.  Each file is parsed once per top-level parse.  A
``RuleError`` at the include's token reports an unknown set, a missing or unreadable file, a name
not in the included file (or named twice), an include cycle (with its chain), and a rule name that
the include makes a duplicate; an error inside an included file is reported where it is, with
``(included at FILE:LINE:COL)`` appended.

Desugaring (the IR's meaning is documented in ``ir.py``):

- optional inputs omitted at the end become ``Absent()`` (on the left too: absent,
  not "anything"); attributes are put in catalog order and ints given for floats
  become floats;
- on the right, omitted attributes get their catalog defaults; on the left of a
  ``=>`` rule an omitted attribute matches any value;
- ``L <=> R if C`` gives ``NAME: L => R if C`` and ``NAME-rev: R => L if C``.  Both
  sides of a ``<=>`` are also right sides, so both get defaults (the forward rule
  matches the default value only: the rule is an equation both ways).  In the
  reverse, a let whose variable R binds becomes the check ``(= ?var e)``;
- ``(rank ?v N)`` -> ``(= (rank ?v) N)``, ``(same-shape ?a ?b)`` ->
  ``(= (shape ?a) (shape ?b))``.

``parse_rules``/``load_rules`` then run ``checker.check_ruleset`` (included rules were
checked with their own file).  ``format_rule`` prints a core rule back (always with
``=>``; lets before conditions) so that ``parse_rules(format_rule(r)).rules == (r,)``.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from relsat.programs.checker import ECLASS, check_ruleset, variables
from relsat.programs.ir import (
    ARITH_OPS, CMP_OPS, DTYPES, Absent, BinOp, Cmp, Dim, Len, Let, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule, Size,
    RuleError, RuleSet, ShapeOf, SourceLoc, Term, Var,
)  # fmt: skip
from relsat.programs.rules import shipped, shipped_file
from relsat.relations import catalog

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\f\v]+|\#[^\n]*)
  | (?P<nl>\n)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<header>[A-Za-z_][\w.\-]*:(?![\w:]))
  | (?P<arrow><=>|=>)
  | (?P<number>[+-]?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?|inf|nan)(?=[\s(),\#]|$))
  | (?P<var>\?[A-Za-z_]\w*)
  | (?P<attr>:[A-Za-z_]\w*)
  | (?P<absent>_(?![\w.\-]))
  | (?P<symbol>[A-Za-z_][\w.\-]*|!=|<=|>=|[=<>+\-*/%])
  | (?P<punct>[(),:])
    """,
    re.X,
)
_ATOMS = ("int", "float", "string", "var")


class _Tok(NamedTuple):
    kind: str  # ( ) , : => <=> header int float string var attr absent symbol eof
    text: str
    value: object  # the Python value of a literal
    loc: SourceLoc


def _tokenize(text: str, file: str) -> list[_Tok]:
    tokens, line, line_start, pos = [], 1, 0, 0
    while pos < len(text):
        loc = SourceLoc(file, line, pos - line_start + 1)
        m = _TOKEN.match(text, pos)
        if m is None:
            reason = "unterminated string" if text[pos] == '"' else f"unexpected character {text[pos]!r}"
            raise RuleError.at(loc, reason)
        kind, tok = m.lastgroup, m.group()
        pos = m.end()
        if kind == "nl":
            line, line_start = line + 1, pos
        elif kind == "number":
            is_int = re.fullmatch(r"[+-]?\d+", tok)
            tokens.append(_Tok("int" if is_int else "float", tok, int(tok) if is_int else float(tok), loc))
        elif kind == "string":
            try:
                tokens.append(_Tok(kind, tok, json.loads(tok), loc))
            except json.JSONDecodeError:
                raise RuleError.at(loc, f"invalid string literal {tok}") from None
        elif kind != "ws":
            tokens.append(_Tok(tok if kind in ("punct", "arrow") else kind, tok, None, loc))
    tokens.append(_Tok("eof", "", None, SourceLoc(file, line, pos - line_start + 1)))
    return tokens


def _show(tok: _Tok) -> str:
    return "end of input" if tok.kind == "eof" else repr(tok.text)


# (argument kinds, constructor) per head; "*" = any number of expressions
_EXPRS = {
    "dim": (("var", "int"), Dim),
    "size": (("var", "int"), Size),
    "rank": (("var",), Rank),
    "numel": (("var",), Numel),
    "shape": (("var",), ShapeOf),
    "len": (("expr",), Len),
    "list": (("*",), lambda *items, loc: ListExpr(items, loc=loc)),
    **{op: (("expr", "expr"), functools.partial(BinOp, op)) for op in ARITH_OPS},
}
_CONDITIONS = {
    "const": (("var",), functools.partial(Pred, "const")),
    "not-const": (("var",), functools.partial(Pred, "not-const")),
    "dynamic": (("var",), functools.partial(Pred, "dynamic")),
    "dtype": (("var", "dtype"), functools.partial(Pred, "dtype")),
    "zeros": (("var",), functools.partial(Pred, "zeros")),
    "ones": (("var",), functools.partial(Pred, "ones")),
    "rank": (("var", "expr"), lambda v, n, loc: Cmp("=", Rank(v, loc=loc), n, loc=loc)),
    "same-shape": (("var", "var"), lambda a, b, loc: Cmp("=", ShapeOf(a, loc=a.loc), ShapeOf(b, loc=b.loc), loc=loc)),
    "let": (("var", "expr"), Let),
    **{op: (("expr", "expr"), functools.partial(Cmp, op)) for op in CMP_OPS},
}
_ARG_NAMES = {"var": "?v", "int": "I", "expr": "e", "dtype": "DTYPE", "*": "e..."}


_INCLUDE = "include"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")


def _is_include(tok: _Tok) -> bool:
    return tok.kind == "symbol" and tok.text == _INCLUDE


class _Parser:
    def __init__(self, tokens: list[_Tok], loader: _Loader | None = None, filename: str = "<string>"):
        self.tokens, self.pos = tokens, 0
        self.loader, self.filename = loader or _Loader(), filename
        self.included: list[RuleSet] = []  # the sets included, in order

    def peek(self) -> _Tok:
        return self.tokens[self.pos]

    def take(self) -> _Tok:
        tok = self.tokens[self.pos]
        self.pos += tok.kind != "eof"
        return tok

    def expect(self, kind: str, what: str) -> _Tok:
        tok = self.take()
        if tok.kind != kind:
            raise RuleError.at(tok.loc, f"expected {what}, got {_show(tok)}")
        return tok

    def rules(self) -> list[tuple[Rule, SourceLoc | None]]:
        """The rules in file order, each with the include that brought it (None: written here)."""
        rules = []
        while self.peek().kind != "eof":
            if _is_include(self.peek()):
                rules += self.include()
            else:
                rules += [(rule, None) for rule in self.rule()]
        return rules

    def include(self) -> list[tuple[Rule, SourceLoc]]:
        """``include SET`` | ``include "PATH"``, optionally followed by ``: NAME...``."""
        self.take()
        target = self.take()
        if target.kind == "header":
            target, selecting = target._replace(kind="symbol", text=target.text[:-1]), True
        elif target.kind == "string" or target.kind == "symbol" and _NAME.fullmatch(target.text):
            selecting = self.peek().kind == ":"
            self.pos += selecting
        else:
            raise RuleError.at(target.loc, "expected a rule set name or a quoted file path after 'include', "
                               f"got {_show(target)}")
        if not selecting and self.peek().kind == "attr":
            raise RuleError.at(self.peek().loc, f"put a space between ':' and the first rule name after {target.text}")
        names = []
        while selecting and not _is_include(self.peek()) and _NAME.fullmatch(self.peek().text) \
                and self.peek().kind in ("symbol", "float", "absent"):  # fmt: skip
            names.append(self.take())
        if selecting and not names:
            raise RuleError.at(self.peek().loc, f"expected the names of the rules to take from {target.text} "
                               f"after ':', got {_show(self.peek())}")
        if self.peek().kind not in ("header", "eof") and not _is_include(self.peek()):
            expected = "another rule name" if selecting else "':' and rule names"
            raise RuleError.at(self.peek().loc, f"expected {expected}, a new rule 'NAME:' or 'include' after "
                               f"'include {target.text}', got {_show(self.peek())}")
        included = self.loader.include(target, self.filename)
        self.included.append(included)
        known = {rule.name for rule in included.rules}
        chosen: set[str] = set()
        for tok in names:
            if tok.text not in known:
                close = difflib.get_close_matches(tok.text, known, n=1)
                raise RuleError.at(tok.loc, f"no rule {tok.text!r} in {included.source}"
                                   + (f"; did you mean {close[0]!r}?" if close else ""))
            if tok.text in chosen:
                raise RuleError.at(tok.loc, f"rule {tok.text!r} is named twice")
            chosen.add(tok.text)
        return [(rule, target.loc) for rule in included.rules if not names or rule.name in chosen]

    def rule(self) -> list[Rule]:
        head = self.expect("header", "a rule 'NAME: LHS => RHS'")
        lhs = self.side()
        arrow = self.take()
        if arrow.kind not in ("=>", "<=>"):
            raise RuleError.at(arrow.loc, f"expected ',', '=>' or '<=>' after the left side, got {_show(arrow)}")
        rhs = self.side()
        conditions, lets = [], []
        if self.peek().text == "if" and self.peek().kind == "symbol":
            self.take()
            while True:
                cond = self.call(_CONDITIONS, "condition")
                (lets if isinstance(cond, Let) else conditions).append(cond)
                if self.peek().kind != "(":
                    break
        if self.peek().kind not in ("header", "eof") and not _is_include(self.peek()):
            expected = "a condition '(...)'" if conditions or lets else "',', 'if'"
            raise RuleError.at(self.peek().loc, f"expected {expected} or a new rule 'NAME:', got {_show(self.peek())}")
        return _desugar(head.text[:-1], lhs, arrow.text, rhs, tuple(conditions), tuple(lets), head.loc)

    def side(self) -> list[Term | Var]:
        items = [self.item()]
        while self.peek().kind == ",":
            self.take()
            items.append(self.item())
        return items

    def item(self) -> Term | Var:
        tok = self.peek()
        if tok.kind == "var":
            return self.atom(self.take())
        if tok.kind == "(":
            return self.term()
        raise RuleError.at(tok.loc, f"expected a term '(OP ...)' or a variable, got {_show(tok)}")

    def term(self) -> Term:
        opening = self.expect("(", "'('")
        op = self.expect("symbol", "an operator name")
        index = self.take().value if op.text == "getitem" and self.peek().kind == "int" else None
        attrs, attr_locs, children = [], [], []
        while (tok := self.peek()).kind != ")":
            if tok.kind == "attr":
                self.take()
                attrs.append((tok.text[1:], self.attr_value()))
                attr_locs.append(tok.loc)
            elif tok.kind in ("(", "var"):
                children.append(self.item())
            elif tok.kind == "absent":
                children.append(Absent(self.take().loc))
            elif tok.kind == "eof":
                raise RuleError.at(opening.loc, "'(' is never closed")
            else:
                hint = "missing ')'?" if tok.kind in ("header", "=>", "<=>", ",") else "a child is a term, ?var or _"
                raise RuleError.at(tok.loc, f"unexpected {_show(tok)} in ({op.text} ...); {hint}")
        self.take()
        return Term(op.text, tuple(attrs), tuple(children), index, op.loc, tuple(attr_locs))

    def attr_value(self) -> Lit | ListOf | Var:
        tok = self.take()
        if tok.kind == "(":
            items = []
            while (item := self.take()).kind != ")":
                if item.kind not in _ATOMS:
                    raise RuleError.at(item.loc, f"an attribute list holds literals and variables, got {_show(item)}"
                                       " (compute values with (let ?v e))")
                items.append(self.atom(item))
            return ListOf(tuple(items), tok.loc)
        if tok.kind not in _ATOMS:
            raise RuleError.at(tok.loc, f"expected an attribute value, got {_show(tok)}")
        return self.atom(tok)

    @staticmethod
    def atom(tok: _Tok) -> Lit | Var:
        return Var(tok.text[1:], tok.loc) if tok.kind == "var" else Lit(tok.value, tok.loc)

    def expr(self):
        tok = self.peek()
        if tok.kind in _ATOMS:
            return self.atom(self.take())
        if tok.kind == "(":
            return self.call(_EXPRS, "expression")
        raise RuleError.at(tok.loc, f"expected an expression, got {_show(tok)}")

    def call(self, table: dict, noun: str):
        """``(HEAD args...)`` for a head of ``table`` (the conditions or the expressions)."""
        self.expect("(", f"'(' starting a {noun}")
        head = self.take()
        if head.text not in table or head.kind != "symbol":
            close = difflib.get_close_matches(head.text, table, n=1)
            raise RuleError.at(head.loc, f"unknown {noun} {_show(head)}"
                               + (f"; did you mean {close[0]!r}?" if close else f" (known: {' '.join(table)})"))
        kinds, build = table[head.text]
        usage = f"usage: ({head.text} {' '.join(_ARG_NAMES[k] for k in kinds)})"
        args = []
        for kind in kinds:
            if kind == "*":
                while self.peek().kind != ")":
                    args.append(self.expr())
            elif self.peek().kind == ")":
                raise RuleError.at(self.peek().loc, f"too few arguments; {usage}")
            else:
                args.append(self.arg(kind))
        if self.peek().kind != ")":
            raise RuleError.at(self.peek().loc, f"expected ')', got {_show(self.peek())}; {usage}")
        self.take()
        return build(*args, loc=head.loc)

    def arg(self, kind: str):
        if kind == "expr":
            return self.expr()
        if kind == "var":
            return self.atom(self.expect("var", "a variable"))
        if kind == "int":
            return self.expect("int", "an integer").value
        tok = self.expect("symbol", "a dtype name")
        if tok.text not in DTYPES:
            raise RuleError.at(tok.loc, f"unknown dtype {tok.text!r} (known: {' '.join(DTYPES)})")
        return DTYPES[tok.text]


# ---------------------------------------------------------------- desugaring


def _desugar(name, lhs, arrow, rhs, conditions, lets, loc) -> list[Rule]:
    both = arrow == "<=>"
    left, right = tuple(_normalize(p, both) for p in lhs), tuple(_normalize(t, True) for t in rhs)
    forward = Rule(name, left, right, conditions, lets, loc, name if both else None)
    if not both:
        return [forward]
    bound = {var.name for term in right for var, _ in variables(term, ECLASS)}
    checks = tuple(Cmp("=", let.var, let.expr, let.loc) for let in lets if let.var.name in bound)
    unbound = tuple(let for let in lets if let.var.name not in bound)
    return [forward, Rule(f"{name}-rev", right, left, conditions + checks, unbound, loc, name)]


def _normalize(node, fill: bool):
    """Pad omitted optional inputs with Absent, coerce float attributes, fill defaults if ``fill``, sort attrs."""
    if not isinstance(node, Term):
        return node
    children = tuple(_normalize(c, fill) for c in node.children)
    op = catalog.BY_TYPE.get(node.op)
    if op is None:
        return replace(node, children=children)
    missing = op.inputs[len(children):]
    if not op.variadic and all(i.optional for i in missing):
        children += tuple(Absent() for _ in missing)
    known = {} if node.op == "getitem" else {a.name: a for a in op.attrs}
    attrs = [(n, _coerce(v, known[n].kind) if n in known else v, l) for (n, v), l in zip(node.attrs, node.attr_locs)]
    if fill:
        given = {n for n, _, _ in attrs}
        attrs += [(a.name, _coerce(_literal(a.default), a.kind), node.loc)
                  for a in known.values() if a.name not in given and a.default is not catalog.REQUIRED]  # fmt: skip
    order = {n: i for i, n in enumerate(known)}
    attrs.sort(key=lambda a: order.get(a[0], len(order)))
    return replace(node, attrs=tuple((n, v) for n, v, _ in attrs), children=children,
                   attr_locs=tuple(l for _, _, l in attrs))  # fmt: skip


def _literal(value) -> Lit | ListOf:
    return ListOf(tuple(Lit(v) for v in value)) if isinstance(value, (list, tuple)) else Lit(value)


def _as_float(value):
    return replace(value, value=float(value.value)) if isinstance(value, Lit) and type(value.value) is int else value


def _coerce(value, kind: str):
    if kind == "float":
        return _as_float(value)
    if kind == "floats" and isinstance(value, ListOf):
        return replace(value, items=tuple(map(_as_float, value.items)))
    return value


# ---------------------------------------------------------------- includes


class _Loader:
    """The files of one top-level parse: includes resolved (a shipped set name in
    ``relsat.programs.rules.RULES_DIR``, a quoted path relative to the including file), each file parsed
    once, include cycles refused."""

    def __init__(self):
        self.done: dict[Path, RuleSet] = {}
        self.open: list[tuple[Path, str]] = []  # the files being parsed, outermost first

    def parse(self, text: str, filename: str) -> RuleSet:
        self.open.append((Path(filename).resolve(), filename))
        try:
            tokens = _tokenize(text, filename)
            _check_nesting(tokens)
            parser = _Parser(tokens, self, filename)
            rules = parser.rules()
        finally:
            self.open.pop()
        vias = [via for _, via in rules]
        files = dict.fromkeys([filename, *(f for included in parser.included for f in included.files)])
        ruleset = RuleSet(Path(filename).stem, tuple(rule for rule, _ in rules), filename,
                          tuple(vias) if any(vias) else (), tuple(files))  # fmt: skip
        check_ruleset(ruleset)
        return ruleset

    def include(self, target: _Tok, including: str) -> RuleSet:
        """The rule set an include names (``target``: its set name or path token)."""
        if target.kind == "string":
            path = Path(target.value)
            path = path if path.is_absolute() else Path(including).parent / path
        else:
            path = shipped_file(target.text)
            if path is None:
                known = shipped()
                close = difflib.get_close_matches(target.text, known, n=1)
                hint = (f"; did you mean {close[0]!r}?" if close else "") + (
                    f'; a file path is quoted: include "{target.text}"' if target.text.endswith(".rules") else "")
                raise RuleError.at(target.loc, f"no shipped rule set {target.text!r} (shipped: {', '.join(known)})"
                                   + hint)
        key = path.resolve()
        chain = [shown for resolved, shown in self.open]
        for i, (resolved, _) in enumerate(self.open):
            if resolved == key:
                raise RuleError.at(target.loc, f"include cycle: {' -> '.join(chain[i:] + [str(path)])}")
        if key not in self.done:
            try:
                text = read_rule_file(path)
            except FileNotFoundError:
                raise RuleError.at(target.loc, f"rule file {path} not found") from None
            except OSError as e:
                raise RuleError.at(target.loc, f"cannot read rule file {path}: {e.strerror or e}") from None
            except RuleError as e:
                raise RuleError(e.file, e.line, e.column, f"{e.reason} (included at {target.loc})") from None
            try:
                self.done[key] = self.parse(text, str(path))
            except RuleError as e:
                raise RuleError(e.file, e.line, e.column, f"{e.reason} (included at {target.loc})") from None
        return self.done[key]


# ---------------------------------------------------------------- entry points and printer


def parse_rules(text: str, filename: str = "<string>") -> RuleSet:
    """Parse, desugar and check the rules in ``text`` (with the files it includes, relative ones
    found beside ``filename``); raise ``RuleError`` on the first problem."""
    return _Loader().parse(text, filename)


def load_rules(path: str | Path) -> RuleSet:
    """``parse_rules`` on a UTF-8 rule file."""
    return parse_rules(read_rule_file(path), str(path))


MAX_NESTING = 64  # parentheses a rule may nest; deeper is refused (the parser and the checks recurse)


def read_rule_file(path: str | Path) -> str:
    """A rule file's text (UTF-8, a byte-order mark allowed); RuleError at the line and column of the first
    byte that is not UTF-8 (OSError as open raises it)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")  # the file changed between the two reads
    except UnicodeDecodeError as e:
        start = raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw
        pos = e.start - (len(raw) - len(start))
        line = start.count(b"\n", 0, pos) + 1
        column = pos - (start.rfind(b"\n", 0, pos) + 1) + 1
        raise RuleError(str(path), line, column, f"byte 0x{start[pos]:02x} is not UTF-8 text (rule files are "
                        "UTF-8; save the file as UTF-8)") from None


def _check_nesting(tokens: list[_Tok]) -> None:
    """RuleError at the first '(' nested deeper than ``MAX_NESTING`` (found without recursion)."""
    depth = 0
    for tok in tokens:
        if tok.kind == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise RuleError.at(tok.loc, f"parentheses nested more than {MAX_NESTING} deep; split the rule "
                                   "(a rule this deep cannot be checked or matched)")
        elif tok.kind == ")":
            depth = max(depth - 1, 0)


def format_rule(rule: Rule) -> str:
    """A core rule in the surface syntax (one line, ``=>``)."""
    text = f"{rule.name}: {', '.join(map(format_term, rule.patterns))} => {', '.join(map(format_term, rule.rhs))}"
    conditions = rule.lets + rule.conditions
    return text + (" if " + " ".join(map(format_term, conditions)) if conditions else "")


_DTYPE_NAMES = {code: name for name, code in DTYPES.items()}
_OF_VAR = {Rank: "rank", Numel: "numel", ShapeOf: "shape"}


def format_term(node) -> str:
    """A term, list, literal or condition in the rules' surface syntax (variables spelled ``?name``), as
    ``format_rule`` writes it: what rule checks, verification and the generator name a term by."""
    match node:
        case Var(name=name):
            return "?" + name
        case Absent():
            return "_"
        case Lit(value=str(value)):
            return json.dumps(value, ensure_ascii=False)
        case Lit(value=value):
            return repr(value)
        case ListOf(items=items):
            return f"({' '.join(map(format_term, items))})"
        case Term(op=op, attrs=attrs, children=children, index=index):
            children = list(children)
            while children and isinstance(children[-1], Absent):
                children.pop()
            parts = [op, *([str(index)] if index is not None else []), *(f":{n} {format_term(v)}" for n, v in attrs)]
            return f"({' '.join(parts + [format_term(c) for c in children])})"
        case Size(var=var, index=index):
            return f"(size {format_term(var)} {index})"
        case Dim(var=var, index=index):
            return f"(dim {format_term(var)} {index})"
        case Rank(var=var) | Numel(var=var) | ShapeOf(var=var):
            return f"({_OF_VAR[type(node)]} {format_term(var)})"
        case BinOp(op=op, left=left, right=right) | Cmp(op=op, left=left, right=right):
            return f"({op} {format_term(left)} {format_term(right)})"
        case ListExpr(items=items):
            return f"(list{''.join(' ' + format_term(i) for i in items)})"
        case Len(expr=expr):
            return f"(len {format_term(expr)})"
        case Pred(kind=kind, var=var, dtype=dtype):
            return f"({kind} {format_term(var)}" + (f" {_DTYPE_NAMES[dtype]})" if kind == "dtype" else ")")
        case Let(var=var, expr=expr):
            return f"(let {format_term(var)} {format_term(expr)})"
    raise TypeError(f"not a rule IR node: {node!r}")
