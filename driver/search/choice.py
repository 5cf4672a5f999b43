"""Steps 4 to 6 of the search, the measured choice (:class:`Choice`, a part of
``relsat.driver.search.candidates.Search``): the input model and the candidate graphs timed, the fastest that
verifies written where it is faster beyond the noise, else one that does less where it is not slower.

4. **Timing** (:meth:`Choice.choose`): the input model and every candidate are timed as whole models, interleaved
   (:func:`relsat.driver.boundary.latency.time_models`); the input model is timed alone when there is no candidate.
   The profiles the prices came from are checked against those timings (``relsat.driver.search.fidelity``); when
   one is stale, its row is removed from the cache and steps 1 to 3 run again (``Search._retake``), re-taking every
   profile the check found stale or did not check (their rows replaced), so the prices and the candidates come from
   fresh numbers; the candidates are timed again (unless they are the graphs just timed: those timings stand,
   ``_reuse``) and checked again, the noise widened by how far the input model's fresh timings moved apart. A cached
   row that is stale now (it passed the first check inside a wider noise band) is re-taken the same way, up to
   ``RETAKES`` searches in all, then only removed. The choice made is stored, and a later run that reaches the same
   graphs recalls it (``relsat.driver.search.recall``).
5. **Choice** (``_pick``): fastest first, a candidate that beats the input model by more than the guard threshold
   and beyond the spread of the timing (every block median below every one of the input model's:
   :func:`relsat.driver.boundary.latency.judge`) is timed again with the input model alone (:meth:`Choice._confirmed`:
   the fastest of several candidates beats the threshold by noise now and then; a second timing that is faster in
   every block but not by the threshold in all is taken once more, judged alone by the same rule) and verified, in
   that timing's sessions (``_verify``: none made for it); the first that verifies is written where it is faster
   there too, else the input model is. A candidate that fails verification gives way to the next.
6. **Simplified** (:meth:`Choice._simplified`, ``Options.simplify``): where none is written so, the fastest
   candidate not slower beyond the threshold in the first timing that ONNX Runtime runs with fewer kernels and no
   more work of any kind than the input model (:func:`relsat.driver.boundary.ort_graph.does_less`, on the graphs
   the runtime itself optimized) is timed against the input model again and verified; not slower there (by the
   medians, and in no block beyond the threshold: :func:`relsat.driver.boundary.latency.not_slower`), it is
   written, and reported as simplified, not faster.

A graph is verified after its second timing, in the sessions of that timing's last block (``_kept``: both models
loaded at level ALL, at these threads), so its verification makes no session of its own where the backend is ONNX
Runtime on the CPU and the timing runs on at least half the cores (GPT-2: three sessions of 1.5 s each, of a warm run's
34 s); on another backend the timing's sessions are not the CPU sessions verification runs in, and on fewer threads
its runs would cost more than the sessions: it makes its own (``_verifies_in_timing_sessions``).

What of ``Search`` this uses: its candidates (``candidates``, ``usable()``, ``original``), ``cache``, ``feeds``,
``backend``, ``threads``, ``simplify``, ``_run_args`` and ``_retake()`` (steps 1 to 3 again), the check
(``ProfileChecks``) and the recall (``Recall``).
"""

from __future__ import annotations

import os
import time

import onnx

from relsat.driver.boundary import feeds, ort_graph
from relsat.driver.boundary.latency import (BUDGET_S, MIN_RUNS, GuardResult, Latency, judge, judged_ms, not_slower,
                                            paired_ms, promising, second_chance, slower_in_a_block_only, time_models,
                                            undecided)
from relsat.driver.boundary.verify import VerifyResult, verify
from relsat.driver.errors import error_line
from relsat.driver.search import comparisons
from relsat.driver.search.candidate import CLOSE_MISS, NOT_HELD, SIMPLIFIED, SLOWER_SIMPLIFIED, Candidate
from relsat.extract.profile import timing_kind
from relsat.relations import runtime

