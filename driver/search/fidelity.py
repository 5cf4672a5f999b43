"""Step 4's check of the whole-graph profiles the prices came from, against the fresh timing of their graphs
(:class:`ProfileChecks`, a part of ``relsat.driver.search.candidates.Search``).

Every whole-graph profile used so far, from the cost cache or taken in this run, is checked against the fresh
timing of its graph (the original's against the input model's): it agrees within the noise (``FIDELITY_FLOOR``, or
the fresh runs' interquartile range or their block medians' range over the median where wider: ``_agreement``) on
either side, and one that does not is stale when its ratio to the timing is also off the other profiles' ratio
(their median) by more than that noise, or off by more than ``GROSS_DRIFT`` (:meth:`ProfileChecks.check`). Cached
profiles taken while other jobs shared the machine predicted squeezenet at 5.7x and Inception-v3 at 2.3x their
latency in every later run; a speed the machine took since moves every profile alike and changes no price's
proportion to another, so no choice of the ILP.

A cached one that is stale is first measured again as it was taken (a session, runs back to back,
``REMEASURE_BURSTS`` times: ``_remeasure``); when those bursts' range, widened by the noise, holds the row, the row
holds (the timing moved, not the profile) and nothing is searched again; a held row off the timing beyond the floor
whose re-measure lies within it is restated as measured now (``_restate_held``). A stale row that is not held makes
the search run again on re-taken profiles (``Search._retake``, from ``Choice._choose``). Only cached rows can be
stale: a profile taken in this run that disagrees is the noise of the machine between it and the timing, and stands
for this run; where it is stale by the same rule (off the other rows too, or grossly) it is measured again, and where
that contradicts it too its cached latency is restated as measured now (``_restate``), so that the next run does not
find it stale and search twice. ``Search.fidelity``
(``_fidelity``) reports the prediction of the original against its measured latency, what was stale and what was
re-taken.

What of ``Search`` this uses: ``original``, ``usable()``, ``predicted()``, ``cache``, ``feeds``, ``backend``,
``threads``, ``fidelity_floor``, ``_drift``, the profile counts, ``_found_comparison`` and ``_blobs()``.
"""

from __future__ import annotations

import math

import numpy as np

from relsat.driver.boundary.latency import Latency, judged_ms, relative_range
from relsat.extract.context import graph_latency, restate_latency

FIDELITY_FLOOR = 0.10  # a profile is stale when its latency and the fresh timing differ by more than this
# (or more than the fresh timing's spread, where that is larger), on either side
GROSS_DRIFT = 0.5  # a cached profile off its fresh timing by more than this, alone or with every other, is stale
# (a row taken while other jobs shared the machine: squeezenet 5.7x, Inception-v3 2.3x); within it, only a row off
# the others' ratio is (``ProfileChecks.check``): this machine's speed moved 1.27x within minutes (ViT-B/16's input
# model 158 -> 200 ms) and moves every row alike
REMEASURE_BURSTS = 3  # a disagreeing cached profile is measured again this many times (``ProfileChecks._remeasure``)


