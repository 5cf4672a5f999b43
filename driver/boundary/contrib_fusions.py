"""Fused contrib nodes read at import as the standard ops they stand for.

com.microsoft ``SkipLayerNormalization`` is what ONNX Runtime's transformer optimizer writes for a residual Add +
LayerNormalization: ``layernorm(input + skip (+ bias))`` over the last axis, with a fourth output,
``input_skip_bias_sum``, the sum it normalises, which pre-norm transformers (ViT, GPT-2, Whisper) read as the next
block's residual.  Kept as it is, such a node was opaque (the catalog holds one output per op, and its input and skip
often have two unknown batch dims of shape inference's own, which only a broadcasting ONNX op unifies), and with it
every value after it (ViT-B/16 through ONNX Runtime's optimizer: 24 SkipLayerNormalization, 57 MatMul and 33 Add
opaque).  ``split_fusions`` writes each as ``Add`` (``input + skip``, then ``+ bias``) and ``LayerNormalization``:
the same values in the catalog's ops, the sum output the Add's.  On the CPU its kernel ran 8.7x slower than the two
it stands for, and ``runtime.rules``' ``layernorm-add-as-sum`` keeps ONNX Runtime from fusing them again; where the
fused kernel pays (a provider whose fusion is fast), ONNX Runtime makes it again from Add + LayerNormalization over
static shapes, and the measured choice keeps the input model where the written one is not faster.  A node whose mean
or inv_std_var output is read is left as it is, and so is every one below opset 17 (which has no
LayerNormalization).  The written model is verified against the input model as every
model is.
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper

_MS = "com.microsoft"


def _read(graph: onnx.GraphProto) -> Counter:
    """How many times each value is read (graph outputs count)."""
    return Counter([i for n in graph.node for i in n.input if i] + [o.name for o in graph.output])


def _standard(node: onnx.NodeProto, k: int) -> list[onnx.NodeProto]:
    """The Add and LayerNormalization nodes a SkipLayerNormalization stands for (its outputs 0 and 3)."""
    x, skip, gamma = node.input[:3]
    beta = node.input[3] if len(node.input) > 3 else ""
    bias = node.input[4] if len(node.input) > 4 and node.input[4] else None
    base = node.name or f"skip_layernorm_{k}"
    total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{node.output[0]}/relsat_sum"
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)  # ONNX Runtime's default
    adds = [helper.make_node("Add", [x, skip], [f"{total}/relsat_input_skip" if bias else total],
                             name=f"{base}/input_skip")]
    if bias:
        adds.append(helper.make_node("Add", [adds[0].output[0], bias], [total], name=f"{base}/bias"))
    return adds + [helper.make_node("LayerNormalization", [total, gamma] + ([beta] if beta else []),
                                    [node.output[0]], name=base, axis=-1, epsilon=eps)]


def split_fusions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with each SkipLayerNormalization of the main graph written as the standard ops it stands for
    (module docstring; a copy, or ``model`` itself when there is none), and the notices saying so."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 17:  # LayerNormalization is ONNX's from opset 17
        return model, []
    read = _read(model.graph)
    at = [i for i, n in enumerate(model.graph.node)
          if n.domain == _MS and n.op_type == "SkipLayerNormalization" and len(n.input) >= 3 and n.output[0]
          and not any(o and read[o] for o in n.output[1:3])]
    if not at:
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    for k, i in enumerate(reversed(at)):
        nodes[i:i + 1] = _standard(nodes[i], k)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, [f"SkipLayerNormalization x{len(at)} (com.microsoft) read as the Add and LayerNormalization it "
                 "stands for (its sum output the Add's)"]
