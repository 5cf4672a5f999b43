"""A measured choice recalled (:class:`Recall`, a part of ``relsat.driver.search.candidates.Search``): a later run
that reaches the same input model and candidate graphs (``relsat.driver.search.comparisons``: stored by
``Choice._choose`` under ``_comparison_key``) does not time the candidates that lost again.

One the comparison wrote is timed again against the input model and verified, and written only when it is faster
now, else the input model is kept (``_recall``); one written for doing less is written again where it is not slower
now. One that kept the input model over a candidate whose second timing was a close miss (faster beyond the
threshold by the medians, not in every block) times that candidate again, in at most ``REOPENED_MOST`` later runs
(``_chance_in``). A profile found stale and not held by its re-measure (``relsat.driver.search.fidelity``), or a
failed verification, recalls nothing: then everything is timed.

What of ``Search`` this uses: its candidates (``usable()``, ``original``), ``cache``, ``feeds``, ``backend``,
``threads``, ``simplify``, and the steps of the choice (``Choice``: ``_time``, ``_confirmed``, ``_not_slower``,
``_simplified``, ``_verify``, ``_does_less``, ``_blobs``) and of the check (``ProfileChecks``).
"""

from __future__ import annotations

import onnx

from relsat.driver.boundary.latency import gain, judge, judged_ms, second_chance
from relsat.driver.search import comparisons
from relsat.driver.search.candidate import CLOSE_MISS, NOT_HELD, SIMPLIFIED, Candidate
from relsat.extract.context import graph_key
from relsat.extract.profile import timing_kind
from relsat.relations import runtime

REOPENED_MOST = 2  # later runs that time again a candidate whose second timing was a close miss (``Recall._chance_in``)


