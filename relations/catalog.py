"""The operator catalog: the one source of truth about every operator relsat knows.

Each entry (an ``OpDef``) gives the ONNX op_type, domain and opset range, its inputs
(e-class children, optional or variadic), its attributes with ONNX names, types and
defaults, the number of outputs of a tuple operator, the shape, dtype and
analytic-cost rules as DuckDB SQL expressions, and what rule verification needs to
draw its inputs.  The DuckDB schema, the rule checker, ONNX import (``for_node``) and
export (relations/onnx_form.py), rule verification and the analytic and measured
cost models are all derived from this table; adding an operator, of any domain, is
one entry here, plus at most an import normalisation hook or a spelling
(relations/onnx_form.py) beside it.

The entry also carries what runs it elsewhere and what tests it: ``torch``, its PyTorch
equivalent (a Python expression that extract/torch_cuda.py evaluates for a node: the
PyTorch runtime and CUDA operator timing), and ``example``, one valid instance in the
catalog's form, from which the tests that cover every operator build their cases (the shape
rule against ONNX's inference, the import/export round trip, the PyTorch mapping against
ONNX Runtime).  An operator of another domain (com.microsoft) has its outputs typed at
import from its shape and dtype rules, which ONNX's shape inference does not know.

Data inputs that ONNX passes as tensors but that are really parameters
(Reshape's shape, Slice's starts/ends, Clip's min/max, ...) are *lifted* into
attributes (``Input.lifted``): they import as attributes when constant and
export back as initializers for opsets that want an input.

SQL expressions see these names: ``s_<child>`` / ``d_<child>`` (shape as
BIGINT[], dynamic dims as symbol codes (relations/dims.py), and ONNX dtype of a child; for a variadic child ``s_<child>`` is a
list of shapes), ``s_out`` (the node's own shape, in cost rules), and the
attribute columns (quoted, e.g. ``"group"``).  A shape rule yields NULL when the
node is invalid; such nodes are never inserted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .dims import PROD_BASE, PROD_FACTORS, SYM_BASE

REQUIRED = object()  # marks an attribute without a default

SQL_TYPES = {"int": "BIGINT", "ints": "BIGINT[]", "float": "DOUBLE", "floats": "DOUBLE[]", "string": "VARCHAR"}


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str  # int | ints | float | floats | string
    default: object = REQUIRED
    dims: bool = False  # holds dims, which may be symbols (Reshape's shape): bound for costs, spelled at export

    @property
    def sql_type(self) -> str:
        return SQL_TYPES[self.kind]


@dataclass(frozen=True)
class Input:
    name: str
    optional: bool = False
    variadic: bool = False

    @property
    def column(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Lifted:
    """A tensor input of the ONNX op that relsat keeps as an attribute."""

    input_index: int  # position among the ONNX node's inputs
    attr: str  # the attribute that holds its value
    since: int  # first opset where ONNX takes it as an input (before: an attribute)
    dtype: int = 7  # ONNX dtype of the initializer written at export (7 = int64)
    host: bool = True  # a parameter runtimes read on the host (shapes, axes, bounds); False: a tensor (Gather's indices)


@dataclass(frozen=True)
class Example:
    """One valid instance of an operator in the catalog's form: the shapes of its inputs (one per
    catalog input: None for an absent optional one, a list of shapes for a variadic one) and the
    attributes that differ from their defaults (all the required ones).  The tests that cover every
    operator build their one-node models from it."""

    inputs: tuple
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpDef:
    op_type: str
    inputs: tuple[Input, ...]
    attrs: tuple[Attr, ...] = ()
    shape: str = "s_x"
    dtype: str | None = None  # default: dtype of the first input
    tuple_arity: str | None = None  # tuple ops: the list attribute whose length is the number of outputs
    tuple_shapes: str | None = None  # for tuple ops: SQL list of shapes
    tuple_dtypes: str | None = None  # for tuple ops: SQL list of dtypes
    flops: str = "prod(s_out)"
    lifted: tuple[Lifted, ...] = ()
    leaf: bool = False  # no e-class children (inputs, weights, Constant)
    canon: tuple[tuple[str, str], ...] = ()  # attribute -> SQL normalising it on insert
    domain: str = ""  # ONNX domain ("" = ai.onnx)
    since: int = 1  # opset range of ``domain`` in which relsat imports and writes the op (the default
    until: int | None = None  # domain also needs the model's opset in DEFAULT_OPSETS and ONNX's schema)
    draw: str = "elementwise"  # how rule verification draws its inputs (a planner of programs/verify.py)
    positive: tuple[int, ...] = ()  # inputs that verification feeds positive data (variances, square roots)
    nonzero: tuple[int, ...] = ()  # inputs fed data away from zero (divisors)
    indexes: tuple[int, int] | None = None  # (index input, data input): integers that index the data along
    # ``axis``, drawn within that dim (an index out of range faults a CUDA kernel and its whole process)
    # The PyTorch equivalent of an ONNX node of this op (extract/torch_cuda.py): a Python expression over
    # ``torch``, ``F`` (torch.nn.functional), ``math``, torch_cuda's helpers (``conv``, ``gemm``, ...), the
    # node's inputs by catalog column name (None when absent; a list for a variadic input), its attributes by
    # catalog name (the node's value, a lifted input's value, else the default; None for a required one the
    # node leaves out), the ``host`` inputs by name, ``attrs`` (every attribute as the node spells it),
    # ``opset`` (of the default domain) and ``outputs`` (the node's number of outputs).
    torch: str | None = None
    host: tuple[tuple[int, str], ...] = ()  # other ONNX inputs that hold parameters: (position, name), as ``torch`` reads them
    example: Example | None = field(default=None, compare=False)  # one valid instance, for the per-operator tests

    @property
    def table(self) -> str:
        return "op_" + self.op_type.lower()

    @property
    def child_columns(self) -> tuple[str, ...]:
        return tuple(i.column for i in self.inputs)

    @property
    def variadic(self) -> bool:
        return any(i.variadic for i in self.inputs)

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(f"{self.op_type} has no attribute {name!r}")

    @property
    def is_tuple(self) -> bool:
        return self.tuple_arity is not None

    def arity(self, attrs: dict) -> int:
        """The number of ONNX outputs of a node with these attributes."""
        return len(attrs[self.tuple_arity]) if self.is_tuple else 1

    @property
    def opset_range(self) -> str:
        return f"[{self.since}, {self.until if self.until is not None else ''}]"

    def in_opsets(self, version: int) -> bool:
        return self.since <= version and (self.until is None or version <= self.until)

    @property
    def host_inputs(self) -> dict[int, str]:
        """The ONNX inputs that hold parameters (shapes, sizes, axes, pads, bounds), by position: the lifted
        inputs (named by their attribute; not Gather's index tensor) and ``host``.  The PyTorch mapping reads
        them on the host."""
        return {**{lf.input_index: lf.attr for lf in self.lifted if lf.host}, **dict(self.host)}


# Product dims (relations/dims.py: product_dim, sym_base, sym_factor), from the constants defined there.
_PRODUCT_MACROS = f"""CREATE OR REPLACE MACRO sym_base(d) AS CASE WHEN d <= {PROD_BASE}
    THEN {SYM_BASE} - ({PROD_BASE} - d) // {PROD_FACTORS} ELSE d END;
CREATE OR REPLACE MACRO sym_factor(d) AS CASE WHEN d <= {PROD_BASE} THEN ({PROD_BASE} - d) % {PROD_FACTORS} ELSE 1 END;
CREATE OR REPLACE MACRO sym_times(d, k) AS CASE WHEN k = 0 THEN 0 WHEN k = 1 THEN d
    WHEN k > 0 AND sym_factor(d) * k < {PROD_FACTORS}
    THEN {PROD_BASE} - (({SYM_BASE} - sym_base(d)) * {PROD_FACTORS} + sym_factor(d) * k) END;
"""

# SQL macros used by the shape and cost rules (created with the schema). DuckDB expands a macro's parameter at
# every use and binds the expanded expression in every statement (a shape rule's cost is mostly that): a macro
# that reads a parameter many times binds it once as a lambda's argument, ``list_transform([x], lambda v: ...)[1]``
# (bcast 20 -> 4 ms a statement, 27 -> 5 ms over slices as matmul_shape passes them).
SQL_MACROS = """
CREATE OR REPLACE MACRO prod(l) AS coalesce(list_aggregate(l, 'product'), 1)::BIGINT;
CREATE OR REPLACE MACRO is_sym(d) AS d <= -1099511627776;
CREATE OR REPLACE MACRO cdim(d) AS CASE WHEN NOT is_sym(d) THEN d END;
CREATE OR REPLACE MACRO has_sym(l) AS coalesce(list_bool_or(list_transform(l, lambda d: is_sym(d))), false);
CREATE OR REPLACE MACRO cprod(l) AS CASE WHEN NOT has_sym(l) THEN prod(l) END;
""" + _PRODUCT_MACROS + """CREATE OR REPLACE MACRO dmul(a, b) AS CASE WHEN NOT is_sym(a) AND NOT is_sym(b) THEN a * b
    WHEN is_sym(a) AND NOT is_sym(b) THEN sym_times(a, b) WHEN is_sym(b) AND NOT is_sym(a) THEN sym_times(b, a) END;
CREATE OR REPLACE MACRO sym_part(l) AS list_sort(list_transform(list_filter(l, lambda d: is_sym(d)), lambda d: sym_base(d)));
CREATE OR REPLACE MACRO num_part(l) AS prod(list_transform(l, lambda d: CASE WHEN is_sym(d) THEN sym_factor(d) ELSE d END));
CREATE OR REPLACE MACRO sprod(l) AS CASE WHEN NOT has_sym(l) THEN prod(l)
    WHEN len(sym_part(l)) = 1 THEN sym_times(sym_part(l)[1], num_part(l)) END;
CREATE OR REPLACE MACRO same_numel(a, b) AS num_part(a) = num_part(b) AND sym_part(a) = sym_part(b);
CREATE OR REPLACE MACRO valid_shape(l) AS list_transform([l], lambda v: CASE WHEN v IS NOT NULL AND list_count(v) = len(v)
    AND list_bool_and(list_transform(v, lambda d: d >= 0 OR is_sym(d))) IS NOT false THEN v END)[1];
CREATE OR REPLACE MACRO sym_add(d, a) AS CASE WHEN NOT is_sym(d) THEN d + a WHEN a = 0 THEN d END;
CREATE OR REPLACE MACRO reshape_ok(t, x) AS len(list_filter(list_transform(t, lambda d, i: is_sym(d)
    AND NOT (i <= len(x) AND x[i] = d)), lambda f: f)) <= 1 AND NOT (list_contains(t, 0) AND has_sym(t));
CREATE OR REPLACE MACRO bcast(a, b) AS CASE WHEN a = b THEN a ELSE list_transform([[a, b]], lambda ab: CASE WHEN ab[1] = ab[2] THEN ab[1]
    WHEN ab[1] IS NOT NULL OR ab[2] IS NOT NULL THEN valid_shape(list_transform(list_zip(
        list_resize([]::BIGINT[], greatest(len(ab[1]), len(ab[2])) - len(coalesce(ab[1], [])), 1) || coalesce(ab[1], []),
        list_resize([]::BIGINT[], greatest(len(ab[1]), len(ab[2])) - len(coalesce(ab[2], [])), 1) || coalesce(ab[2], [])),
        lambda p: CASE WHEN p[1] = p[2] OR p[2] = 1 THEN p[1] WHEN p[1] = 1 THEN p[2] END)) END)[1] END;
CREATE OR REPLACE MACRO matmul_shape(a, b) AS list_transform([[a, b]], lambda mm: CASE
    WHEN len(mm[1]) = 0 OR len(mm[2]) = 0 THEN NULL
    WHEN len(mm[1]) = 1 AND len(mm[2]) = 1 THEN CASE WHEN mm[1][1] = mm[2][1] THEN []::BIGINT[] END
    WHEN len(mm[1]) = 1 THEN CASE WHEN mm[1][1] = mm[2][-2] THEN mm[2][1:len(mm[2]) - 2] || [mm[2][-1]] END
    WHEN len(mm[2]) = 1 THEN CASE WHEN mm[1][-1] = mm[2][1] THEN mm[1][1:len(mm[1]) - 1] END
    WHEN mm[1][-1] = mm[2][-2] THEN bcast(mm[1][1:len(mm[1]) - 2], mm[2][1:len(mm[2]) - 2]) || [mm[1][-2], mm[2][-1]] END)[1];
CREATE OR REPLACE MACRO dsym(i, a, s, c) AS -1099511627776 - 1073741824
    - ((((-1099511627776 - i) % 274877906944) * 1024 + (a + 512)) * 32 + s * 2 + c) % 274877906879;
CREATE OR REPLACE MACRO window_dim(i, k, s, p0, p1, d, ceil_mode) AS CASE WHEN is_sym(i) THEN CASE
    WHEN s = 1 AND p0 + p1 = d * (k - 1) THEN i
    WHEN p0 + p1 - d * (k - 1) - 1 BETWEEN -512 AND 511 AND s BETWEEN 1 AND 15 AND ceil_mode IN (0, 1)
    THEN dsym(i, p0 + p1 - d * (k - 1) - 1, s, ceil_mode) END WHEN ceil_mode = 0
    THEN floor((i + p0 + p1 - d * (k - 1) - 1) / s)::BIGINT + 1
    ELSE ceil((i + p0 + p1 - d * (k - 1) - 1) / s)::BIGINT + 1
         - CASE WHEN ceil((i + p0 + p1 - d * (k - 1) - 1) / s)::BIGINT * s >= i + p0 THEN 1 ELSE 0 END END;
CREATE OR REPLACE MACRO window_shape(x, channels, k, s, p, d, ceil_mode) AS valid_shape(
    [x[1], channels] || list_transform(range(len(k)), lambda i:
        window_dim(x[i + 3], k[i + 1], s[i + 1], p[i + 1], p[i + 1 + len(k)], d[i + 1], ceil_mode)));
CREATE OR REPLACE MACRO deconv_dim(i, k, s, p0, p1, d, op) AS CASE WHEN NOT is_sym(i)
    THEN (i - 1) * s + (k - 1) * d + 1 + op - p0 - p1 WHEN s = 1 THEN sym_add(i, (k - 1) * d + op - p0 - p1)
    WHEN (k - 1) * d + 1 + op - p0 - p1 = s THEN sym_times(i, s) END;
CREATE OR REPLACE MACRO deconv_shape(x, channels, k, s, p, d, op) AS valid_shape(
    [x[1], channels] || list_transform(range(len(k)), lambda i:
        deconv_dim(x[i + 3], k[i + 1], s[i + 1], p[i + 1], p[i + 1 + len(k)], d[i + 1], op[i + 1])));
CREATE OR REPLACE MACRO norm_axis(axis, rank) AS CASE WHEN axis < 0 THEN axis + rank ELSE axis END;
CREATE OR REPLACE MACRO concat_shape(shapes, axis) AS CASE
    WHEN list_bool_and(list_transform(shapes, lambda s: len(s) = len(shapes[1])
        AND list_bool_and(list_transform(range(len(s)), lambda j: j = axis OR s[j + 1] = shapes[1][j + 1])) IS NOT false))
     AND axis >= 0 AND axis < len(shapes[1])
    THEN list_transform(range(len(shapes[1])), lambda i:
        CASE WHEN i <> axis THEN shapes[1][i + 1] WHEN NOT has_sym(list_transform(shapes, lambda s: s[axis + 1]))
             THEN list_sum(list_transform(shapes, lambda s: s[axis + 1])) END) END;
CREATE OR REPLACE MACRO slice_dim(d, st, en, sp) AS CASE WHEN NOT is_sym(d)
    THEN greatest(0, ceil((least(greatest(en, -1), d) - least(st, d)) / sp))::BIGINT
    WHEN st = 0 AND sp = 1 AND en = 9223372036854775807 THEN d END;
"""

_X = (Input("X"),)
_AB = (Input("A"), Input("B"))
_WINDOW = (
    Attr("kernel_shape", "ints"),
    Attr("strides", "ints"),
    Attr("pads", "ints"),
    Attr("dilations", "ints"),
    Attr("ceil_mode", "int", 0),
)


def _unary(op: str, attrs: tuple[Attr, ...] = (), flops: str = "prod(s_out)", **kw) -> OpDef:
    kw.setdefault("example", Example(([2, 3, 4],)))
    return OpDef(op, _X, attrs, shape="s_x", flops=flops, **kw)


def _binary(op: str, **kw) -> OpDef:
    """An element-wise op of two inputs of one type (ONNX's T): operands of two known, different types make no
    node, whatever rule asks for it (a float 0 minus an int64 constant once reached Faster R-CNN's exports)."""
    kw.setdefault("example", Example(([2, 3, 4], [4])))
    return OpDef(op, _AB, shape="CASE WHEN d_a IS NULL OR d_b IS NULL OR d_a = d_b THEN bcast(s_a, s_b) END", **kw)


def _reduce(op: str, kind: str, flops: str = "prod(s_data)", **kw) -> OpDef:
    """A reduction over ``axes`` (sorted, distinct, in 0..rank-1: the import hook resolves ONNX's negative
    axes and "all axes" when none are given), keeping them as 1s with ``keepdims`` or dropping them; the axes
    are an input from opset 18 (lifted). ``kind``: what torch_opaque's ``reduce`` computes."""
    kw.setdefault("example", Example(([2, 3, 4, 5],), {"axes": [1, 3], "keepdims": 1}))
    return OpDef(
        op,
        (Input("data"),),
        (Attr("axes", "ints"), Attr("keepdims", "int", 1)),
        shape="CASE WHEN len(axes) >= 1 AND keepdims IN (0, 1) AND len(list_distinct(axes)) = len(axes) "
        "AND list_bool_and(list_transform(axes, lambda a: a >= 0 AND a < len(s_data))) "
        "THEN CASE WHEN keepdims = 1 THEN list_transform(s_data, lambda d, i: CASE WHEN list_contains(axes, i - 1) "
        "THEN 1 ELSE d END) ELSE list_filter(s_data, lambda d, i: NOT list_contains(axes, i - 1)) END END",
        canon=(("axes", "list_sort(list_transform(axes, lambda a: norm_axis(a, len(s_data))))"),),
        lifted=(Lifted(1, "axes", 18),),
        flops=flops,
        draw="reduce",
        torch=f"reduce({kind!r}, data, axes, keepdims, attrs.get('noop_with_empty_axes', 0))",
        **kw,
    )


OPS: tuple[OpDef, ...] = (
    # leaves: the tensor data stays outside the op tables
    OpDef("Input", (), (Attr("name", "string"),), shape="NULL", dtype="NULL", flops="0", leaf=True),
    OpDef("Weight", (), (Attr("ref", "int"),), shape="NULL", dtype="NULL", flops="0", leaf=True),
    OpDef("Constant", (), (Attr("value_float", "float"),), shape="[]::BIGINT[]", dtype="1", flops="0", leaf=True),
    OpDef(
        "Conv",
        (Input("X"), Input("W"), Input("B", optional=True)),
        (Attr("group", "int", 1),) + _WINDOW[:4],
        shape="CASE WHEN s_x[2] = s_w[2] * \"group\" AND s_w[1] % \"group\" = 0 AND (b = -1 OR s_b = [s_w[1]]) "
        "THEN window_shape(s_x, s_w[1], kernel_shape, strides, pads, dilations, 0) END",
        flops="2 * prod(s_out) * prod(s_w[2:])",
        draw="conv",
        torch="conv(x, w, b, attrs)",
        example=Example(([1, 4, 8, 8], [6, 2, 3, 3], [6]), {"group": 2, "kernel_shape": [3, 3], "strides": [2, 2],
                                                          "pads": [1, 0, 1, 1], "dilations": [1, 1]}),
    ),
    # W is [C_in, C_out / group, k...]; output_shape and auto_pad are resolved by the import hook or the node is opaque
    OpDef(
        "ConvTranspose",
        (Input("X"), Input("W"), Input("B", optional=True)),
        (Attr("group", "int", 1),) + _WINDOW[:4] + (Attr("output_padding", "ints"),),
        shape="CASE WHEN s_x[2] = s_w[1] AND s_w[1] % \"group\" = 0 AND (b = -1 OR s_b = [s_w[2] * \"group\"]) "
        "AND len(output_padding) = len(kernel_shape) "
        "THEN deconv_shape(s_x, s_w[2] * \"group\", kernel_shape, strides, pads, dilations, output_padding) END",
        flops="2 * prod(s_x) * prod(s_w[2:])",
        draw="deconv",
        torch="conv_transpose(x, w, b, attrs)",
        example=Example(([1, 4, 5, 5], [4, 3, 3, 3], [6]), {"group": 2, "kernel_shape": [3, 3], "strides": [2, 2],
                                                          "pads": [1, 0, 0, 1], "dilations": [1, 1],
                                                          "output_padding": [1, 0]}),
    ),
    OpDef("MatMul", _AB, shape="matmul_shape(s_a, s_b)", flops="2 * prod(s_out) * s_a[-1]", draw="matmul",
          torch="torch.matmul(a, b)", example=Example(([2, 3, 4], [4, 5]))),
    OpDef(
        "Gemm",
        (Input("A"), Input("B"), Input("C", optional=True)),
        (Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)),
        # C broadcasts to the output [M, N] one way (ONNX: unidirectional): absent, a scalar, [N] or [1], [M or 1, N or 1]
        shape="CASE WHEN len(s_a) = 2 AND len(s_b) = 2 AND s_a[2 - \"transA\"] = s_b[1 + \"transB\"] AND (c = -1 "
        "OR len(s_c) = 0 OR len(s_c) = 1 AND s_c[1] IN (1, s_b[2 - \"transB\"]) OR len(s_c) = 2 AND s_c[1] IN (1, "
        "s_a[1 + \"transA\"]) AND s_c[2] IN (1, s_b[2 - \"transB\"])) THEN [s_a[1 + \"transA\"], s_b[2 - \"transB\"]] END",
        flops="2 * prod(s_out) * s_a[2 - \"transA\"]",
        draw="gemm",
        torch="gemm(a, b, c, alpha, beta, transA, transB)",
        example=Example(([3, 4], [5, 4], [5]), {"alpha": 0.5, "beta": 2.0, "transB": 1}),
    ),
    # com.microsoft (ONNX Runtime's contrib ops): alpha * op(A) @ op(B), op = transpose of the last two dims
    OpDef(
        "FusedMatMul",
        _AB,
        (Attr("alpha", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)),
        shape="CASE WHEN \"transA\" + \"transB\" = 0 THEN matmul_shape(s_a, s_b) "
        "WHEN \"transA\" IN (0, 1) AND \"transB\" IN (0, 1) AND len(s_a) >= 2 AND len(s_b) >= 2 THEN matmul_shape("
        "CASE WHEN \"transA\" = 1 THEN s_a[1:len(s_a) - 2] || [s_a[-1], s_a[-2]] ELSE s_a END, "
        "CASE WHEN \"transB\" = 1 THEN s_b[1:len(s_b) - 2] || [s_b[-1], s_b[-2]] ELSE s_b END) END",
        flops="2 * prod(s_out) * CASE WHEN \"transA\" = 1 THEN s_a[-2] ELSE s_a[-1] END",
        domain="com.microsoft",
        draw="matmul",
        torch="matmul_t(a, b, alpha, transA, transB)",
        example=Example(([2, 4, 3], [4, 5]), {"alpha": 0.5, "transA": 1}),
    ),
    _binary("Add", torch="torch.add(a, b)"),
    _binary("Sub", torch="torch.sub(a, b)", example=Example(([2, 1, 4], [3, 1]))),
    _binary("Mul", torch="torch.mul(a, b)", example=Example(([2, 3], [3]))),
    _binary("Div", nonzero=(1,), torch="div(a, b)", example=Example(([2, 3], [2, 3]))),
    # a ** b (the square of RMS and decomposed layer norms); the base drawn positive for verification (a fractional
    # power of a negative number is NaN)
    _binary("Pow", positive=(0,), flops="4 * prod(s_out)", torch="torch.pow(a, b).to(a.dtype)"),  # the base's dtype
    # ONNX's Sum of two inputs (broadcasting from opset 8; one or three and more inputs stay opaque): the sum Add
    # computes, in a node ONNX Runtime's Add fusions do not match (runtime.rules: layernorm-add-as-sum)
    _binary("Sum", since=8, torch="torch.add(a, b)", example=Example(([2, 1, 4], [3, 1]))),
    _unary("Relu", torch="torch.relu(x)"),
    OpDef("PRelu", (Input("X"), Input("slope")), shape="CASE WHEN bcast(s_x, s_slope) = s_x THEN s_x END",
          flops="2 * prod(s_out)", torch="torch.where(x < 0, x * slope, x)", example=Example(([1, 3, 4, 4], [3, 1, 1]))),
    _unary("Sigmoid", flops="4 * prod(s_out)", torch="torch.sigmoid(x)"),
    _unary("Tanh", flops="4 * prod(s_out)", torch="torch.tanh(x)"),
    _unary("Erf", flops="4 * prod(s_out)", torch="torch.erf(x)"),
    _unary("Sqrt", flops="2 * prod(s_out)", positive=(0,), torch="torch.sqrt(x)"),
    _unary("LeakyRelu", (Attr("alpha", "float", 0.01),), torch="F.leaky_relu(x, alpha)",
           example=Example(([2, 3],), {"alpha": 0.2})),
    _unary("Gelu", (Attr("approximate", "string", "none"),), flops="8 * prod(s_out)",
           torch="F.gelu(x, approximate=approximate)", example=Example(([2, 3],), {"approximate": "tanh"})),
    _unary("HardSigmoid", (Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)), flops="2 * prod(s_out)",
           torch="torch.clamp(x * alpha + beta, 0.0, 1.0)", example=Example(([2, 3],), {"alpha": 0.25, "beta": 0.4})),
    # below opset 14 written as x * HardSigmoid(x, 1/6, 1/2)
    _unary("HardSwish", flops="3 * prod(s_out)", torch="F.hardswish(x)"),
    _unary("Softplus", flops="4 * prod(s_out)", torch="F.softplus(x)"),  # log(exp(x) + 1)
    # com.microsoft: gelu(A + B) in its erf form, B a bias over A's last axis
    OpDef("BiasGelu", _AB, shape="CASE WHEN len(s_b) = 1 AND len(s_a) >= 1 AND s_b[1] = s_a[-1] THEN s_a END",
          flops="9 * prod(s_out)", domain="com.microsoft", torch="F.gelu(a + b)", example=Example(([2, 3, 4], [4]))),
    OpDef(
        "Clip",
        _X,
        (Attr("min", "float", float("-inf")), Attr("max", "float", float("inf"))),
        lifted=(Lifted(1, "min", 11, 1), Lifted(2, "max", 11, 1)),
        torch="clip(x, min, max)",
        example=Example(([2, 5],), {"min": -0.5, "max": 0.5}),
    ),
    OpDef("Identity", _X, flops="0", torch="x", example=Example(([6],))),
    OpDef(
        "Softmax",
        _X,
        (Attr("axis", "int", -1),),
        canon=(("axis", "norm_axis(axis, len(s_x))"),),
        flops="5 * prod(s_out)",
        torch="softmax(x, attrs, opset)",
        example=Example(([2, 3, 4],), {"axis": 1}),
    ),
    OpDef(
        "LayerNormalization",
        (Input("X"), Input("Scale"), Input("B", optional=True)),
        (Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)),
        canon=(("axis", "norm_axis(axis, len(s_x))"),),
        flops="8 * prod(s_out)",
        draw="layernorm",
        torch="F.layer_norm(x, x.shape[axis % x.dim():], scale, b, epsilon)",
        example=Example(([2, 5, 8], [8], [8]), {"axis": 2, "epsilon": 1e-3}),
    ),
    # x / sqrt(mean(x^2 over axes axis..) + epsilon) * scale (ONNX 23; below it written as its definition, the
    # decomposition T5 and LLaMA export, which ONNX Runtime fuses into its SimplifiedLayerNormalization kernel)
    OpDef(
        "RMSNormalization",
        (Input("X"), Input("scale")),
        (Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)),
        flops="6 * prod(s_out)",  # (``axis`` kept as written: from the end, the definition needs no rank)
        draw="layernorm",
        torch="F.rms_norm(x, x.shape[axis % x.dim():], scale, epsilon)",
        example=Example(([2, 5, 8], [8]), {"axis": 2, "epsilon": 1e-3}),
    ),
    _reduce("ReduceMean", "mean"),
    _reduce("ReduceL2", "l2", flops="2 * prod(s_data)"),  # sqrt(sum(x^2)) (ConvNeXt V2's global response norm)
    OpDef(
        "BatchNormalization",
        (Input("X"), Input("scale"), Input("B"), Input("input_mean"), Input("input_var")),
        (Attr("epsilon", "float", 1e-5), Attr("momentum", "float", 0.9)),
        shape="CASE WHEN len(s_x) >= 2 AND s_scale = [s_x[2]] AND s_b = [s_x[2]] THEN s_x END",
        flops="2 * prod(s_out)",
        draw="batchnorm",
        positive=(4,),
        torch="F.batch_norm(x, input_mean, input_var, scale, b, False, 0.0, epsilon)",
        example=Example(([1, 3, 4, 4], [3], [3], [3], [3]), {"epsilon": 1e-3}),
    ),
    OpDef(
        "MaxPool",
        _X,
        _WINDOW,
        shape="window_shape(s_x, s_x[2], kernel_shape, strides, pads, dilations, ceil_mode)",
        flops="prod(s_out) * prod(kernel_shape)",
        draw="window",
        torch="max_pool(x, attrs)",
        example=Example(([1, 2, 9, 9],), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                          "dilations": [1, 2], "ceil_mode": 1}),
    ),
    OpDef(
        "AveragePool",
        _X,
        _WINDOW + (Attr("count_include_pad", "int", 0),),
        shape="window_shape(s_x, s_x[2], kernel_shape, strides, pads, dilations, ceil_mode)",
        flops="prod(s_out) * prod(kernel_shape)",
        draw="window",
        torch="avg_pool(x, attrs)",
        example=Example(([1, 2, 9, 9],), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1],
                                          "dilations": [1, 1], "count_include_pad": 1}),
    ),
    OpDef(
        "GlobalAveragePool",
        _X,
        shape="CASE WHEN len(s_x) >= 3 THEN s_x[1:2] || list_transform(s_x[3:], lambda d: 1::BIGINT) END",
        flops="prod(s_x)",
        draw="window",
        torch="x.mean(tuple(range(2, x.dim())), True)",
        example=Example(([1, 5, 7, 7],)),
    ),
    OpDef(
        "Concat",
        (Input("inputs", variadic=True),),
        (Attr("axis", "int"),),
        shape="concat_shape(s_inputs, axis)",
        dtype="CASE WHEN len(list_distinct(d_inputs)) = 1 THEN d_inputs[1] END",
        canon=(("axis", "norm_axis(axis, len(s_inputs[1]))"),),
        flops="0",
        draw="concat",
        torch="torch.cat(inputs, axis)",
        example=Example(([[2, 3], [2, 5], [2, 1]],), {"axis": 1}),
    ),
    OpDef(
        "Split",
        (Input("input"),),
        (Attr("axis", "int", 0), Attr("split", "ints")),
        tuple_arity="split",
        shape="NULL",
        tuple_shapes="CASE WHEN axis >= 0 AND axis < len(s_input) AND list_sum(split) = s_input[axis + 1] "
        "THEN list_transform(split, lambda p: list_transform(range(len(s_input)), lambda i: "
        "CASE WHEN i = axis THEN p ELSE s_input[i + 1] END)) END",
        tuple_dtypes="list_transform(split, lambda p: d_input)",
        lifted=(Lifted(1, "split", 13),),
        canon=(("axis", "norm_axis(axis, len(s_input))"),),
        flops="0",
        draw="split",
        torch="chunks(input, split, axis, attrs, outputs)",
        example=Example(([2, 6],), {"axis": 1, "split": [1, 2, 3]}),
    ),
    OpDef(
        "Slice",
        (Input("data"),),
        (Attr("starts", "ints"), Attr("ends", "ints"), Attr("axes", "ints"), Attr("steps", "ints")),
        shape="valid_shape(list_transform(range(len(s_data)), lambda i: CASE WHEN list_contains(axes, i) "
        "THEN slice_dim(s_data[i + 1], starts[list_position(axes, i)], ends[list_position(axes, i)], "
        "steps[list_position(axes, i)]) ELSE s_data[i + 1] END))",
        lifted=(Lifted(1, "starts", 10), Lifted(2, "ends", 10), Lifted(3, "axes", 10), Lifted(4, "steps", 10)),
        flops="prod(s_out)",
        draw="reshaping",
        torch="sliced(data, starts, ends, axes, steps)",
        example=Example(([10, 8, 6],), {"starts": [1, 0], "ends": [7, 8], "axes": [0, 2], "steps": [2, 1]}),
    ),
    OpDef(
        "Transpose",
        (Input("data"),),
        (Attr("perm", "ints"),),
        shape="CASE WHEN len(perm) = len(s_data) AND list_sort(perm) = range(len(s_data)) "
        "THEN list_transform(perm, lambda p: s_data[p + 1]) END",
        flops="prod(s_out)",
        draw="transpose",
        torch="data.permute(perm if perm is not None else list(range(data.dim()))[::-1]).contiguous()",
        example=Example(([2, 3, 4],), {"perm": [2, 0, 1]}),
    ),
    OpDef(
        "Reshape",
        (Input("data"),),
        (Attr("shape", "ints", dims=True),),
        shape="CASE WHEN same_numel(shape, s_data) AND reshape_ok(shape, s_data) "
        "AND list_bool_and(list_transform(shape, lambda d: d >= 0 OR is_sym(d))) IS NOT false THEN shape END",
        lifted=(Lifted(1, "shape", 5),),
        flops="0",
        draw="reshaping",
        torch="reshape(data, shape, attrs)",
        example=Example(([2, 3, 4],), {"shape": [6, 4]}),
    ),
    OpDef(
        "Flatten",
        (Input("input"),),
        (Attr("axis", "int", 1),),
        shape="CASE WHEN axis >= 0 AND axis <= len(s_input) THEN valid_shape([sprod(s_input[1:axis]), sprod(s_input[axis + 1:])]) END",
        canon=(("axis", "norm_axis(axis, len(s_input))"),),
        flops="0",
        draw="reshaping",
        torch="input.reshape(math.prod(input.shape[:axis % (input.dim() + 1)]), -1)",
        example=Example(([2, 3, 4, 5],), {"axis": 2}),
    ),
    OpDef(
        "Squeeze",
        (Input("data"),),
        (Attr("axes", "ints"),),
        shape="CASE WHEN list_bool_and(list_transform(axes, lambda a: s_data[a + 1] = 1)) IS NOT false "
        "THEN list_filter(s_data, lambda d, i: NOT list_contains(axes, i - 1)) END",
        lifted=(Lifted(1, "axes", 13),),
        flops="0",
        draw="reshaping",
        torch="squeeze(data, axes)",
        example=Example(([1, 3, 1, 4],), {"axes": [0, 2]}),
    ),
    OpDef(
        "Unsqueeze",
        (Input("data"),),
        (Attr("axes", "ints"),),
        shape="list_transform(range(len(s_data) + len(axes)), lambda i: CASE WHEN list_contains(axes, i) THEN 1 "
        "ELSE s_data[i + 1 - len(list_filter(axes, lambda a: a < i))] END)",
        lifted=(Lifted(1, "axes", 13),),
        flops="0",
        draw="reshaping",
        torch="unsqueeze(data, axes)",
        example=Example(([3, 4],), {"axes": [0, 3]}),
    ),
    # one constant index (a scalar, the axis removed); the index normalised to 0..dim-1 at import
    OpDef(
        "Gather",
        (Input("data"),),
        (Attr("axis", "int", 0), Attr("indices", "int")),
        shape="CASE WHEN axis >= 0 AND axis < len(s_data) AND NOT is_sym(s_data[axis + 1]) AND indices >= 0 "
        "AND indices < s_data[axis + 1] THEN list_filter(s_data, lambda d, i: i - 1 <> axis) END",
        lifted=(Lifted(1, "indices", 1, host=False),),
        flops="prod(s_out)",
        draw="reshaping",
        indexes=(1, 0),
        torch="gather(data, indices, axis)",
        example=Example(([2, 5, 3],), {"axis": 1, "indices": 4}),
    ),
    OpDef(
        "Pad",
        (Input("data"),),
        (Attr("mode", "string", "constant"), Attr("pads", "ints"), Attr("value", "float", 0.0)),
        shape="CASE WHEN len(pads) = 2 * len(s_data) THEN valid_shape(list_transform(range(len(s_data)), "
        "lambda i: sym_add(s_data[i + 1], pads[i + 1] + pads[i + 1 + len(s_data)]))) END",
        lifted=(Lifted(1, "pads", 11), Lifted(2, "value", 11, 1)),
        flops="prod(s_out)",
        draw="reshaping",
        host=((3, "axes"),),  # opset 18: the axes that pads refer to (import folds them into pads)
        torch="pad(data, pads, value, mode, axes)",
        example=Example(([2, 3],), {"pads": [1, 0, 2, 3], "value": 1.5}),
    ),
    # projection of one output of a tuple e-class (Split, multi-output opaque nodes)
    OpDef("getitem", (Input("t"),), (Attr("index", "int"),), shape="ts_t[index + 1]", dtype="td_t[index + 1]", flops="0",
          draw="getitem"),
)

BY_TYPE: dict[str, OpDef] = {op.op_type: op for op in OPS}
BY_TABLE: dict[str, OpDef] = {op.table: op for op in OPS}
BY_ONNX: dict[tuple[str, str], OpDef] = {(op.domain, op.op_type): op for op in OPS if not op.leaf and op.op_type != "getitem"}
DEFAULT_OPSETS = (7, 26)  # the default-domain opsets relsat reads and writes


def for_node(domain: str, op_type: str) -> OpDef | None:
    """The catalog entry an ONNX node of this domain and op_type imports as (None: opaque)."""
    return BY_ONNX.get(("" if domain == "ai.onnx" else domain, op_type))


def lookup(op_type: str) -> OpDef:
    """The catalog entry for an op_type (ONNX spelling), or KeyError listing close names."""
    try:
        return BY_TYPE[op_type]
    except KeyError:
        raise KeyError(f"unknown operator {op_type!r}; known: {', '.join(sorted(BY_TYPE))}") from None
