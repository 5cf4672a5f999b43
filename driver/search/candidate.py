"""One graph of the measured choice (:class:`Candidate`: its row of the report) and the statuses a candidate ends
in that more than one step of the choice sets or reads (``relsat.driver.search.candidates``, ``choice``,
``recall``)."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from relsat.driver.boundary.latency import Latency
from relsat.driver.boundary.verify import VerifyResult

NOT_HELD = "not faster when timed again"  # the status of a candidate its second timing kept out (``Choice._confirmed``)
CLOSE_MISS = NOT_HELD + ", close"  # ... where that timing was a close miss
SIMPLIFIED = "simplified"  # the status of a candidate written for doing less, not faster beyond noise (``_simplified``)
SLOWER_SIMPLIFIED = "runs fewer kernels, but was slower when timed again"  # ... of one its second timing kept out


@dataclass
class Candidate:
    """One graph the search considered (``as_dict()`` is its row of the report)."""

    label: str  # original | original, simplified | one-node | round N | fewest nodes | next-best N
    choice: dict[int, int]  # e-class -> e-node id
    predicted_ms: float  # predicted latency when it was chosen (before it was profiled or timed)
    model: onnx.ModelProto | None = None
    profiled_ms: float | None = None  # its whole-graph latency in the profiling session
    measured_ms: float | None = None  # median in the final interleaved timing (the guard's metric)
    wall_ms: float | None = None
    timing: Latency | None = None
    status: str = "candidate"  # candidate | timed | written | simplified | slower | not verified: ... | ...
    nodes: int = 0
    profile_key: str | None = None  # the cost cache key of its whole-graph profile
    profile_source: str | None = None  # cache | measured | re-taken (None: not profiled)
    confirm: dict | None = None  # the second timing against the input model of the candidate picked
    blob: object = None  # the graph as its profile made it runnable (bytes or a ``runtime.Runnable``; node names aside)
    digests: dict | None = None  # its weights' digests, as the export hashed them (``export_graph``)
    loaded: bool = False  # an unprofiled graph loaded in ONNX Runtime this run (``Search._ready``)
    weights: dict | None = None  # its weights' arrays while the model holds them as shells (``Search._fill``): runs
    # take them as they are (``Search._blobs``), and only the graph written is filled
    graph_key: str | None = None  # its profile's cache key, or the key it would have (a cached comparison names it)
    verified: VerifyResult | None = None  # its verification in this choice (``Search._verify``: made once)

    def as_dict(self) -> dict:
        return {"label": self.label, "predicted_ms": self.predicted_ms, "profiled_ms": self.profiled_ms,
                "measured_ms": self.measured_ms, "wall_ms": self.wall_ms, "status": self.status, "nodes": self.nodes,
                "profile": self.profile_source, "confirm": self.confirm, "graph_key": self.graph_key}