class Recall:
    """The stored comparison of the same graphs looked up, checked and recalled (module docstring)."""

    def _comparison_key(self, input_model: onnx.ModelProto, cands: list[Candidate], bindings, threshold) -> str:
        """The key of the comparison of the input model with ``cands``: each candidate named by its profile's
        cache key, or for one that was not profiled (next-best graphs) the key its profile would have."""
        if self._input_sha256 is None or self._input_sha256[0] is not input_model:  # hashed once a choice
            self._input_sha256 = (input_model, comparisons.input_sha256(runtime.serialized_already(input_model),
                                                                        input_model))
        return comparisons.comparison_key(self._input_sha256[1], [self._name(c) for c in cands],
                                          timing_kind(self.backend), self.threads, threshold, bindings[0],
                                          simplify=self.simplify)

    def _name(self, c: Candidate) -> str:
        """``c.graph_key``, set once: its profile's cache key, or the key its profile would have."""
        if c.graph_key is None:
            c.graph_key = c.profile_key or graph_key(c.model, self.feeds, backend=self.backend,
                                                     threads=self.threads, digests=c.digests)
        return c.graph_key

    def _recall(self, input_model: onnx.ModelProto, bindings, threshold: float, input_sets, status) -> tuple | None:
        """The choice a cached comparison of the same input model and candidate graphs made
        (``relsat.driver.search.comparisons``) as ``_choose`` returns it, or None: then everything is timed.

        One that kept the input model: the input model is timed alone and the original's cached profile checked
        against it; a stale one (the check's rules, the original's row alone) recalls nothing. One that wrote a
        candidate: that candidate and the input model are timed again by themselves (``_confirmed``, the
        confirmation every written model gets), the original's profile and the candidate's checked against those
        timings, and the candidate verified; it is written only if all of that holds now, so a model is still
        written on a fresh timing (the other candidates', which lost, come from the row). When that candidate is
        not faster beyond the noise now, the input model is kept and nothing else is timed: the others were slower
        than it in the stored comparison, and timing them all again cost ViT-B/16's warm runs 57-102 s for a choice
        that the noise of one timing decided; the row stays, so the next run confirms that candidate afresh. Unless
        it does less (``_simplified``, as ``_choose`` goes on after ``_pick``): then it is timed once more and
        written simplified where it is not slower (Silero VAD 16k's graph, 37 kernels fewer, written by the run
        that made the comparison, was not faster beyond the noise when the corpus run recalled it, and the input
        model was written: ``fell_back`` in the found comparison). One
        that kept the input model while its fastest candidate was faster by the medians but not in every block
        (stored before ``_pick`` gave such a candidate its second timing) gives it that timing now, as if the
        comparison had written it, and the row is stored again with what that timing gave, so that it is not given
        again. A stale profile (one that its own measurement, ``_remeasure``, does not hold either) or a failed
        verification recalls nothing. One that wrote a simplified graph (``SIMPLIFIED``, ``_simplified``) times it
        again as that choice did (``_not_slower``) and writes it, verified, where it is not slower now. Recalled, the
        candidates carry the stored timings and statuses, the report the guard's (``recalled``: when the comparison
        was measured)."""
        cands = self.usable()
        self._found_comparison = None
        if self.cache is None:
            return None
        key = self._comparison_key(input_model, cands, bindings, threshold)
        record = comparisons.recall(self.cache, key)
        rows = self._paired(record, cands) if record is not None else None
        if rows is None:
            return None
        record["candidates"] = rows  # (each candidate's row at its place)
        when = record["conditions"].get("measured_at")
        orig = self.original
        written = next((c for c, r in zip(cands, record["candidates"]) if r["status"] == "written"), None)
        simple = None if written is not None else next(
            (c for c, r in zip(cands, record["candidates"]) if r["status"] == SIMPLIFIED), None)
        chance = written is None and simple is None and self._chance_in(record, cands, threshold)
        # a close miss timed again: the row counts it (``REOPENED_MOST``)
        reopen = bool(chance) and self._reopens(record, next(r for c, r in zip(cands, record["candidates"])
                                                             if c is chance))
        if chance:  # its fastest candidate was not given its second timing (``_pick``): given now, as a written one
            written = chance
        written = written or simple
        less = None  # what a simplified one leaves out (``_not_slower``'s timing below)
        fell_back = False  # a written one not faster now, written simplified instead
        if written is None:
            status("timing the input model (the candidates' comparison is cached) ...")
            self._time(input_model, [], bindings, threshold)
            held = True
        else:
            try:
                if simple is not None:  # written for doing less: written again where it is not slower now and
                    # still does less (as the row stored it; read again from the runtime's graphs where it did not)
                    held, timed = self._not_slower(input_model, simple, bindings, threshold, status)
                    orig.timing, written.timing = timed.original, timed.optimized
                    less = (record["guard"] or {}).get("simplified") or self._does_less(input_model, simple)
                    held = held and less is not None
                else:
                    held, orig.timing, written.timing = self._confirmed(input_model, written, bindings, threshold,
                                                                        status)
                    if not held and self.simplify:  # as ``_choose`` after ``_pick``: written simplified if it does
                        # less and is not slower timed again (Silero VAD 16k's graph, 37 kernels fewer, faster when
                        # the comparison was made, not beyond the noise when recalled: the input model was written)
                        simpler = self._simplified(input_model, [written], bindings, threshold, input_sets, status)
                        if simpler is not None:
                            simple, (_, _, timed, less), held, fell_back = written, simpler, True, True
                            orig.timing, written.timing = timed.original, timed.optimized
            except Exception:  # (it loaded and ran when the comparison was made): time everything, ``_choose``
                self._missed(written)
                return None
            for c in (orig, written):
                c.measured_ms, c.wall_ms = judged_ms(c.timing, self.threads, self.backend), c.timing.median_ms
        checks = self.check()
        stale = [r for r in checks if r["stale"] and r["profile"] == "cache"]
        # as in ``_choose``: a row that a fresh measurement of its own kind confirms is not stale, the timing moved
        # (ViT-B/16's warm run: the input model 1.33x its profile in the confirmation, 87 s of choice timing all
        # candidates again for a profile that held)
        again = self._remeasure(stale, status) if stale else []
        self._restate_held(again)
        stale = [r for r in stale if r["key"] not in {h["key"] for h in again if h["held"]}]
        self._found_comparison = {"key": key, "measured_at": when, "checked": checks, "recalled": not stale,
                                  **({"remeasured": again} if again else {}),
                                  **({"written": written.label, "held": held} if written is not None else {}),
                                  **({"simplified": True} if simple is not None else {}),
                                  **({"fell_back": True} if fell_back else {}),
                                  **({"second_chance": True} if chance else {}),
                                  **({"reopened": record.get("reopened", 0) + 1} if reopen else {})}
        if stale:  # the prices may be poisoned: time everything (``_choose``)
            self._missed(written)
            return None
        check = None
        if written is not None and held:
            check = self._verify(input_model, written, bindings, input_sets, status)  # (once: ``_simplified`` may have)
            if not check.ok:
                self._found_comparison.update(recalled=False, verified=check.message)
                self._missed(written)
                return None
        self._drift = 0.0
        self.fidelity = self._fidelity(checks, timings_of_input_ms=[orig.measured_ms], comparison_recalled=when,
                                       remeasured=again)
        if written is None:  # the stored timings from here: the candidates were timed against that one
            orig.timing = record["original"]
            orig.measured_ms, orig.wall_ms = judged_ms(orig.timing, self.threads, self.backend), orig.timing.median_ms
        for c, r in zip(cands, record["candidates"]):
            if c is written:
                if held:  # (the report's notice says how: timed again now, the others cached)
                    c.status = SIMPLIFIED if c is simple else "written"
                continue
            if r["status"].startswith("cannot load"):  # dropped by the choice that made the comparison
                c.model = None
            c.timing = r["timing"]
            if c.timing is not None:
                c.measured_ms, c.wall_ms = judged_ms(c.timing, self.threads, self.backend), c.timing.median_ms
            c.status = f"{r['status']} (the comparison of {when}, cached)"
        if written is None:
            return None, None, {**(record["guard"] or {}), "recalled": when}
        guard = judge(orig.timing, written.timing, threads=self.threads, backend=self.backend, threshold=threshold)
        # (the last timing ``_confirmed`` judged: ``guard.keep_optimized`` is ``held``; not held, its status says so)
        if simple is not None:  # written for doing less: kept where not slower (``_not_slower``)
            guard.keep_optimized = held
        if chance:  # the row says what its second timing gave: a later run recalls it as written, or not again
            comparisons.remember(
                self.cache, key, timing_kind(self.backend), self.threads, record["original"],
                [(c.label, r["timing"], (written.status if not held or fell_back else "written") if c is written
                 else r["status"], self._name(c))
                 for c, r in zip(cands, record["candidates"])],
                {**guard.as_dict(), **({"simplified": less} if fell_back else {})},  # (as ``_choose`` stores it)
                reopened=record.get("reopened", 0) + reopen)
        report = {**guard.as_dict(), "recalled": when, **({"simplified": less} if simple is not None and held else {})}
        if not held:
            return None, None, report
        return written, check, report

    def _paired(self, record: dict, cands: list[Candidate]) -> list[dict] | None:
        """The stored comparison's candidate rows, one per candidate of ``cands`` in their order, paired by the graph
        each names (``graph``: its key in the comparison's key, ``_name``); None where they are not the same graphs.
        The comparison's key names the graphs order aside, and a search whose prices moved can find the same graphs
        in other rounds: paired by their labels in order (as before rows named their graphs, and still for such a
        row), a recall gave one graph the timing and the verdict of another (a test's recalled run, once: its round
        1 carried the stored round 2's timing)."""
        rows = record["candidates"]
        if len(rows) != len(cands):
            return None
        if not all(r.get("graph") for r in rows):  # stored before the rows named their graphs: by the labels
            return rows if [r["label"] for r in rows] == [c.label for c in cands] else None
        by = {r["graph"]: r for r in rows}
        names = [self._name(c) for c in cands]
        if len(by) != len(rows) or set(by) != set(names):
            return None
        return [by[n] for n in names]

    def _chance_in(self, record: dict, cands: list[Candidate], threshold: float) -> Candidate | None:
        """The candidate of a recalled comparison that kept the input model which ``_pick`` now gives a second
        timing: the fastest of its timings, faster beyond the threshold by the medians but not in every block, or
        one that ``judge`` keeps now (stored before the medians were the blocks': BERT-base's candidate, faster in
        every block by 3.7-6.3 %, was kept out at "0.766x" by overall medians and called slower), and either never
        timed a second time (its status is the first timing's) or a close miss in its last second timing
        (``CLOSE_MISS``) that fewer than ``REOPENED_MOST`` recalls have timed again (``reopened`` in the row).
        Whisper-tiny at 2 threads: its graph, 1.06-1.10x the input model's speed whenever every candidate was
        timed afresh, missed one block of its second timing in one run (130.2 vs 140.6 ms by the medians), and
        every later run recalled that verdict and wrote the input model, while onnxslim's output ran 1.076x.
        None otherwise."""
        timed = [(c, r) for c, r in zip(cands, record["candidates"]) if r["timing"] is not None and c.model is not None]
        if not timed:
            return None
        metric = self.backend.metric(self.threads)
        c, r = max(timed, key=lambda x: gain(record["original"], x[1]["timing"], metric))  # (as ``_gain``, stored)
        held = judge(record["original"], r["timing"], threads=self.threads, backend=self.backend, threshold=threshold)
        judged = r["status"] in ("not faster beyond noise", "slower")  # (not timed again, not failed to load)
        return c if (judged or self._reopens(record, r)) and (held.keep_optimized or second_chance(held)) else None

    @staticmethod
    def _reopens(record: dict, row: dict) -> bool:
        """Whether a recall times the candidate of ``row`` again after its second timing: a close miss there
        (``CLOSE_MISS``) while fewer than ``REOPENED_MOST`` recalls have, or any candidate timed again in a row
        stored before close misses were told apart (no ``reopened`` in it), once."""
        if row["status"].startswith(CLOSE_MISS):
            return record.get("reopened", 0) < REOPENED_MOST
        return row["status"].startswith(NOT_HELD) and "reopened" not in record

    @staticmethod
    def _missed(written: Candidate | None) -> None:
        """A recalled comparison's written candidate as it was before the recall (its confirmation undone)."""
        if written is not None:
            written.confirm, written.status, written.timing, written.measured_ms = None, "candidate", None, None
