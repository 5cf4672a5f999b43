"""Whole-model latency under ONNX Runtime, and the final guard of ``relsat optimize``.

Owns how relsat times a model (DESIGN section 11): ONNX Runtime sessions with
``ORT_ENABLE_ALL``, a fixed number of intra-op threads, one inter-op thread and
sequential execution; the same seeded random inputs for every model; warm-up; then
runs of all models interleaved (the order alternates every round, so drift hits them
alike) and the median per model. Repeats adapt to the model: about ``BUDGET_S`` of
timed runs per model for fast models, at least ``MIN_RUNS`` runs for slow ones.

Interleaving is by blocks: each model runs a few times back to back (about ``BLOCK_S``), and for
fast models the first run of a block is not timed. Interleaving run by run measured something else:
each run then found its weights evicted from the caches by the other models' runs, and that
penalty differs between graphs (NASRNN: run by run among five models, a candidate graph measured
13 % faster than the original; alone, back to back, the two ran at 2.77 ms each), whereas a model
serving requests runs back to back.

``guard(original, optimized)`` keeps the optimized model only when its median (the median of its block
medians: ``paired_ms``) is below the original's by more than ``GUARD_THRESHOLD`` (3 %: the noise of these
machines) and beyond the spread of the timing: each model's runs are also taken as four blocks (the
two session blocks, each in two halves, in time order), and in every block the optimized model's median
must be below the original's by the threshold too (``judge``; ``spread`` reports the intervals, the noise
and the paired ratios). The blocks are paired because the models ran interleaved within each: the
machine's speed moves between blocks (by 30-50 % within the hour on the CPU here, and by 1.7x between the
two halves of one block on an H100 under PyTorch eager, where a candidate 1.4x faster in both halves was
kept out by the earlier rule, every block of one below every block of the other), but a block sees both
models on the same machine. With one intra-op thread on the CPU, ONNX Runtime runs every kernel on the
calling thread, so the guard compares that thread's CPU time, which other processes on
a shared machine do not inflate (wall-clock medians were seen to double under load);
otherwise it compares wall-clock medians. Both are reported.

``python -m relsat.driver.boundary.latency A.onnx B.onnx ...`` times model files in a fresh
process and prints JSON (used by benchmarks/bench_e2e.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
import onnxruntime as ort

from relsat.relations import runtime
from relsat.relations.backend import CPU, PROVIDERS, Backend, ProviderMissing, resolve

from relsat.driver.boundary import torch_runtime
from relsat.driver.errors import RelsatError, error_line
from relsat.driver.options import GUARD_THRESHOLD
from relsat.driver.boundary.verify import random_inputs

NOT_SLOWER = 0.01  # a graph that does less is not slower where its median is within this of the original's (the
# floor a written model is held to: 0.99x); as fast or faster was the test, and a graph of the same speed passed it by
# a coin's toss (DistilHuBERT's, 28 kernels fewer: 1.039x in its first timing, 2.700 against 2.672 ms in its second)
BUDGET_S = 0.5  # timed runs per model take about this long for fast models
MIN_RUNS = 15  # ... and at least this many runs for slow ones
MAX_RUNS = 2000
WARMUP_RUNS = 3  # warm-up runs per model, at least ...
WARMUP_RUNS_SLOW, SLOW_WARMUP_S = 2, 0.2  # ... or 2 for a model whose 2 runs took 0.2 s: the first run of a fresh
# session of a model over 100 ms ran 0-17 % over its steady time, the second within 5 % either way (ViT-B/16,
# BERT-base, ConvNeXt-T, Swin-T, 5 sessions each, CPU time at 1 thread), and a third run of ViT is 0.4 s a model
WARMUP_S = 0.1  # warm-up continues (up to 20 runs per model) until this long has passed
BLOCK_S = 0.02  # each model runs in blocks of about this long (at most BLOCK_RUNS runs) ...
BLOCK_RUNS = 10
COLD_S = 0.05  # ... after one untimed run, for models faster than this


@dataclass
class Latency:
    median_ms: float  # wall clock
    q1_ms: float
    q3_ms: float
    runs: int
    cpu_ms: float  # median CPU time of the calling thread: with one intra-op thread ONNX Runtime runs
    # every kernel on it, so this is the latency without the time other processes took from it
    # the medians over blocks of runs (each session block's runs in two halves, in time order): how far the
    # median moves within one timing, the spread a difference must exceed (``judge``)
    blocks_ms: list = field(default_factory=list)
    blocks_cpu_ms: list = field(default_factory=list)

    def blocks(self, metric: str) -> list:
        """The block medians of the figure ``metric`` names ("cpu" or "wall")."""
        return self.blocks_cpu_ms if metric == "cpu" else self.blocks_ms


@dataclass
class GuardResult:
    original: Latency
    optimized: Latency
    speedup: float  # original / optimized, wall-clock medians (of the blocks both ran: ``paired_ms``)
    cpu_speedup: float  # original / optimized, CPU-time medians of the calling thread (the same)
    metric: str  # what the decision compared: "cpu" or "wall"
    keep_optimized: bool
    threshold: float
    threads: int
    provider: str
    spread: dict = field(default_factory=dict)  # the block medians' intervals and whether they part (``judge``)

    def as_dict(self) -> dict:
        return {"original_ms": self.original.median_ms, "optimized_ms": self.optimized.median_ms,
                "speedup": self.speedup, "original_cpu_ms": self.original.cpu_ms,
                "optimized_cpu_ms": self.optimized.cpu_ms, "cpu_speedup": self.cpu_speedup,
                "metric": self.metric, "kept": "optimized" if self.keep_optimized else "original",
                "threshold": self.threshold, "runs": self.original.runs, "threads": self.threads,
                "provider": self.provider, "original": asdict(self.original), "optimized": asdict(self.optimized),
                "spread": self.spread, "paired_ms": {m: list(paired_ms(self.original, self.optimized, m))
                                                     for m in ("wall", "cpu")}}


def session(model_or_path, *, threads: int = 1, backend: Backend = CPU) -> ort.InferenceSession:
    """A timing session (``Backend.session``): level ALL, ``threads`` intra-op threads, sequential
    execution; RelsatError when nothing runs the backend's whole models here. CUDA without
    onnxruntime-gpu but with PyTorch CUDA: a ``TorchSession`` on the GPU (``relsat.driver.boundary.torch_runtime``),
    timed the same way."""
    if backend.whole_graph == "torch":
        return torch_runtime.session(model_or_path, "cuda")
    try:
        return backend.session(model_or_path, threads=threads)
    except ProviderMissing as e:
        raise RelsatError(f"ONNX Runtime cannot time whole models here: {e}") from None


def time_models(models, *, threads: int = 1, backend: Backend = CPU, input_shapes: dict | None = None,
                budget_s: float = BUDGET_S, min_runs: int = MIN_RUNS, seed: int = 0,
                roles: dict | None = None, race: Callable[[list[Latency]], list[bool]] | None = None,
                keep: list | None = None) -> list[Latency]:
    """Median latency of each model (ModelProtos or paths) on the same inputs, runs interleaved.

    The runs are made in two blocks with fresh sessions, created in the given order and then in
    the reverse order: the sessions a process creates first ran a few percent slower here,
    whatever the model, which is as large as the differences the guard has to judge.

    ``race``: given the timings after the first block, which models still need the second (the first
    model, the reference, runs in it when it needs it or any other does); a model left out keeps its first
    block's timing, and when none needs it the second block is not run at all. :func:`undecided` is the race
    of the guard's decision: a model whose blocks already overlap the reference's cannot pass it.

    ``keep``: a list that receives the last block's sessions, one per model in order, when that block ran every
    model (else it stays empty): the caller's to run once more after the timing (the measured choice verifies
    the graph it timed in them: ``relsat.driver.search.choice``), not to time again."""
    # each model made runnable once for both blocks' sessions (``runtime.runnable``; a ModelProto would be made so at
    # every session made)
    models = [runtime.runnable(m) for m in models]
    times: list[list[float]] = [[] for _ in models]
    cpu: list[list[float]] = [[] for _ in models]
    feeds = None
    blocks: list[list[tuple[int, int]]] = [[] for _ in models]  # each block's runs: (first, end) in times
    active = list(range(len(models)))
    for block in range(2):
        starts, last = [len(t) for t in times], None  # (``keep``'s sessions: the last block's, released first)
        try:
            made = {k: session(models[k], threads=threads, backend=backend) for k in active[::1 - 2 * block]}
        except RelsatError:
            raise
        except Exception as e:
            raise RelsatError(f"ONNX Runtime cannot load a model to time it: {error_line(e)}") from None
        sessions = [made[k] for k in active]
        if feeds is None:  # the same inputs for both blocks
            feeds = random_inputs(sessions, seed=seed, input_shapes=input_shapes, roles=roles)
        runs = [(s, {i.name: feeds[i.name] for i in s.get_inputs() if i.name in feeds}) for s in sessions]
        sub_times, sub_cpu = [times[k] for k in active], [cpu[k] for k in active]
        _timed_block(runs, sub_times, sub_cpu, budget_s / 2, max(1, math.ceil(min_runs / 2)))
        last = sessions if keep is not None and len(active) == len(models) else None
        del made, sessions, runs
        for k in active:  # the block's runs in two halves, in time order
            a = starts[k]
            b, mid = len(times[k]), a + (len(times[k]) - a + 1) // 2
            blocks[k] += [(a, mid), (mid, b)] if b - a >= 2 else [(a, b)]
        if block == 0 and race is not None:
            need = race(_latencies(times, cpu, blocks))
            rest = [k for k in active[1:] if need[k]]
            if not rest and not need[0]:
                break
            active = [0, *rest]
    if last is not None:
        keep[:] = last
    return _latencies(times, cpu, blocks)


def _latencies(times, cpu, blocks) -> list[Latency]:
    out = []
    for t, c, bl in zip(times, cpu, blocks):
        q1, med, q3 = np.percentile(np.asarray(t) * 1e3, [25, 50, 75])
        out.append(Latency(float(med), float(q1), float(q3), len(t), float(np.median(c) * 1e3),
                           [float(np.median(t[a:b]) * 1e3) for a, b in bl if b > a],
                           [float(np.median(c[a:b]) * 1e3) for a, b in bl if b > a]))
    return out


def undecided(*, threads: int, backend: Backend, threshold: float = GUARD_THRESHOLD
              ) -> Callable[[list[Latency]], list[bool]]:
    """The race (:func:`time_models`) of :func:`judge` against the first model: a model still needs runs
    while it is faster than the reference beyond the threshold in every block so far. More blocks only add
    pairs that must pass, so one that failed a block cannot be kept by ``judge`` whatever the second session
    gives: dropping it changes no decision, it only saves the time."""
    metric = backend.metric(threads)
    return lambda t: [False] + [spread(t[0], x, metric, threshold)["apart"] for x in t[1:]]


def _timed_block(runs, times, cpu, budget_s: float, min_runs: int) -> None:
    """Warm up, then run every model once per round (alternating direction), appending wall and
    calling-thread CPU seconds to ``times`` and ``cpu``."""
    def once(k: int, record: bool) -> float:
        s, f = runs[k]
        c, t = time.thread_time(), time.perf_counter()
        s.run(None, f)
        wall = time.perf_counter() - t
        if record:
            times[k].append(wall)
            cpu[k].append(time.thread_time() - c)
        return wall

    def cold(w: list) -> bool:
        return len(w) < (WARMUP_RUNS_SLOW if len(w) >= WARMUP_RUNS_SLOW and sum(w) >= SLOW_WARMUP_S else WARMUP_RUNS)

    warm = [[] for _ in runs]
    start = time.perf_counter()
    while any(map(cold, warm)) or (time.perf_counter() - start < WARMUP_S and len(warm[0]) < 20):
        for k in range(len(runs)):
            warm[k].append(once(k, False))
    per_run = max(float(np.median(w[1:] or w)) for w in warm)
    block = max(1, min(BLOCK_RUNS, math.ceil(BLOCK_S / max(per_run, 1e-6))))
    n = int(min(MAX_RUNS, max(min_runs, math.ceil(budget_s / max(per_run, 1e-6)))))
    for r in range(math.ceil(n / block)):
        for k in (range(len(runs)) if r % 2 == 0 else reversed(range(len(runs)))):
            if per_run < COLD_S:  # the first run after another model's runs finds its weights out of cache
                once(k, False)
            for _ in range(block):
                once(k, True)


def guard(original, optimized, *, threads: int = 1, backend: Backend = CPU, input_shapes: dict | None = None,
          threshold: float = GUARD_THRESHOLD, budget_s: float = BUDGET_S, roles: dict | None = None) -> GuardResult:
    """Time both models interleaved; keep the optimized one only if it is faster beyond ``threshold``
    (CPU time of the calling thread with one CPU thread, else wall clock; see the module docstring).
    ``roles``: what the integer inputs must hold (``relsat.driver.boundary.feeds.input_roles``)."""
    orig, opt = time_models([original, optimized], threads=threads, backend=backend, input_shapes=input_shapes,
                            budget_s=budget_s, roles=roles,
                            race=undecided(threads=threads, backend=backend, threshold=threshold))
    return judge(orig, opt, threads=threads, backend=backend, threshold=threshold)


def judged_ms(t: Latency, threads: int, backend: Backend) -> float:
    """The figure of ``t`` the guard compares (``Backend.metric``: the calling thread's CPU time with
    one CPU thread, else the wall clock)."""
    return metric_ms(t, backend.metric(threads))


def metric_ms(t: Latency, metric: str) -> float:
    """``t``'s median by ``metric``: "cpu" (the calling thread's CPU time) or "wall"."""
    return t.cpu_ms if metric == "cpu" else t.median_ms


def relative_range(values) -> float:
    """How far ``values`` (block medians) lie apart: their range over their median (0 for none, or a median of 0)."""
    middle = float(np.median(values)) if len(values) else 0.0
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def spread(orig: Latency, opt: Latency, metric: str, threshold: float = 0.0) -> dict:
    """The spread of two timings: each one's interval of block medians (``Latency.blocks``), the noise (the
    wider interval over its median), ``ratios``: the input's block median over the optimized model's, block by
    block (blocks of the same index ran interleaved, in the same minutes), and ``apart``: in every block the
    optimized model is faster by more than ``threshold`` (True where a timing has no blocks).  A negative
    ``threshold`` (a caller that accepts a slower model, as tests do) loosens it by as much."""
    a, b = orig.blocks(metric), opt.blocks(metric)
    if not a or not b:
        return {"original_ms": None, "optimized_ms": None, "noise": None, "ratios": None, "apart": True}
    noise = max(relative_range(a), relative_range(b))
    pairs = list(zip(a, b))  # a model the race dropped after the first session has its first blocks only
    return {"original_ms": [min(a), max(a)], "optimized_ms": [min(b), max(b)], "noise": noise,
            "ratios": [_ratio(x, y) for x, y in pairs],
            "apart": all(y < x * (1.0 - threshold) for x, y in pairs)}


def paired_ms(orig: Latency, opt: Latency, metric: str) -> tuple[float, float]:
    """The medians of ``orig`` and ``opt`` by ``metric`` over the runs they made in the same minutes: the median of
    the block medians they share (the overall medians where a timing has no blocks). A model that the race
    (``time_models``) left out of the second session has its first session's blocks only, while the reference
    ran on: overall medians then compare runs of different minutes (DistilBERT: the input model's blocks 39.9,
    52.5, 64.7, 66.4 ms as the machine slowed, a candidate's 39.3 and 40.1 in the first session only, "1.45x").
    And where the machine changed speed between the sessions, each model's runs fall in two clusters and the
    overall median of 16 runs lands in either (BERT-base at 2 threads: every block of a candidate 3.7-6.3 %
    faster, blocks 135.5, 133.5, 74.3, 74.7 ms against 128.3, 128.7, 69.9, 71.7, overall medians 76.8 against
    100.3 ms: "0.766x"); the median of the blocks is the same pairing the every-block rule judges."""
    a, b = orig.blocks(metric), opt.blocks(metric)
    if a and b:
        k = min(len(a), len(b))
        return float(np.median(a[:k])), float(np.median(b[:k]))
    return metric_ms(orig, metric), metric_ms(opt, metric)


def gain(orig: Latency, opt: Latency, metric: str) -> float:
    """How many times faster ``opt`` ran than ``orig`` by ``metric``, over the blocks both ran (``paired_ms``)."""
    return _ratio(*paired_ms(orig, opt, metric))


def judge(orig: Latency, opt: Latency, *, threads: int, backend: Backend,
          threshold: float = GUARD_THRESHOLD) -> GuardResult:
    """The guard's decision on two timings: keep ``opt`` only if it is faster than ``orig`` beyond
    ``threshold`` by the medians (of the blocks they share: ``paired_ms``) and in every block (``spread``: a
    3.6 % difference of the medians that one block does not show is noise on a shared machine). Faster beyond
    the threshold in every block is faster beyond it by the median of the blocks too (each order statistic of
    one side lies beyond the other's); the medians decide alone only for a timing without blocks."""
    metric = backend.metric(threads)
    sp = spread(orig, opt, metric, threshold)
    a, b = paired_ms(orig, opt, metric)
    keep = b < a * (1.0 - threshold) and sp["apart"]
    return GuardResult(orig, opt, gain(orig, opt, "wall"), gain(orig, opt, "cpu"), metric, keep, threshold, threads,
                       backend.name, sp)


def not_slower(held: GuardResult) -> bool:
    """Whether a timing (``judge``'s result, kept or not) leaves the optimized model no slower than the original:
    slower by no more than ``NOT_SLOWER`` by the compared medians (``paired_ms``), and by no more than the threshold
    in any block. What a graph that does less needs (``relsat.driver.search.candidates``: a *simplified* graph), where
    it is not faster beyond the noise."""
    a, b = paired_ms(held.original, held.optimized, held.metric)
    return b <= a * (1.0 + NOT_SLOWER) and all(r >= 1.0 - held.threshold for r in held.spread["ratios"] or [1.0])


def slower_in_a_block_only(held: GuardResult) -> bool:
    """Whether a timing that leaves the optimized model slower (``not not_slower``) does so only by a block: within
    ``NOT_SLOWER`` by the compared medians, one block or more beyond the threshold. A close call, worth one more
    timing with more runs per block (Whisper-tiny's simplified graph at 1 thread: 403.416 against 403.401 ms by the
    medians, a block of four 400 ms runs over 3 % slower)."""
    a, b = paired_ms(held.original, held.optimized, held.metric)
    return b <= a * (1.0 + NOT_SLOWER) and not not_slower(held)


def promising(held: GuardResult) -> bool:
    """Whether a timing that ``judge`` did not keep (``held``) is worth one more: the optimized model is faster
    beyond the threshold by the compared medians and faster in every block, only not by the threshold in all of
    them (the machine's speed moved within a block). One slower block, or medians within the threshold, is not."""
    return second_chance(held) and all(r > 1.0 for r in held.spread["ratios"] or [0.0])


def second_chance(held: GuardResult) -> bool:
    """Whether a timing that ``judge`` did not keep (``held``) leaves the optimized model worth a second timing of
    its own (``Search._pick``): faster beyond the threshold by the compared medians (``paired_ms``), some block
    not."""
    a, b = paired_ms(held.original, held.optimized, held.metric)
    faster = b < a * (1.0 - held.threshold)
    return faster and not held.spread["apart"]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Time ONNX models under ONNX Runtime, runs interleaved; prints JSON.")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--provider", default=CPU.name, choices=PROVIDERS)
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds of timed runs per model (fast models)")
    ap.add_argument("--min-runs", type=int, default=MIN_RUNS)
    args = ap.parse_args(argv)
    try:
        res = time_models(args.models, threads=args.threads, backend=resolve(args.provider), budget_s=args.budget,
                          min_runs=args.min_runs)
    except RelsatError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1)
    print(json.dumps([{"model": m, **asdict(r)} for m, r in zip(args.models, res)]))


if __name__ == "__main__":
    main()
