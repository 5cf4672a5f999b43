"""Symbolic dimensions: how a dynamic dim (``batch``, ``sequence``, an unnamed one) lives in a shape.

A shape is a list of BIGINTs everywhere in relsat (the ``eclass`` analysis, the catalog's SQL
rules, ONNX import and export).  A dynamic dim is held in it as a *symbol code*: a number at or
below ``SYM_BASE`` (-2**40), far from any real size and from the small negative numbers that
invalid shape arithmetic produces.  The k-th symbol of an e-graph (k = 1, 2, ...) has code
``SYM_BASE - k``; the ``symbols`` table of the e-graph names it (the model's ``dim_param``, or a
made-up name for an unnamed dynamic dim, ``anonymous``) and holds the value it is *bound* to for
costs and timing (the representative shape) and a second value used in verification.

What the catalog's shape rules may do with a symbol (SQL macros in ``catalog.SQL_MACROS``):
equal symbols are equal dims (``=`` compares codes); a symbol is never provably 1, 0 or equal to
a number; arithmetic that involves a symbol gives NULL (the node is not derived) except where the
result is the symbol itself (``x * 1``, ``x + 0``, a full slice, the product of one symbol), a
product compared as a whole (Reshape: same concrete factor and the same multiset of symbols), or a
sliding window's output size (Conv, pools over a dynamic image size): a *derived symbol*
(``window_dim``) whose code is computed from the input symbol and the window, so that the same
window over the same dim gives the same symbol wherever it is derived (import maps the dim ONNX
shape inference gives there onto it; its sizes at each binding come from that inference).
A symbol times a number (``batch * 197`` when ViT's tokens are flattened for a Gemm, Swin's
``batch * 64`` windows) is a *product dim* (``product_dim``): its code holds the symbol and the
factor, so it is bound as the symbol's binding times the factor, and Reshape compares element
counts with it expanded (the factor to the numbers, the symbol to the symbols).
So a rule whose condition needs a concrete size fires only when the shapes prove it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SYM_BASE = -(1 << 40)  # symbol k has code SYM_BASE - k
BATCH_NAMES = {"n", "b", "bs", "batch", "batch_size", "batchsize", "batch_dim", "batches", "num_batches"}
BATCH_VALUE = 1  # a batch-like symbol is costed at 1 ...
BATCH_SECOND = 3  # ... and verified again at 3
OTHER_VALUES = (128, 64, 256, 512, 32, 224)  # other symbols: the first of these at which the model runs,
# costed there and verified again at the next one that runs (the same one when no other runs)


def is_sym(d) -> bool:
    return d is not None and int(d) <= SYM_BASE


def code(k: int) -> int:
    """The code of the k-th symbol (k >= 1)."""
    return SYM_BASE - k


DERIVED_BASE = SYM_BASE - (1 << 30)  # derived symbols (window_dim) have codes below this
_DERIVED_MOD = 274877906879  # a prime below 2**38


def window_dim(i: int, k: int, s: int, p0: int, p1: int, d: int, ceil_mode: int) -> int | None:
    """The output size of a sliding window (Conv, pools) over an input dim ``i``, as the catalog's SQL
    ``window_dim`` computes it: a number for a number; over a symbol, the symbol itself where the window
    keeps the size (stride 1, padded by the kernel's reach), else a *derived symbol* whose code is a
    deterministic function of (symbol, pad excess, stride, ceil mode), the same in SQL (``dsym``) and
    here, so that import and rules name the same dim alike. None where no dim follows."""
    a = p0 + p1 - d * (k - 1) - 1
    if not is_sym(i):
        q = (i + a) / s
        out = (math.floor(q) if not ceil_mode else math.ceil(q)) + 1
        if ceil_mode and (out - 1) * s >= i + p0:
            out -= 1
        return out if out >= 0 else None
    if s == 1 and a == -1:
        return i
    if not (-512 <= a <= 511 and 1 <= s <= 15 and ceil_mode in (0, 1)):
        return None
    x = (((SYM_BASE - i) % (1 << 38)) * 1024 + (a + 512)) * 32 + s * 2 + ceil_mode
    return DERIVED_BASE - x % _DERIVED_MOD


def deconv_dim(i: int, k: int, s: int, p0: int, p1: int, d: int, op: int) -> int | None:
    """The output size of a transposed convolution over an input dim ``i``, as the catalog's SQL ``deconv_dim``
    computes it: ``(i - 1) s + (k - 1) d + 1 + op - p0 - p1`` for a number; over a symbol, the symbol itself
    where that is ``i`` (stride 1), the product dim ``i * s`` where it is ``i s`` (a kernel as wide as its
    stride, unpadded: the 2x upsampling of segmentation heads), else None."""
    e = (k - 1) * d + 1 + op - p0 - p1
    if not is_sym(i):
        return (i - 1) * s + e
    if s == 1:
        return i if e == 1 else None
    return product_dim(i, s) if e == s else None


PROD_BASE = -(1 << 42)  # product dims (product_dim) have codes at or below this
PROD_FACTORS = 1 << 20  # a product dim's factor is below this (else no dim follows)


def is_product(d) -> bool:
    return d is not None and int(d) <= PROD_BASE


def sym_base(d: int) -> int:
    """The symbol of a product dim (``product_dim``); any other symbol is its own."""
    return SYM_BASE - (PROD_BASE - d) // PROD_FACTORS if d <= PROD_BASE else d


def sym_factor(d: int) -> int:
    """The factor of a product dim; 1 for any other symbol."""
    return (PROD_BASE - d) % PROD_FACTORS if d <= PROD_BASE else 1


def product_dim(d: int, k: int) -> int | None:
    """``d * k`` for a dim ``d`` (a number or a symbol) and a number ``k``, as the catalog's SQL ``sym_times``
    computes it: a number for a number; the symbol itself for k = 1; 0 for k = 0; else a *product dim*, whose
    code holds the symbol (a product's symbol and factor multiplied out, so a product has one code) and the
    factor. None where no dim follows (a negative k, a factor from ``PROD_FACTORS`` on)."""
    if not is_sym(d):
        return int(d) * int(k)
    if k == 0 or k == 1:
        return 0 if k == 0 else d
    f = sym_factor(d) * k
    if k < 0 or f >= PROD_FACTORS:
        return None
    return PROD_BASE - ((SYM_BASE - sym_base(d)) * PROD_FACTORS + f)


def is_batch_like(name: str, index: int, rank: int) -> bool:
    """A dynamic dim costed as a batch: named like one, or the leading dim of a tensor of rank 2 or more."""
    return name.lower() in BATCH_NAMES or (index == 0 and rank >= 2)


@dataclass
class Symbol:
    code: int
    name: str  # the dim_param it is written with (anonymous: a made-up one, written as an unnamed dim)
    anonymous: bool = False
    batch: bool = False  # batch-like (costed at BATCH_VALUE)
    value: int | None = None  # the costed binding
    second: int | None = None  # the second verification binding


@dataclass
class Symbols:
    """The symbols of one model, by name (a dim_param names one symbol wherever it appears)."""

    by_name: dict[str, Symbol] = field(default_factory=dict)
    by_code: dict[int, Symbol] = field(default_factory=dict)

    def _add(self, s: Symbol) -> Symbol:
        self.by_name[s.name] = self.by_code[s.code] = s
        return s

    def get(self, name: str, *, anonymous: bool = False, batch: bool = False) -> int:
        s = self.by_name.get(name) or self._add(Symbol(code(len(self.by_name) + 1), name, anonymous, batch))
        s.batch = s.batch or batch
        return s.code

    def add_derived(self, c: int) -> None:
        """Register the derived symbol ``c`` (``window_dim``, ``product_dim``): written as an unnamed dim, bound
        from inference (a product dim: from its symbol's binding)."""
        self._add(Symbol(c, f"derived:{c}", anonymous=True))

    def anonymous(self, d) -> bool:
        """Whether ``d`` is a symbol for a dim nothing named (an unknown dim of shape inference)."""
        return is_sym(d) and d in self.by_code and self.by_code[d].anonymous

    @classmethod
    def from_egraph(cls, g) -> "Symbols":
        """The symbols an e-graph already holds (its ``symbols`` table)."""
        out = cls()
        for c, name, anon, batch, value, second in g.sql(
                "SELECT code, name, anonymous, batch, value, second FROM symbols ORDER BY code DESC"):
            out._add(Symbol(int(c), name, bool(anon), bool(batch), value, second))
        return out

    def store(self, g) -> None:
        """Write the symbols into the e-graph's ``symbols`` table and its ``bind`` macro."""
        g.con.execute("DELETE FROM symbols")
        if self.by_name:
            rows = list(self.by_name.values())
            g.con.register("_symbols", {
                "code": np.array([s.code for s in rows], dtype=np.int64),
                "name": np.array([s.name for s in rows], dtype=object),
                "anonymous": np.array([s.anonymous for s in rows], dtype=bool),
                "batch": np.array([s.batch for s in rows], dtype=bool),
                "value": np.array([-1 if s.value is None else s.value for s in rows], dtype=np.int64),
                "second": np.array([-1 if s.second is None else s.second for s in rows], dtype=np.int64)})
            try:
                g.con.execute("INSERT INTO symbols SELECT code, name, anonymous, batch, nullif(value, -1), "
                              "nullif(second, -1) FROM _symbols")
            finally:
                g.con.unregister("_symbols")
        g.con.execute(bind_macro(self))

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def bind(self, shape, which: str = "value"):
        """``shape`` with every symbol replaced by its binding (``which``: "value" or "second"); None stays
        None; a symbol without a binding becomes 1."""
        if shape is None:
            return None
        codes = self.by_code

        def one(d):
            if not is_sym(d):
                return int(d)
            base = sym_base(d)  # a product dim: its symbol's binding times its factor
            return sym_factor(d) * (int(getattr(codes[base], which) or 1) if base in codes else 1)

        return [one(d) for d in shape]

    def onnx_dims(self, shape):
        """``shape`` for ``helper.make_tensor_value_info``: symbols as their dim_param names, anonymous
        ones as None (an unnamed dim)."""
        if shape is None:
            return None
        codes = self.by_code
        out = []
        for d in shape:
            if is_sym(d):
                s = codes.get(d)
                out.append(None if s is None or s.anonymous else s.name)
            else:
                out.append(int(d))
        return out

def bind_macro(symbols: Symbols | None) -> str:
    """The ``bind(shape)`` macro: symbol codes replaced by the costed binding (identity without symbols; a
    symbol without a binding is 1, as in ``Symbols.bind``)."""
    if not symbols:
        return "CREATE OR REPLACE MACRO bind(l) AS l"
    bound = "MAP {" + ", ".join(f"{s.code}: {int(s.value or 1)}" for s in symbols.by_code.values()
                                if not is_product(s.code)) + "}"
    return (f"CREATE OR REPLACE MACRO bind(l) AS CASE WHEN l IS NULL THEN NULL ELSE list_transform(l, lambda d: "
            f"CASE WHEN d > {SYM_BASE} THEN d WHEN d <= {PROD_BASE} THEN sym_factor(d) * coalesce(({bound})[sym_base(d)], 1) "
            f"ELSE coalesce(({bound})[d], 1) END) END")


def spell_reshape(target, data_shape) -> tuple[list[int], bool] | None:
    """Reshape's target with symbols written as ONNX can read it: a symbol at the position where the
    data has the same symbol as 0 (copy), one other symbol as -1 (inferred). Returns (target, allowzero)
    or None when it cannot be written (two symbols to infer, or a real 0 beside a symbol)."""
    if not any(is_sym(d) for d in target):
        return list(target), 0 in target
    if 0 in target:
        return None
    data = list(data_shape or [])
    out = [0 if is_sym(d) and i < len(data) and data[i] == d else d for i, d in enumerate(target)]
    rest = [i for i, d in enumerate(out) if is_sym(d)]
    if len(rest) > 1:
        return None
    for i in rest:
        out[i] = -1
    return out, False


def infer_dim(data_shape, others) -> int | None:
    """The dim Reshape's -1 stands for: the data's element count over the other target dims', where
    symbols cancel only against equal symbols (a product dim counted as its symbol and its factor); a
    number, a symbol, or one symbol times a number (``product_dim``); None when it is none of these."""
    syms = sorted(sym_base(d) for d in data_shape if is_sym(d))
    for d in others:
        if is_sym(d):
            if sym_base(d) not in syms:
                return None
            syms.remove(sym_base(d))
    num = 1
    for d in data_shape:
        num *= sym_factor(d) if is_sym(d) else int(d)
    den = 1
    for d in others:
        den *= sym_factor(d) if is_sym(d) else int(d)
    if den == 0 or num % den:
        return None
    q = num // den
    if not syms:
        return q
    return product_dim(syms[0], q) if len(syms) == 1 else None