class ProfileChecks:
    """The profiles checked against the fresh timings, measured again, restated, and reported (module docstring)."""

    def _agreement(self, profiled_ms: float, timing: Latency) -> dict:
        """A profile's latency against the fresh timing of its graph: the ratio, the tolerance and whether
        they agree. The tolerance is the noise: the floor, or where larger the fresh runs' interquartile range
        over their median, or how far the timing's own block medians lie apart over their median (ViT-B/16's
        moved 16-31 % within one timing here: a profile inside that range cannot be told off it), widened after
        a re-take by how far the input model's two fresh timings moved apart (this machine, shared, swung
        between 0.13 and 0.22 ms on small SqueezeNet within seconds)."""
        measured = judged_ms(timing, self.threads, self.backend)
        spread = max((timing.q3_ms - timing.q1_ms) / timing.median_ms if timing.median_ms > 0 else 0.0,
                     relative_range(timing.blocks(self.backend.metric(self.threads))))
        tolerance = (1 + max(self.fidelity_floor, spread)) * (1 + self._drift) - 1
        ratio = profiled_ms / measured if measured > 0 else math.inf
        return {"profiled_ms": profiled_ms, "measured_ms": measured, "ratio": ratio, "spread": spread,
                "drift": self._drift, "tolerance": tolerance, "agrees": 1 / (1 + tolerance) <= ratio <= 1 + tolerance}

    def check(self) -> list[dict]:
        """Step 4's check: every profiled graph with a fresh timing, one row per profile (cache key). The
        original's profile is checked against the timing of the same exported graph where it is a
        candidate ("original, simplified"), else against the input model's.

        Each row says whether its profile ``agrees`` with the fresh timing (within the noise) and whether it is
        ``stale``: it does not, and its ratio is off the other rows' (their median) beyond the same noise, or off
        by more than ``GROSS_DRIFT`` (the only test of a row alone). A speed the machine took since the profiles
        (all of them, or all that came from the cache with nothing measured now) moves every row alike: the
        prices keep their proportions, the ILP makes the same choices, and a second search finds the same
        candidates."""
        o = self.original
        rows, seen = [], set()
        same = next((c for c in self.usable() if c.model is o.model and c.timing is not None), None)
        graphs = [(o, (same or o).timing)] + [(c, c.timing) for c in self.usable()]
        for c, timing in graphs:
            if c.profile_key is None or c.profiled_ms is None or timing is None or c.profile_key in seen:
                continue
            seen.add(c.profile_key)
            rows.append({"label": c.label, "key": c.profile_key, "profile": c.profile_source,
                         **self._agreement(c.profiled_ms, timing)})
        for i, r in enumerate(rows):
            others = [x["ratio"] for j, x in enumerate(rows) if j != i and math.isfinite(x["ratio"]) and x["ratio"] > 0]
            common = float(np.median(others)) if others else r["ratio"]  # alone: only a gross drift tells
            relative = r["ratio"] / common if common > 0 else math.inf
            gross = not 1 / (1 + GROSS_DRIFT) <= r["ratio"] <= 1 + GROSS_DRIFT
            r.update(others_ratio=common, relative=relative, stale=not r["agrees"] and (
                gross or not 1 / (1 + r["tolerance"]) <= relative <= 1 + r["tolerance"]))
        return rows

    def _remeasure(self, rows: list[dict], status) -> list[dict]:
        """Each row of ``rows`` (cached profiles the check found off the fresh timing) measured again, as its
        profile measured it (``graph_latency``: a session, warm-up, runs back to back), in ``REMEASURE_BURSTS``
        bursts taken in turn over the rows; ``held`` where the cached latency lies within the bursts' range
        widened by the noise (the floor, or where larger the bursts' runs' spread): then the row is not stale,
        the timing moved, and a second search on a re-taken row would price from one more draw of the same
        noise. One burst was the test before, and this machine's speed moves more from one burst to the next
        than within one (ConvNeXt V2-T alone on a quiet machine, 33 bursts of 5 runs in a minute: 175-233 ms,
        the runs of one burst 1-8 % apart), so a single burst called rows stale that a second burst would
        have matched, and each cost a second search (40-150 s of a warm run)."""
        graphs, self._kept = [], None  # (sessions kept for a verification: not alive beside these measurements)
        for r in rows:
            c = next((x for x in [self.original, *self.usable()] if x is not None and x.profile_key == r["key"]
                      and x.model is not None), None)
            if c is not None:
                graphs.append((r, c, []))
        if graphs:
            status(f"measuring {len(graphs)} graph(s) again to check their cached profiles ...")
        blobs = self._blobs([c.model for _, c, _ in graphs])
        for _ in range(REMEASURE_BURSTS):
            for (r, c, bursts), blob in zip(graphs, blobs):
                try:
                    bursts.append(graph_latency(blob, self.feeds, backend=self.backend, threads=self.threads))
                except Exception:  # (it ran when it was profiled and timed; a failure here decides nothing)
                    continue
        again = []
        for r, c, bursts in graphs:
            valid = sorted((b for b in bursts if b[0] > 0), key=lambda b: b[0])
            if not valid:
                continue
            medians = [b[0] for b in bursts if b[0] > 0]
            ms, q1, q3, runs = valid[(len(valid) - 1) // 2]  # the middle burst (the median of an odd count)
            spread = max([(hi - lo) / m for m, lo, hi, _ in valid], default=0.0)
            tolerance = max(self.fidelity_floor, spread)
            low, high = min(medians) / (1 + tolerance), max(medians) * (1 + tolerance)
            again.append({"label": r["label"], "key": r["key"], "cached_ms": r["profiled_ms"], "fresh_ms": ms,
                          "bursts_ms": medians, "quartiles_ms": [q1, q3], "runs": runs,
                          "range_ms": [low, high], "ratio": r["profiled_ms"] / ms,
                          "tolerance": tolerance, "timed_ms": r["measured_ms"],
                          "held": low <= r["profiled_ms"] <= high})
        return again

    def _restate_held(self, again: list[dict]) -> None:
        """Cached rows that their re-measure (``_remeasure``) held only by the width of its band: off this run's
        timing by more than the floor, while the re-measure's middle burst lies within the floor of it. Each is
        restated as measured now (``restate_latency``, ``restated`` in its entry), without a second search: the
        band (the bursts' range widened by the noise) held DistilHuBERT's original at 1 thread, cached at 9.91 ms,
        against bursts of 8.75-10.74 (middle 9.60) and a timing of 8.99 ms, and every later run priced it 1.10-1.34x
        its latency. A re-measure as far from the timing as the row (a timing the machine slowed) changes nothing."""
        if self.cache is None:
            return
        for h in again:
            if not h["held"] or not h["timed_ms"] or h["fresh_ms"] <= 0:
                continue
            off = lambda ms: abs(math.log(ms / h["timed_ms"]))
            if off(h["fresh_ms"]) <= math.log1p(self.fidelity_floor) < off(h["cached_ms"]):
                h["restated"] = self._restate_as_measured(h)

    def _restate_as_measured(self, h: dict) -> bool:
        """Row ``h["key"]``'s cached latency restated as its re-measure (``_remeasure``'s entry ``h``) found it."""
        return restate_latency(self.cache, h["key"], h["fresh_ms"], h["bursts_ms"], quartiles_ms=h["quartiles_ms"],
                               runs=h["runs"], backend=self.backend, threads=self.threads)

    def _restate(self, checks: list[dict], status) -> list[dict]:
        """The profiles this run took that the check calls stale (off the fresh timing and off the other rows'
        ratio, or grossly: the rule a later run applies to them as cached rows), measured again (``_remeasure``);
        where that does not hold the profile either, its cached latency is restated as the new measurement
        (``relsat.extract.context.restate_latency``), so that the next run does not find it stale and search
        twice. This run's prices stand (its candidates are timed). Returns the re-measures, ``restated`` marking
        the rows changed.

        A row off the timing only as far as the others are (the machine's speed moved between the profiles and the
        timing) is left as it was: a later run does not find it stale, and restating some of the rows this run took
        and not others moved their prices apart, so the next search found another candidate set and recalled
        nothing (ViT-B/16's round-1 graph at 0.877 of its timing beside the original's 0.856, ConvNeXt-T's two
        rounds at 1.256 and 1.244: each restated, and each warm run after timed every candidate again, 46 s of
        ViT-B/16's 58; the rows restated so were off the other way in the next run, 1.10 and 0.80)."""
        own = [r for r in checks if r["stale"] and r["profile"] != "cache"]
        if not own or self.cache is None:
            return []
        again = self._remeasure(own, status)
        for h in again:
            h["restated"] = not h["held"] and self._restate_as_measured(h)
        return again

    def _original_fidelity(self) -> dict:
        """The in-context prediction of the original (the sum of its e-nodes' costs plus the call overhead)
        and its profile against the input model's fresh timing."""
        o = self.original
        if o is None or o.timing is None:
            return {}
        measured = o.measured_ms
        predicted = self.predicted(o.choice) if o.model is not None else None
        agreement = self._agreement(predicted, o.timing) if predicted is not None else {}
        return {"original_predicted_ms": predicted, "original_profiled_ms": o.profiled_ms,
                "original_measured_ms": measured,
                "original_prediction_ratio": predicted / measured if predicted is not None and measured > 0 else None,
                "original_profile_ratio": o.profiled_ms / measured if o.profiled_ms is not None and measured > 0
                else None,
                "original_tolerance": agreement.get("tolerance"),
                "original_within_tolerance": agreement.get("agrees")}

    def _fidelity(self, checks: list[dict], *, timings_of_input_ms: list, stale=(), searches: int = 1,
                  retaken: int = 0, stale_rows_removed: int = 0, stale_rows_replaced: int = 0, retake_s: float = 0.0,
                  timings_reused: int = 0, remeasured=(), first_pass=None, restated=(),
                  comparison_recalled=None) -> dict:
        """Step 4's report (``Search.fidelity``): the original's prediction against its fresh timing, the
        checks, what was stale, re-taken, re-measured, restated, and the cached comparison found or recalled."""
        return {**self._original_fidelity(), "metric": self.backend.metric(self.threads),
                "floor": self.fidelity_floor, "timing_drift": self._drift, "timings_of_input_ms": timings_of_input_ms,
                "checked": checks, "stale": list(stale), "searches": searches,
                "profiles_measured": self.profiles_measured, "profiles_from_cache": self.profiles_cached,
                "retaken": retaken, "stale_rows_removed": stale_rows_removed,
                "stale_rows_replaced": stale_rows_replaced, "retake_s": retake_s, "timings_reused": timings_reused,
                "remeasured": list(remeasured), "confirmed": [h for h in remeasured if h["held"]],
                "first_pass": first_pass, "comparison_recalled": comparison_recalled,
                "comparison_found": self._found_comparison, "restated": list(restated)}
