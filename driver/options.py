"""The options of one optimization, declared once: ``Options`` (frozen) and its defaults.

``relsat optimize`` and ``relsat batch`` take their flag defaults from ``DEFAULTS`` (but
``relsat batch`` shares the cores among its workers when ``--threads`` is not given);
``optimize(model, options, **overrides)`` takes an ``Options`` (or keyword overrides of
it); ``relsat batch`` records, hashes and ships it to its workers as ``as_dict()``; the
saturation runner's ``Limits`` default to the same values; the benchmarks start from
``DEFAULTS``.  ``check()`` is the one validation of the values, with one-line errors named
after the command-line flags (limits that mean nothing, such as ``--memory-limit 0`` or ``-5GB``
and ``--input-shape x=0,64``, refused before any work: ``check_memory_limit``, ``parse_shapes``).  The thread count defaults to every core this process may use
(:func:`all_cores`), as ONNX Runtime's own default does.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from .errors import RelsatError

COST_MODELS = ("measured", "analytic")
PROVIDERS = ("cpu", "cuda")
EXTRACTORS = ("ilp", "greedy")
SEARCHES = ("eqsat", "mcts", "backtrack")  # how the e-graph is built (relsat.driver.search)
SCHEDULERS = ("backoff", "simple")  # relsat.driver.runner's schedulers
GUARD_THRESHOLD = 0.03  # the latency guard keeps the optimized graph only when faster by more than this


def all_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one, else the
    machine's): the default of ``Options.threads``."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Options:
    """What ``optimize`` does with a model (paths to write and callbacks are not options)."""

    rules: tuple[str, ...] = ("default",)  # shipped set names or rule files
    input_shapes: dict | None = field(default=None, hash=False)  # {input name: dims}: the sizes costed at
    fix_shapes: bool = False  # freeze the written model's dynamic dims to input_shapes (else they stay dynamic)
    inputs: tuple[str, ...] = ()  # .npz files of verification inputs, one set each (beside the random draws)
    iter_limit: int = 30  # saturation rounds (egg's default)
    node_limit: int = 2000  # e-nodes
    time_limit: float = 60.0  # saturation seconds
    multi_rounds: int = 2  # rounds in which multi-pattern rules run (2: a rewrite in round 1, e.g. a 1x1 conv
    # enlarged to 3x3, can enable a merge in round 2, since a round matches only the rows of earlier rounds)
    memory_limit: str | None = None  # the e-graph database's memory limit ('16GB'); beyond it DuckDB spills
    temp_dir: str | None = None  # where it spills (default: DuckDB's, beside a --db file)
    scheduler: str = "backoff"  # backoff (egg's: bans rules with many matches, fast-forwarded) | simple
    search: str = "eqsat"  # eqsat | mcts | backtrack: how the e-graph is built (time_limit bounds each)
    budget: int | None = None  # mcts: tree iterations; backtrack: graphs expanded (None: the strategy's default)
    seed: int = 0  # mcts: its random choices
    alpha: float = 1.05  # backtrack: graphs costlier than alpha x the best are dropped (TASO's default)
    extractor: str = "ilp"  # ilp | greedy
    ilp_time_limit: float = 30.0
    mip_gap: float = 1e-4
    cost_model: str = "measured"  # measured | analytic
    provider: str = "cpu"  # cpu | cuda
    threads: int = field(default_factory=all_cores)  # intra-op threads for profiling and latency
    costs: str | None = None  # a cost table (relsat costs export) imported into the cache first
    measure: bool = True  # time the original and the optimized model (the latency guard)
    guard_threshold: float = GUARD_THRESHOLD
    check_rules: bool = True  # verify user rule files on random tensors before use
    candidates: int = 3  # candidate graphs timed as whole models for the final choice (0: one-node costs only)
    context_rounds: int = 2  # extract-profile rounds refining the in-context costs

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules or ()))
        object.__setattr__(self, "inputs", tuple(str(p) for p in (self.inputs or ())))
        if self.costs is not None:
            object.__setattr__(self, "costs", str(self.costs))
        if self.temp_dir is not None:
            object.__setattr__(self, "temp_dir", str(self.temp_dir))
        if self.input_shapes is not None:
            object.__setattr__(self, "input_shapes", {k: [int(d) for d in v] for k, v in self.input_shapes.items()}
                               or None)

    def replace(self, **changes) -> Options:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown optimize option(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def check(self) -> Options:
        """RelsatError (one line, named after the flag) for a value ``optimize`` cannot use."""
        if self.cost_model not in COST_MODELS:
            raise RelsatError(f"--cost-model {self.cost_model}: expected measured or analytic")
        if self.provider not in PROVIDERS:
            raise RelsatError(f"--provider {self.provider}: expected cpu or cuda")
        if self.memory_limit is not None:
            check_memory_limit(self.memory_limit)
        if self.input_shapes:
            parse_shapes([f"{k}={','.join(str(d) for d in v)}" for k, v in self.input_shapes.items()])
        if self.temp_dir is not None and not Path(self.temp_dir).parent.is_dir():
            raise RelsatError(f"--temp-dir {self.temp_dir}: its parent folder does not exist")
        if self.temp_dir is not None and Path(self.temp_dir).exists() and not Path(self.temp_dir).is_dir():
            raise RelsatError(f"--temp-dir {self.temp_dir}: not a folder")
        if self.scheduler not in SCHEDULERS:
            raise RelsatError(f"--scheduler {self.scheduler}: expected one of {', '.join(SCHEDULERS)}")
        if self.search not in SEARCHES:
            raise RelsatError(f"--search {self.search}: expected one of {', '.join(SEARCHES)}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise RelsatError(f"--budget {self.budget}: expected a whole number >= 1")
        if not isinstance(self.seed, int):
            raise RelsatError(f"--seed {self.seed}: expected a whole number")
        if not self.alpha >= 1.0:
            raise RelsatError(f"--alpha {self.alpha}: expected a factor >= 1 (1 is greedy)")
        if self.extractor not in EXTRACTORS:
            raise RelsatError(f"--extractor {self.extractor}: expected ilp or greedy")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise RelsatError(f"--threads {self.threads}: expected a whole number >= 1")
        for flag, value in (("--candidates", self.candidates), ("--context-rounds", self.context_rounds)):
            if not isinstance(value, int) or value < 0:
                raise RelsatError(f"{flag} {value}: expected a whole number >= 0")
        if not 0 <= self.mip_gap < 1:
            raise RelsatError(f"--mip-gap {self.mip_gap}: expected a relative gap in [0, 1)")
        if not self.ilp_time_limit > 0:
            raise RelsatError(f"--ilp-time-limit {self.ilp_time_limit}: expected seconds > 0")
        for flag, value in (("--iter-limit", self.iter_limit), ("--node-limit", self.node_limit)):
            if not isinstance(value, int) or value < 0:
                raise RelsatError(f"{flag} {value}: expected a whole number >= 0")
        if not self.time_limit > 0:
            raise RelsatError(f"--time-limit {self.time_limit}: expected seconds > 0")
        for p in self.inputs:
            if not Path(p).is_file():
                raise RelsatError(f"--inputs {p}: no such file")
        if self.costs is not None and not Path(self.costs).is_file():
            raise RelsatError(f"--costs {self.costs}: no such cost table file")
        return self


DEFAULTS = Options()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib|%)?\s*$", re.IGNORECASE)


def check_memory_limit(value) -> None:
    """RelsatError (one line) unless ``value`` is a memory size DuckDB can run in: a number > 0 with a unit
    (``16GB``, ``512MiB``) or a percentage of the memory (``50%``). DuckDB itself reads a negative size as
    no limit and a bare number not at all."""
    text = str(value)
    m = _SIZE.match(text)
    if m is None or m.group(2) is None:
        raise RelsatError(f"--memory-limit {text}: expected a size above 0 with a unit, such as 16GB or 512MB "
                          "(or a percentage of the memory, such as 50%)")
    number = float(m.group(1))
    if number <= 0 or (m.group(2) == "%" and number > 100):
        raise RelsatError(f"--memory-limit {text}: expected a size above 0 (such as 16GB), or a percentage in (0, 100]")
    try:
        duckdb.connect(config={"memory_limit": text}).close()
    except duckdb.Error as e:
        first = " ".join(str(e).split("\n")[0].split())
        raise RelsatError(f"--memory-limit {text}: too small for the e-graph database to start ({first}); "
                          "give it more, such as 1GB") from None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def parse_shapes(specs: list[str]) -> dict[str, list[int]]:
    """``--input-shape NAME=D0,D1,...`` values as {name: dims}: every dim a whole number >= 1, and the
    tensor small enough to fit in this machine's memory at one byte an element (an input costs, timings
    and verification must allocate)."""
    shapes = {}
    memory = _memory_bytes()
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise RelsatError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with integer dims") from None
        bad = [d for d in shapes[name] if d < 1]
        if bad:
            raise RelsatError(f"--input-shape {spec}: dim {bad[0]} is not a size; every dim must be 1 or more")
        elements = 1
        for d in shapes[name]:
            elements *= d
        if memory is not None and elements > memory:
            raise RelsatError(f"--input-shape {spec}: {elements:.3g} elements do not fit in this machine's memory "
                              f"({memory / 2**30:.0f} GiB); give the sizes the model is meant to run at")
    return shapes