RETAKES = 2  # times the search runs again on re-taken profiles; after the first, only for cached rows that
# still disagree (a cached row passed the first check inside a wide noise band and failed a narrower one)
CONFIRM_MIN_RUNS = 2 * MIN_RUNS  # runs per model in the second timing of the candidate to write, at least
CONFIRM_TIMINGS = 2  # second timings at most, the next only after a promising one (``Choice._confirmed``), with
# twice the runs and budget of the one before: a close call gets its block medians from more runs


class Choice:
    """The candidates timed, checked, verified and the one to write chosen (module docstring)."""

    _kept = None  # (candidate, the input model's session, its session): the last block of their last timing
    # (``_timed_again``), kept for its verification (``_verify``); released before anything else is timed

    def _ready(self, status) -> None:
        """Each candidate graph that was not profiled (next-best graphs) loaded in ONNX Runtime with its
        optimizations on; one that
        cannot load is dropped (``cannot load: ...``). Done by :meth:`choose` after the cached comparison was
        looked up: one recalled runs none of these graphs (it named them by their keys; each loaded then), and a
        session of BERT-base made only to check it cost 2-3 s a graph of a warm run. The graph is serialized
        once for the check and the timing after it."""
        todo = [c for c in self.candidates if c.model is not None and c.profile_key is None and not c.loaded]
        if todo:
            status(f"loading {len(todo)} candidate graph(s) in ONNX Runtime ...")
        for c in todo:
            self._name(c)  # (named in the comparison stored after the choice, loaded or not)
            try:
                runtime.session(self._blobs([c.model])[0])
                c.loaded = True
            except Exception as e:  # never fail a valid model: this candidate is dropped
                c.status, c.model = f"cannot load: {error_line(e)}", None

    def _time(self, input_model: onnx.ModelProto, cands: list[Candidate], bindings, threshold: float) -> None:
        """Time the input model and ``cands`` interleaved (the input model alone when there are none). A
        candidate whose first block already overlaps the input model's is not run in the second
        (:func:`~relsat.driver.boundary.latency.undecided`: it cannot be written whatever that block gives),
        unless its profile disagrees with its first block: the first block alone is biased (the sessions made
        first in it run slower, the reason for the second, reversed one) and the check (:meth:`check`) would
        then find a profile stale and search again, which costs far more than the block."""
        shapes, self._kept = bindings[0], None  # timed at the costed binding
        decided = undecided(threads=self.threads, backend=self.backend, threshold=threshold)
        orig = self.original
        same = next((c for c in cands if c.model is orig.model), None)

        def disagrees(c: Candidate | None, t: Latency) -> bool:
            return (c is not None and c.profile_key is not None and c.profiled_ms is not None
                    and not self._agreement(c.profiled_ms, t)["agrees"])

        def race(t: list[Latency]) -> list[bool]:
            # the original's profile is checked against its own exported graph's timing where that is a
            # candidate (which carries the same profile), else against the input model's (:meth:`check`)
            return [same is None and disagrees(orig, t[0])] + [
                n or disagrees(c, x) for n, c, x in zip(decided(t)[1:], cands, t[1:])]

        res = time_models(self._blobs([input_model] + [c.model for c in cands]), threads=self.threads,
                          backend=self.backend, input_shapes=shapes, roles=feeds.input_roles(input_model, shapes),
                          race=race)
        orig.timing, orig.measured_ms, orig.wall_ms = res[0], judged_ms(res[0], self.threads, self.backend), \
            res[0].median_ms
        for c, t in zip(cands, res[1:]):
            c.timing, c.measured_ms, c.wall_ms, c.status = t, judged_ms(t, self.threads, self.backend), t.median_ms, \
                "timed"

    def _blobs(self, models: list[onnx.ModelProto]) -> list:
        """Each model made runnable once per :meth:`choose` (``runtime.runnable``: every timing makes two sessions of
        each model, and serializing DistilBERT took 0.6 s a time: 17 of the 53 s the choice took); a candidate's
        profile has made its graph runnable already (:attr:`Candidate.blob`); one over 2 GiB stays a model."""
        done = {id(c.model): c.blob for c in self.usable() if c.blob is not None}
        shells = {id(c.model): c.weights for c in [self.original, *self.candidates]
                  if c is not None and c.model is not None and c.weights}
        for m in models:
            if id(m) not in self._serialized:  # the model is kept too, so that its id is not reused
                blob = done.get(id(m))
                if blob is None:  # (the input model: timed in two sessions a timing, and verified)
                    blob = runtime.runnable(m, shells.get(id(m)), sessions=4)
                self._serialized[id(m)] = (m, blob)
        return [self._serialized[id(m)][1] for m in models]

    def choose(self, input_model: onnx.ModelProto, *, bindings, threshold: float, input_sets=(),
               status=lambda text: None) -> tuple[Candidate | None, VerifyResult | None, dict | None]:
        """Steps 4 and 5: time the input model and the usable candidates interleaved, check the profiles
        (re-taking stale ones: see :data:`RETAKES`), confirm and verify fastest first. Returns the candidate to write
        (None: the input model), its verification, and the guard's report (the input model against the
        written or, if none, the fastest candidate; None without candidates)."""
        self._serialized, self._kept = {}, None
        try:
            picked, check, guard = self._choose(input_model, bindings, threshold, input_sets, status)
            self._fill(picked)  # (written: the only graph whose weights go into its model)
            return picked, check, guard
        finally:
            self._serialized, self._input_sha256, self._kept = {}, None, None

    def _choose(self, input_model, bindings, threshold, input_sets, status):
        self._found_comparison, self._drift = None, 0.0
        recalled = self._recall(input_model, bindings, threshold, input_sets, status) if self.usable() else None
        if recalled is not None:
            return recalled
        t_retake, removed, measured, first, stale_all, reused, remeasured = None, 0, [], None, [], 0, []
        timed = None  # the last timing: the original and the candidates it timed
        for attempt in range(RETAKES + 1):
            self._ready(status)
            cands = self.usable()
            if timed is not None and self._reuse(timed, cands):
                reused += 1  # the search on re-taken prices found the graphs already timed
            else:
                status(("timing the input model" + (f" and {len(cands)} candidate graph(s)" if cands else "")
                        + (" again" if attempt else "") + " ..."))
                self._time(input_model, cands, bindings, threshold)
                measured.append(self.original.measured_ms)
            timed = (self.original, list(cands))
            lo, hi = min(measured), max(measured)
            self._drift = hi / lo - 1 if lo > 0 else 0.0
            checks = self.check()
            if attempt == 0:
                first = {**self._original_fidelity(), "checked": checks}
            # only a cached profile can be stale: one taken in this run disagrees by the noise (the machine moved
            # between the profile and the timing), and re-taking it measures that noise again (ViT-B/16 at 2
            # threads with a test suite beside it: a re-take of its fresh profile cost 79 s and left it 12 % off)
            stale = [r for r in checks if r["stale"] and r["profile"] == "cache"]
            if stale:  # a row that a fresh measurement of its own kind confirms is not stale: the timing moved
                again = self._remeasure(stale, status)
                self._restate_held(again)
                remeasured += again
                stale = [r for r in stale if r["key"] not in {h["key"] for h in again if h["held"]}]
            stale_all += [{**r, "search": attempt + 1} for r in stale]
            if not stale or self._run_args is None:
                break
            if attempt == RETAKES:  # out of re-takes: the stale rows go, the next run measures them
                removed += self.cache.delete({r["key"] for r in stale}) if self.cache is not None else 0
                break
            t_retake = t_retake or time.perf_counter()
            removed += self._retake(checks, status)
        restated = self._restate(checks, status)
        retaken = attempt > 0
        self.fidelity = self._fidelity(
            checks, timings_of_input_ms=measured, stale=stale_all, searches=attempt + 1 if retaken else 1,
            retaken=len(self._retaken), stale_rows_removed=removed,
            stale_rows_replaced=len(self._stale & self._retaken),
            retake_s=time.perf_counter() - t_retake if t_retake else 0.0, timings_reused=reused,
            remeasured=remeasured, first_pass=first if retaken else None, restated=restated)
        if not cands:
            return None, None, None
        picked, check, guard = self._pick(input_model, cands, bindings, threshold, input_sets, status)
        less = None
        if picked is None and self.simplify:
            simpler = self._simplified(input_model, cands, bindings, threshold, input_sets, status)
            if simpler is not None:
                picked, check, guard, less = simpler
        report = {**guard.as_dict(), **({"simplified": less} if less is not None else {})}
        orig = self.original
        if self.cache is not None:  # (a written one is confirmed again when recalled: ``_recall``)
            # under the key a later run computes before loading its graphs: with those the choice could not load
            named = [c for c in self.candidates if c.model is not None or c.status.startswith("cannot load")]
            comparisons.remember(self.cache, self._comparison_key(input_model, named, bindings, threshold),
                                 timing_kind(self.backend), self.threads, orig.timing,
                                 [(c.label, c.timing, c.status, self._name(c)) for c in named], report)
        return picked, check, report

    def _pick(self, input_model, cands: list[Candidate], bindings, threshold: float, input_sets, status):
        """Step 5 on the timed candidates, fastest first: one faster beyond the noise here is timed again with the
        input model alone (``_confirmed``) and verified in that timing's sessions; the first that verifies is written
        where it is faster there too (one that does not verify gives way to the next). Returns the candidate (None: the
        input model), its verification and the guard (the input model against it, or the fastest).

        The fastest candidate is also given its second timing when it is faster beyond the threshold by the
        medians but not in every block (``second_chance``): on a machine whose speed moves 10-50 % within a
        timing, Swin-T's 1.14x faster graph (onnxsim's output is as fast: 1.11x) lost one block of four at 0.89x and
        was not written. The second timing alone then decides, by the same every-block rule, and the guard
        reported is its own."""
        orig = self.original
        picked, check, confirmed = None, None, None
        for i, c in enumerate(sorted(cands, key=self._gain, reverse=True)):
            held = judge(orig.timing, c.timing, threads=self.threads, backend=self.backend, threshold=threshold)
            chance = i == 0 and not held.keep_optimized and second_chance(held)
            if not held.keep_optimized and not chance:
                c.status = "slower" if self._gain(c) <= 1.0 else "not faster beyond noise"
            elif picked is None:
                if c.verified is not None and not c.verified.ok:  # (verified already, for a recall)
                    continue
                ok, o_t, c_t = self._confirmed(input_model, c, bindings, threshold, status)
                # verified whether it held or not (in the timing's sessions): a candidate that does not compute what
                # the input model does gives way to the next, whatever its second timing gave
                result = self._verify(input_model, c, bindings, input_sets, status)
                if not result.ok:
                    continue  # the next candidate is timed again and verified in its turn
                if not ok:
                    picked = False  # the fastest verified candidate did not hold: none is written
                    continue
                picked, check, c.status = c, result, "written"
                confirmed = (o_t, c_t) if chance else None
                if chance:
                    c.confirm = dict(c.confirm or {}, second_chance=True)
        picked = picked or None
        best = picked or self.fastest()
        first, second = confirmed or (orig.timing, best.timing)
        guard = judge(first, second, threads=self.threads, backend=self.backend, threshold=threshold)
        guard.keep_optimized = picked is not None  # a faster candidate that failed verification is not kept
        return picked, check, guard

    def _confirmed(self, input_model: onnx.ModelProto, c: Candidate, bindings, threshold: float,
                   status) -> tuple[bool, Latency, Latency]:
        """Time the input model and ``c`` again, by themselves, in fresh sessions: ``c`` is written only if it
        is faster beyond ``threshold`` in such a timing too (by the medians and in every block, ``judge``). With
        several candidates, the fastest of them in one timing is faster than the input model by more than the
        threshold now and then by noise alone (MobileNetV3 and RegNetY: written at 0.975-0.994x of the input
        model's speed, the same kernels).

        A slow model gets ``CONFIRM_MIN_RUNS`` runs here: with ``MIN_RUNS`` a block of a 100 ms model is four
        runs, and two slow ones among them (ConvNeXt V2 at 2 threads: a 1.15x faster graph's block at 103-109 ms
        beside blocks of 83-92) failed the every-block rule in one timing of three. A timing that does not pass
        but is *promising* (faster beyond the threshold by the medians and faster in every block, only not by
        the threshold in all of them) is taken once more, up to ``CONFIRM_TIMINGS`` in all, each judged alone by
        the same rule: ViT-B/16's 1.10x faster graph was timed again at block ratios 1.12, 1.10, 1.03, 1.14
        while the machine's speed moved 30 % between the blocks. That next timing makes twice the runs (and
        spends twice the budget) of the one before: a block median of more runs moves less with the machine,
        so the same every-block rule tells a real gain of a few percent from the noise more often either way
        (Whisper-tiny's graph at 2 threads was kept out by its second timing: 130.2 vs 140.6 ms by the medians,
        not in every block). A timing where the candidate is slower in any block ends it. Returns whether it held,
        and the last timing of the input model and of ``c``."""
        shapes = bindings[0]
        tries = []
        for k in range(CONFIRM_TIMINGS):
            status(f"timing the {c.label} graph against the input model again ...")
            held = self._timed_again(input_model, c, shapes, threshold, seed=1 + k,
                                     min_runs=CONFIRM_MIN_RUNS * 2**k, budget_s=BUDGET_S * 2**k,
                                     race=undecided(threads=self.threads, backend=self.backend, threshold=threshold))
            orig, again = held.original, held.optimized
            tries.append(held.as_dict())
            c.confirm = dict(tries[-1], timings=len(tries), earlier=tries[:-1])
            if held.keep_optimized:
                return True, orig, again
            if not promising(held):
                break
        head = CLOSE_MISS if second_chance(held) else NOT_HELD
        c.status = (f"{head} ({judged_ms(again, self.threads, self.backend):.3f} ms vs "
                    f"{judged_ms(orig, self.threads, self.backend):.3f} ms"
                    + (f"; {len(tries)} timings" if len(tries) > 1 else "") + ")")
        return False, orig, again

    def _simplified(self, input_model, cands: list[Candidate], bindings, threshold: float, input_sets, status):
        """Step 6, where no candidate was faster beyond the noise (``_pick`` wrote none): the fastest candidate that
        was not slower beyond the threshold in the first timing (by the medians of the blocks it shared with the input
        model; the second timing decides: DistilHuBERT's "original, simplified" graph, 28 kernels fewer, ran 0.99x
        there in a timing whose blocks moved by 26 %) and that
        ONNX Runtime runs with fewer kernels and no more of any class of work than the input model
        (``ort_graph.does_less``: its graph as the runtime optimizes it, at these threads, on this backend) is
        verified and timed against the input model again (``_not_slower``); not slower there, it is written as a
        *simplified* graph (status ``SIMPLIFIED``), not called faster. Only the first candidate that does less is
        timed: trying the next ones until one is not slower would fish in the noise.

        Why: a gain under the guard's threshold is below what this machine can tell (A/A pairs of one model move by
        3-11 %), yet the work a graph leaves out is known without timing it. onnxsim and onnxslim write their folded
        graphs whatever they gain; relsat reached theirs or more (GPT-2: ONNX Runtime runs 739 kernels of relsat's
        graph against onnxslim's 857 and the input model's 971; Whisper-tiny 95 against 114 and 146) and wrote the
        input model, 1-3.5 % behind them when that gain was real. Returns ``(candidate, verification, guard, what it
        does less)`` or None."""
        if not self.backend.ort_providers:  # (a graph ONNX Runtime does not run here has no optimized graph to read)
            return None
        order = [c for c in sorted(cands, key=self._gain, reverse=True)  # (not slower beyond the threshold)
                 if self._gain(c) * (1.0 + threshold) >= 1.0 and c.model is not None
                 and not c.status.startswith("not verified")]
        if not order:
            return None
        status("reading the graphs ONNX Runtime runs for the input model and the candidates ...")
        before = self._runtime_graph(input_model)
        if before is None:
            return None
        for c in order:
            less = self._does_less(input_model, c, before)
            if less is None:
                continue
            ok, held = self._not_slower(input_model, c, bindings, threshold, status)
            result = self._verify(input_model, c, bindings, input_sets, status)  # (in the timing's sessions; as in
            if not result.ok:  # ``_pick``, one that does not verify gives way to the next whatever its timing gave)
                continue
            if not ok:
                return None
            c.status = SIMPLIFIED
            return c, result, held, less
        return None

    def _verify(self, input_model: onnx.ModelProto, c: Candidate, bindings, input_sets, status) -> VerifyResult:
        """``c`` verified against the input model, once a choice (``_pick`` verifies the fastest; ``_simplified`` may
        take the same candidate after its second timing failed); a failure is its status. In the sessions of its
        last timing with the input model where they are kept (``_kept``), else in sessions made for it."""
        kept, self._kept = self._kept, None
        if c.verified is None:
            status(f"verifying the {c.label} graph ...")
            ref, opt = kept[1:] if kept is not None and kept[0] is c else (None, self._blobs([c.model])[0])
            c.verified = verify(input_model, opt, bindings=bindings, input_sets=input_sets, reference=ref)
            if not c.verified.ok:
                c.status = f"not verified: {c.verified.message}"
        return c.verified

    def _runtime_graph(self, model: onnx.ModelProto) -> onnx.GraphProto | None:
        """The graph ONNX Runtime runs for ``model`` here (``ort_graph.optimized_graph``), None where it cannot be
        read."""
        try:
            return ort_graph.optimized_graph(self._blobs([model])[0], threads=self.threads, backend=self.backend)
        except Exception:
            return None

    def _does_less(self, input_model: onnx.ModelProto, c: Candidate, before=None) -> dict | None:
        """What ``c`` leaves out of the input model's work as ONNX Runtime runs both (``ort_graph.does_less``;
        ``before``: the input model's graph, read already), or None."""
        before = before if before is not None else self._runtime_graph(input_model)
        after = self._runtime_graph(c.model) if before is not None else None
        return ort_graph.does_less(before, after) if after is not None else None

    def _not_slower(self, input_model: onnx.ModelProto, c: Candidate, bindings, threshold: float,
                    status) -> tuple[bool, GuardResult]:
        """Time the input model and ``c`` again, by themselves, as the first timing did (``MIN_RUNS`` at least: the
        claim is not slower, and a recalled one is timed so again in every warm run): whether ``c`` is not slower
        there (``latency.not_slower``; if not, ``c``'s status says so), and the guard of that timing
        (``keep_optimized`` set where it is not slower). A close call (slower only by a block:
        ``latency.slower_in_a_block_only``) is timed once more, as ``_confirmed`` times a promising one: with
        ``CONFIRM_MIN_RUNS`` runs and twice the budget, judged alone; any other timing ends it."""
        shapes = bindings[0]
        earlier = [c.confirm] if c.confirm else []  # (a second timing ``_confirmed`` gave it as a faster graph)
        for k in range(CONFIRM_TIMINGS):
            status(f"timing the {c.label} graph against the input model again (it runs fewer kernels) ...")
            more = {"min_runs": CONFIRM_MIN_RUNS, "budget_s": BUDGET_S * 2} if k else {}
            held = self._timed_again(input_model, c, shapes, threshold, seed=1 + k, **more)
            c.confirm = dict(held.as_dict(), timings=1 + k, simplified=True, earlier=list(earlier))
            if not_slower(held):
                held.keep_optimized = True
                return True, held
            if not slower_in_a_block_only(held):
                break
            earlier.append(c.confirm)
        c.status = (f"{SLOWER_SIMPLIFIED} ({judged_ms(held.optimized, self.threads, self.backend):.3f} ms vs "
                    f"{judged_ms(held.original, self.threads, self.backend):.3f} ms"
                    + (f"; {c.confirm['timings']} timings" if c.confirm["timings"] > 1 else "") + ")")
        return False, held

    def _timed_again(self, input_model: onnx.ModelProto, c: Candidate, shapes, threshold: float, *, seed: int,
                     **runs) -> GuardResult:
        """The input model and ``c`` timed again, by themselves, in fresh sessions at ``shapes``
        (``time_models``; ``runs``: its min_runs, budget_s, race), and judged (``judge``): what ``_confirmed`` and
        ``_not_slower`` decide on."""
        self._kept = None  # (the sessions of an earlier timing: released before this one makes its own)
        kept = [] if self._verifies_in_timing_sessions() else None
        orig, again = time_models(self._blobs([input_model, c.model]), threads=self.threads, backend=self.backend,
                                  input_shapes=shapes, roles=feeds.input_roles(input_model, shapes), seed=seed,
                                  keep=kept, **runs)
        if kept:
            self._kept = (c, *kept)
        return judge(orig, again, threads=self.threads, backend=self.backend, threshold=threshold)

    def _verifies_in_timing_sessions(self) -> bool:
        """Whether a graph is verified in the sessions of its last timing (``_kept``): where they are ONNX Runtime's on
        the CPU, as verification's own are, and run on at least half the cores (verification's own sessions use all of
        them: at one thread on a machine of many cores, its runs of a big model would cost more than the two sessions
        they save)."""
        return (self.backend.name == "cpu" and bool(self.backend.ort_providers)
                and 2 * self.threads >= (os.cpu_count() or 1))

    @staticmethod
    def _key(c: Candidate) -> tuple:
        return c.label == "original, simplified", tuple(sorted(c.choice.items()))

    def _reuse(self, timed: tuple, cands: list[Candidate]) -> bool:
        """After a re-take: when the search on the fresh prices found exactly the graphs of the last timing,
        their timings stand (a graph's latency does not depend on the prices that found it, and timing them
        again cost as much as the first timing). Only all or none: the timing pairs every candidate's
        blocks with the input model's of the same timing. Returns whether it took the timings."""
        orig, before = timed
        old = {self._key(c): c for c in before}
        if len(old) != len(cands) or any(self._key(c) not in old for c in cands):
            return False
        o = self.original
        o.timing, o.measured_ms, o.wall_ms = orig.timing, orig.measured_ms, orig.wall_ms
        for c in cands:
            t = old[self._key(c)]
            c.timing, c.measured_ms, c.wall_ms, c.status = t.timing, t.measured_ms, t.wall_ms, t.status
        return True

    def fastest(self) -> Candidate | None:
        """The usable candidate measured fastest against the input model (``_gain``; None before :meth:`choose`,
        or without candidates)."""
        timed = [c for c in self.usable() if c.measured_ms is not None]
        return max(timed, key=self._gain, default=None)

    def paired(self, c: Candidate) -> tuple[float | None, float | None]:
        """The input model's and ``c``'s medians (ms), by the figure the guard compares, over the runs the two made
        in the same minutes (``paired_ms``: a candidate the race left out of the second session is ranked on the
        first, not against the input model's runs of other minutes); their overall medians where a timing is
        missing. What a report says of ``c`` against the input model: the overall medians of runs in other
        minutes can disagree with the comparison made (BERT-base's recalled one: 101.4 against 76.8 ms overall,
        1.016x faster paired)."""
        o = self.original
        if o is not None and o.timing is not None and c.timing is not None:
            return paired_ms(o.timing, c.timing, self.backend.metric(self.threads))
        return (o.measured_ms if o is not None else None), c.measured_ms

    def _gain(self, c: Candidate) -> float:
        """How many times faster ``c`` ran than the input model over the runs they made in the same minutes
        (``paired``); 0 where a figure is missing."""
        a, b = self.paired(c)
        return a / b if a and b else 0.0
