"""The concrete sizes a model with dynamic dims is costed, timed and verified at.

relsat keeps a model's dynamic dims as symbols (``relations/dims.py``) from import to the written
model, but ONNX Runtime runs tensors: costs, timings and verification need sizes.  ``choose``
binds every symbol twice:

- the **costed** binding: the user's ``--input-shape`` where given; otherwise a batch-like dim
  (named like a batch, or the leading dim of a tensor of rank 2 or more) is 1 and every other
  dynamic dim the first of ``dims.OTHER_VALUES`` (128, 64, 256, 512, 32, 224) at which the original
  model runs (all of them the same size, so that dims that must agree do);
- the **second** binding, for verification only: batch-like dims 3, the others the next of those
  sizes at which the original runs (the costed size again when no other runs), so that a written
  model that only works at one shape is not written. When the original itself does not run there,
  batch 2; when not there either, there is no second binding (the report's ``second`` is null).

Dims that inference derives inside the graph (an unnamed dim of a Reshape's output, ...) are bound
from ONNX shape inference run at each binding.  The symbols and their bindings are stored in the
e-graph (``symbols`` table, ``bind`` macro) for the costs to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from relsat.relations import runtime
from relsat.relations.dims import BATCH_SECOND, BATCH_VALUE, OTHER_VALUES, Symbols, is_sym

from relsat.driver.boundary import feeds
from relsat.driver.errors import RelsatError, error_line
from relsat.driver.boundary.onnx_import import infer_concrete


@dataclass
class Binding:
    costed: dict[str, list[int]]  # graph input -> its dims at the costed binding
    second: dict[str, list[int]] | None  # ... at the second verification binding (None: no dynamic dims, or
    # the original runs at no second size)
    symbols: dict = field(default_factory=dict)  # symbol name -> [costed, second], for the report

    @property
    def all(self) -> list[dict[str, list[int]]]:
        """The bindings verification runs at (one when the model has no dynamic dims)."""
        return [self.costed] + ([self.second] if self.second else [])


def _shapes(imported, symbols: Symbols, which: str) -> dict[str, list[int]]:
    return {name: symbols.bind(shape, which) for name, _, shape in imported.inputs}


def _runs(sess, model, shapes) -> str | None:
    """None when the original runs at these input shapes, else ONNX Runtime's one-line error."""
    specs = [(i.name, shapes[i.name], runtime.np_dtype(i.type)) for i in sess.get_inputs() if i.name in shapes]
    try:
        sess.run(None, feeds.draw(specs, feeds.input_roles(model, shapes), 0))
        return None
    except Exception as e:
        return error_line(e)


def choose(model: onnx.ModelProto, imported) -> Binding:
    """Bind the imported model's symbols (module docstring) and store them in its e-graph. RelsatError
    when the original runs at none of the default sizes (name them with --input-shape)."""
    symbols: Symbols = imported.symbols
    in_codes = {d for _, _, shape in imported.inputs for d in shape if is_sym(d)}
    if not in_codes:
        symbols.store(imported.egraph)
        costed = {name: [int(d) for d in shape] for name, _, shape in imported.inputs}
        return Binding(costed, None)
    by_code = symbols.by_code
    inputs = [by_code[c] for c in sorted(in_codes, reverse=True)]
    for s in inputs:
        if s.batch and s.value is None:
            s.value = BATCH_VALUE
        if s.batch:
            s.second = BATCH_SECOND if s.value != BATCH_SECOND else BATCH_VALUE
    others = [s for s in inputs if not s.batch]
    try:
        sess = runtime.session(model, optimize=False)
    except Exception as e:
        raise RelsatError(f"{model.graph.name or 'model'}: ONNX Runtime cannot load the model: "
                          f"{error_line(e)}") from None
    free = [s for s in others if s.value is None]
    if free and (last := _bind_free(sess, model, imported, symbols, free)) is not None:
        # an unnamed dim may be a batch met again (a state's [2, batch, 128]): each in turn as a batch dim
        for s in [s for s in free if s.anonymous]:
            s.batch, s.value, s.second = True, BATCH_VALUE, BATCH_SECOND
            rest = [x for x in free if not x.batch]
            last = _bind_free(sess, model, imported, symbols, rest) if rest else _runs(
                sess, model, _shapes(imported, symbols, "value"))
            if last is None:
                break
            s.batch, s.value, s.second = False, None, None
        others = [s for s in others if not s.batch]
        if last is not None:
            names = ", ".join(s.name for s in inputs if s.value is None or not s.batch)
            raise RelsatError(f"{model.graph.name or 'model'}: the model runs at none of the sizes tried for its "
                              f"dynamic dims {names} ({', '.join(map(str, OTHER_VALUES))}): {last}; set them "
                              f"with --input-shape")
    second_runs = False  # the original is known to run at the second binding
    if others:
        costed_sizes = {s.value for s in others}
        for s in others:
            s.second = s.value
        for v in OTHER_VALUES:
            if v in costed_sizes:
                continue
            for s in others:
                s.second = v
            if _runs(sess, model, _shapes(imported, symbols, "second")) is None:
                second_runs = True  # (not run again below: GPT-2's trial run takes about a second)
                break
        else:
            for s in others:
                s.second = s.value
    if not second_runs and _runs(sess, model, _shapes(imported, symbols, "second")) is not None:
        # a model whose batch is not free after all: batch 2, else no second binding
        batches = [s for s in inputs if s.batch and s.value != 2]
        for s in batches:
            s.second = 2
        if not batches or _runs(sess, model, _shapes(imported, symbols, "second")) is not None:
            for s in inputs:
                s.second = s.value
    _bind_derived(model, imported, symbols, in_codes)
    symbols.store(imported.egraph)
    costed, second = _shapes(imported, symbols, "value"), _shapes(imported, symbols, "second")
    return Binding(costed, second if second != costed else None, {s.name: [s.value, s.second] for s in inputs})


def _bind_free(sess, model, imported, symbols: Symbols, free) -> str | None:
    """Bind the ``free`` symbols to the first of OTHER_VALUES at which the original runs: None, else the
    last error."""
    last = ""
    for v in OTHER_VALUES:
        for s in free:
            s.value = v
        last = _runs(sess, model, _shapes(imported, symbols, "value"))
        if last is None:
            return None
    return last


def _bind_derived(model, imported, symbols: Symbols, in_codes: set[int]) -> None:
    """Bind the symbols that are not input dims from ONNX shape inference at each binding."""
    want = {s.code: s for s in symbols.by_code.values() if s.code not in in_codes and s.value is None}
    if not want:
        return
    for which in ("value", "second"):
        types = infer_concrete(model, _shapes(imported, symbols, which))
        for name, (_, shape) in imported.types.items():
            if not shape or not any(d in want for d in shape):
                continue
            got = (types.get(name) or (None, None))[1]
            if got is None or len(got) != len(shape):
                continue
            for d, v in zip(shape, got):
                if d in want and getattr(want[d], which) is None and not is_sym(v):
                    setattr(want[d], which, int(v))
    for s in want.values():  # never seen at a concrete size: costed as 1
        s.value = s.value if s.value is not None else 1
        s.second = s.second if s.second is not None else s.value
