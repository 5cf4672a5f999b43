"""Banded attention derived from full attention plus a band mask (issue 28): one attention of the Longformer-style
layer (hidden 256, 4 heads, a band of ``--window`` each side, sequence ``--seq``), the original subgraph
(MatMul, Mul, Add band mask, Softmax, MatMul) against the one relations/tensor_mask.py derives (blocks of
``--window`` rows over windows of 3 blocks), under ONNX Runtime level ALL at 1 thread, interleaved, medians.

    python -m relsat.benchmarks.bench_band --seq 512 1024 --window 32
    python -m relsat.benchmarks.bench_band --seq 1024 4096 --window 256 --device cuda   # the GPU figure

The derivation's numeric check evaluates the program by its definition (NumPy), so sequences past ~1024
take minutes and gigabytes there: this measures the attention alone, not the model end to end.
"""
import argparse
import time
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
from relsat.driver.boundary.zoo_builder import Builder
from relsat.driver.boundary.zoo_seeds import _longformer
from relsat.relations.tensor_lower import lower_graph
from relsat.relations.tensor_mask import band_blocks, gathers_apart
from relsat.relations.tensor_match import match


def _torch_timer(model, feeds, device):
    """A callable running ``model`` with PyTorch on ``device``, inputs already there, synchronized at the end,
    and its output on the host (a GPU figure without the host copies that would hide the kernels)."""
    import torch
    from relsat.driver.boundary.torch_runtime import TorchSession
    s = TorchSession(model, device)
    dev = {n: torch.from_numpy(np.array(a)).to(device) for n, a in feeds.items()}
    run = lambda: s.run_on_device(dev)  # noqa: E731 (synchronized by the session)
    return run, lambda: run()[0].cpu().numpy()


def one(seq: int, w: int, runs: int = 15, device: str = "ort") -> str:
    b = Builder(0); out = _longformer(b, seq, 256, 4, 1, w); m = b.model("lf", out)
    names = ["where_1", "transpose_1", "transpose_2", "transpose_3", "matmul_5"]
    probe = onnx.ModelProto(); probe.CopyFrom(m)
    for n in names: probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    x = np.random.default_rng(0).standard_normal((1, seq, 256)).astype(np.float32)
    vals = dict(zip(["output", *names], ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})))
    nodes = {n.output[0]: n for n in m.graph.node}
    chain = [nodes[n] for n in ("matmul_4", "mul_1", "add_4", "softmax_1", "matmul_5")]
    scale = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "inv_sqrt_dk"))
    consts = {"where_1": vals["where_1"], "inv_sqrt_dk": scale}
    shapes = {n: vals[n].shape for n in names[:4]} | {"inv_sqrt_dk": ()}
    p = lower_graph(chain, shapes, consts)
    t0 = time.perf_counter(); q = band_blocks(p, "where_1", consts["where_1"], w); dt = time.perf_counter() - t0
    derived, inits = match(gathers_apart(q), "matmul_5", consts)
    QKV = names[1:4]
    def model(nodes, inits):
        g = helper.make_graph(nodes, "a", [helper.make_tensor_value_info(n, TensorProto.FLOAT, vals[n].shape) for n in QKV],
                              [helper.make_tensor_value_info("matmul_5", TensorProto.FLOAT, None)], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    orig = model(chain, [numpy_helper.from_array(consts["where_1"], "where_1"), numpy_helper.from_array(scale, "inv_sqrt_dk")])
    new = model(derived, [*inits, numpy_helper.from_array(scale, "inv_sqrt_dk")])
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
    feeds = {n: vals[n] for n in QKV}
    if device == "ort":
        s0 = ort.InferenceSession(orig.SerializeToString(), so, providers=["CPUExecutionProvider"])
        s1 = ort.InferenceSession(new.SerializeToString(), so, providers=["CPUExecutionProvider"])
        r0, r1 = (lambda: s0.run(None, feeds)), (lambda: s1.run(None, feeds))
        y0, y1 = r0()[0], r1()[0]
    else:  # PyTorch on ``device`` (cuda: the GPU figure)
        (r0, h0), (r1, h1) = _torch_timer(orig, feeds, device), _torch_timer(new, feeds, device)
        y0, y1 = h0(), h1()
        for _ in range(3):
            r0(); r1()
    t = {0: [], 1: []}
    for r in range(runs):
        for k, s in ((0, r0), (1, r1)) if r % 2 == 0 else ((1, r1), (0, r0)):
            a = time.perf_counter(); s(); t[k].append(time.perf_counter() - a)
    m0, m1 = np.median(t[0]) * 1e3, np.median(t[1]) * 1e3
    return (f"[{device}] seq {seq} window {w}: derivation {dt:.2f} s; max |diff| {np.abs(y0 - y1).max():.2e}; original {m0:.2f} ms "
          f"(q1-q3 {np.percentile(t[0],25)*1e3:.2f}-{np.percentile(t[0],75)*1e3:.2f}), banded {m1:.2f} ms "
          f"({np.percentile(t[1],25)*1e3:.2f}-{np.percentile(t[1],75)*1e3:.2f}); speedup {m0/m1:.2f}x; L/3w = {seq/(3*w):.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--device", default="ort", help="ort (ONNX Runtime, CPU, 1 thread; default), or a torch device "
                    "(cuda, cpu): both graphs run by relsat's PyTorch runtime, inputs on the device")
    args = ap.parse_args(argv)
    for seq in args.seq:
        print(one(seq, args.window, args.runs, args.device), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
