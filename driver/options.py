"""The options of one optimization, declared once: ``Options`` (frozen), its defaults and its flags.

Each field that ``relsat optimize`` takes on the command line carries its flag as metadata
(:class:`Flag`: the flag's name, the type it reads, its help and its choices), so that the
name, default and help of a flag are written once, here: the CLI (:mod:`relsat.driver.app.cli`)
generates the options of ``relsat optimize`` and ``relsat batch`` from :func:`command_flags`
(``relsat batch`` has every flag but ``--inputs``, and shares the cores among its workers when
``--threads`` is not given), their defaults are ``DEFAULTS``'s values, and ``check()`` names
the flags in its errors through :func:`flag_name`.  Fields without a flag (``multi_rounds``,
``guard_threshold``, ``check_rules``) are Python API only.

``optimize(model, options, **overrides)`` takes an ``Options`` (or keyword overrides of it);
``relsat batch`` records, hashes and ships it to its workers as ``as_dict()``; the saturation
runner's ``Limits`` default to the same values; the benchmarks start from ``DEFAULTS``.
``check()`` is the one validation of the values, with one-line errors named after the
command-line flags (limits that mean nothing, such as ``--memory-limit 0`` or ``-5GB`` and
``--input-shape x=0,64``, refused before any work: ``check_memory_limit``, ``parse_shapes``).
The thread count defaults to every core this process may use (:func:`all_cores`), as ONNX
Runtime's own default does.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from relsat.relations.backend import PROVIDERS, Backend, resolve
from relsat.relations.egraph import usable_cpus

from relsat.driver.errors import RelsatError

COST_MODELS = ("measured", "analytic")
EXTRACTORS = ("ilp", "greedy")
SEARCHES = ("eqsat", "mcts", "backtrack")  # how the e-graph is built (relsat.driver.search.result)
SCHEDULERS = ("backoff", "simple")  # relsat.driver.search.runner's schedulers
NODE_LIMIT = 2000  # the default e-node limit: at least this many e-nodes ...
NODE_LIMIT_PER_ENODE = 4  # ... or this many times the imported e-graph's, whichever is more (``Options.node_limit_for``)
SLOW_GROWTH = 0.02  # a round that adds fewer e-nodes than this fraction of the e-graph and merges nothing is slow
GUARD_THRESHOLD = 0.03  # the latency guard keeps the optimized graph only when faster by more than this


def all_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one, else the
    machine's): the default of ``Options.threads``, as for the e-graph's DuckDB threads."""
    return usable_cpus()


_FIELD = object()  # Flag.default: the command line's default is DEFAULTS' value of the field


@dataclass(frozen=True)
class Flag:
    """The command-line flag of an ``Options`` field (its ``metadata["flag"]``; :func:`flag`)."""

    help: str
    name: str = ""  # the flag; default --field-name
    type: Any = None  # the type the command line reads, where not the field's (list[str] for a repeated flag)
    choices: tuple[str, ...] = ()  # the values ``check()`` accepts, listed first in the help
    notes: dict | None = field(default=None, compare=False)  # choice -> what it means, in the help
    parse: Callable | None = None  # the command line's value -> the field's (default: as it is)
    negate: bool = False  # a flag that turns the (boolean) field off: --no-measure
    default: Any = _FIELD  # the command line's default where it is not the field's
    batch: bool | dict = True  # also a flag of relsat batch; a dict: batch's own help, type or default
    attr: str = ""  # the Options field (filled in by command_flags)

    def text(self) -> str:
        """The help: the choices (with their notes) and then the help text."""
        if not self.choices:
            return self.help
        notes = self.notes or {}
        listed = " | ".join(c + (f" ({notes[c]})" if c in notes else "") for c in self.choices)
        return f"{listed}: {self.help}" if self.help else listed

    def read(self, value):
        """The field's value for the command line's ``value``."""
        if self.parse is not None:
            return self.parse(value)
        return not value if self.negate else value


def flag(help: str, **kw) -> dict:
    """A field's metadata declaring its command-line flag: ``field(default=..., metadata=flag(...))``."""
    return {"flag": Flag(help, **kw)}


def _shapes(specs) -> dict | None:
    return parse_shapes(list(specs or ())) or None


@dataclass(frozen=True)
class Options:
    """What ``optimize`` does with a model (paths to write and callbacks are not options): every knob,
    with the default the command-line flag has (module docstring).  Frozen: ``replace(**changes)`` gives a
    changed copy (an unknown name is a TypeError), ``check()`` validates the values (a one-line
    ``RelsatError`` named after the flag), ``as_dict()`` lists them.

    Example::

        from relsat import Options, optimize
        opts = Options(cost_model="analytic", measure=False, node_limit=500)
        opts.replace(search="mcts", budget=16).check().as_dict()["search"]   # 'mcts'
        result = optimize("model.onnx", opts, output="fast.onnx")
    """

    rules: tuple[str, ...] = field(default=("default",), metadata=flag(
        "rule set name or .rules file (repeatable)", type=list[str]))  # shipped set names or rule files
    input_shapes: dict | None = field(default=None, hash=False, metadata=flag(
        "NAME=D0,D1,...: the sizes dynamic dims are costed and timed at (the written model keeps them dynamic "
        "unless --fix-shapes)", name="--input-shape", type=list[str], parse=_shapes))  # {input name: dims}
    fix_shapes: bool = field(default=False, metadata=flag(
        "freeze dynamic dims in the written model (to --input-shape, or 1 for a batch dim)"))
    inputs: tuple[str, ...] = field(default=(), metadata=flag(
        ".npz file of verification inputs, one set per file (repeatable), checked beside the random draws",
        type=list[Path], batch=False))
    iter_limit: int = field(default=30, metadata=flag("saturation rounds"))  # egg's default
    slow_rounds: int = field(default=5, metadata=flag(
        f"stop saturating after this many rounds in a row that each add under {SLOW_GROWTH:.0%} e-nodes, merge "
        "nothing and ban no rule (0: never)"))  # ViT-B/16's gather rules: 1-2 % a round, rounds 4-30, never taken;
    # 5 and 10 wrote the same model for every corpus and zoo model (ViT-B/16, the one that stops this way: 2.2 s of
    # saturation against 5.6 s, the same candidates and written model)
    node_limit: int | None = field(default=None, metadata=flag(
        f"e-nodes (default: {NODE_LIMIT:,} or {NODE_LIMIT_PER_ENODE}x the imported graph's e-nodes, whichever is more)"))
    time_limit: float = field(default=60.0, metadata=flag("saturation (or search) time limit, seconds"))
    multi_rounds: int = 2  # rounds in which multi-pattern rules run (2: a rewrite in round 1, e.g. a 1x1 conv
    # enlarged to 3x3, can enable a merge in round 2, since a round matches only the rows of earlier rounds)
    memory_limit: str | None = field(default=None, metadata=flag(
        "the e-graph database's memory limit, e.g. 16GB; beyond it DuckDB spills to --temp-dir"))
    temp_dir: str | None = field(default=None, metadata=flag(
        "where the e-graph database spills (default: DuckDB's)", type=Path | None))  # beside a --db file
    scheduler: str = field(default="backoff", metadata=flag(
        "", choices=SCHEDULERS, notes={"backoff": "bans rules whose matches explode, as egg",
                                       "simple": "every rule every round"}))  # egg's backoff is fast-forwarded
    search: str = field(default="eqsat", metadata=flag(
        "build the e-graph by equality saturation, Monte Carlo tree search over rule applications, or TASO's "
        "backtracking over single rewrites", choices=SEARCHES))  # time_limit bounds each
    budget: int | None = field(default=None, metadata=flag(
        "mcts: tree iterations (default 32); backtrack: graphs expanded (default 100)"))  # None: the strategy's
    seed: int = field(default=0, metadata=flag("mcts: seed of its random choices"))
    alpha: float = field(default=1.05, metadata=flag(
        "backtrack: keep graphs up to alpha x the best cost (1: greedy)"))  # TASO's default
    extractor: str = field(default="ilp", metadata=flag("", choices=EXTRACTORS))
    ilp_time_limit: float = field(default=30.0, metadata=flag("ILP time limit, seconds"))
    mip_gap: float = field(default=1e-4, metadata=flag("relative MIP gap at which the ILP stops"))
    cost_model: str = field(default="measured", metadata=flag(
        "", choices=COST_MODELS, notes={"measured": "ONNX Runtime, cached"}))
    provider: str = field(default="cpu", metadata=flag(
        "where costs and latency are measured", choices=PROVIDERS))
    threads: int = field(default_factory=all_cores, metadata=flag(
        "intra-op threads for profiling and latency (default: all cores)",
        batch={"help": "intra-op threads of each worker for profiling and latency (default: all cores shared, "
                       "max(1, cores // jobs) each)", "type": int | None, "default": None}))
    costs: str | None = field(default=None, metadata=flag(
        "import this cost table (relsat costs export) first", type=Path | None))  # into the cost cache
    measure: bool = field(default=True, metadata=flag(
        "skip the final latency guard", name="--no-measure", negate=True))  # time the original and the optimized
    guard_threshold: float = GUARD_THRESHOLD
    simplify: bool = field(default=True, metadata=flag(
        "write a candidate only when it is faster beyond noise, not also one that ONNX Runtime runs with fewer "
        "kernels and no more work of any kind and that is not slower (a simplified graph)", name="--no-simplify",
        negate=True))  # relsat.driver.search.candidates.Search._simplified
    shape_notes: bool = field(default=True, metadata=flag(
        "write the graphs' values without their inferred shapes (value_info); by default they are named where ONNX "
        "Runtime then runs no op more often (its memory planner reuses buffers it can prove of one size)",
        name="--no-shape-notes", negate=True))  # relsat.driver.boundary.shape_notes
    check_rules: bool = True  # verify user rule files on random tensors before use
    candidates: int = field(default=3, metadata=flag(
        "candidate graphs timed as whole models for the final choice, with costs refined in context (0: one-node "
        "costs and the guard only)"))
    context_rounds: int = field(default=2, metadata=flag("extract-profile rounds refining the in-context costs"))
    derive: bool = field(default=True, metadata=flag(
        "skip EinNet-style derivations (a masked Softmax computed only over its mask's band)", name="--no-derive",
        negate=True))  # relsat.driver.app.derive: derived subgraphs enter the e-graph as alternatives
    derive_search: int = field(default=0, metadata=flag(
        "rounds of EinNet's derivation rules (SQL over tensor expressions) from the model's Conv, ConvTranspose, "
        "MatMul, Gemm and Einsum nodes with static shapes; derived forms that match ONNX operators enter the "
        "e-graph as alternatives (0: none)"))  # relsat.driver.app.derive_search

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
        """A copy with ``changes`` (field names; an unknown one is a TypeError), not checked:
        ``Options().replace(node_limit=500).node_limit == 500``."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown optimize option(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """Every field by name (what ``relsat batch`` records and hashes):
        ``Options().as_dict()["iter_limit"] == 30``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def node_limit_for(self, enodes: int) -> int:
        """The e-node limit of a run whose imported e-graph has ``enodes``: ``node_limit`` when given, else the
        larger of ``NODE_LIMIT`` and ``NODE_LIMIT_PER_ENODE`` times ``enodes``. A fixed 2,000 cut PP-OCRv5 det (817
        e-nodes imported, saturated at 1,683) in its third round, before the affine folds of its last blocks:
        a round's inserts pass the limit before the rebuild merges them."""
        return self.node_limit if self.node_limit is not None else max(NODE_LIMIT, NODE_LIMIT_PER_ENODE * enodes)

    @property
    def backend(self) -> Backend:
        """``provider`` resolved (``relsat.relations.backend``; once per process): what runs and times the
        model here. Everything below the options is given this object, never the provider name."""
        return resolve(self.provider)

    def check(self) -> Options:
        """RelsatError (one line, named after the flag: :func:`flag_name`) for a value ``optimize`` cannot use,
        else the options themselves: ``Options(threads=0).check()`` raises ``--threads 0: expected a whole
        number >= 1``."""
        for f in command_flags("optimize"):
            if f.choices and getattr(self, f.attr) not in f.choices:
                raise RelsatError(f"{f.name} {getattr(self, f.attr)}: expected {_alternatives(f.choices)}")

        def refuse(attr: str, expected: str, value=None) -> RelsatError:
            return RelsatError(f"{flag_name(attr)} {getattr(self, attr) if value is None else value}: {expected}")

        if self.memory_limit is not None:
            check_memory_limit(self.memory_limit)
        if self.input_shapes:
            parse_shapes([f"{k}={','.join(str(d) for d in v)}" for k, v in self.input_shapes.items()])
        if self.temp_dir is not None and not Path(self.temp_dir).parent.is_dir():
            raise refuse("temp_dir", "its parent folder does not exist")
        if self.temp_dir is not None and Path(self.temp_dir).exists() and not Path(self.temp_dir).is_dir():
            raise refuse("temp_dir", "not a folder")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise refuse("budget", "expected a whole number >= 1")
        if not isinstance(self.seed, int):
            raise refuse("seed", "expected a whole number")
        if not self.alpha >= 1.0:
            raise refuse("alpha", "expected a factor >= 1 (1 is greedy)")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise refuse("threads", "expected a whole number >= 1")
        for attr in ("candidates", "context_rounds", "iter_limit", "node_limit", "slow_rounds"):
            if attr == "node_limit" and self.node_limit is None:
                continue
            if not isinstance(getattr(self, attr), int) or getattr(self, attr) < 0:
                raise refuse(attr, "expected a whole number >= 0")
        if not 0 <= self.mip_gap < 1:
            raise refuse("mip_gap", "expected a relative gap in [0, 1)")
        if not self.ilp_time_limit > 0:
            raise refuse("ilp_time_limit", "expected seconds > 0")
        if not self.time_limit > 0:
            raise refuse("time_limit", "expected seconds > 0")
        for p in self.inputs:
            if not Path(p).is_file():
                raise refuse("inputs", "no such file", p)
        if self.costs is not None and not Path(self.costs).is_file():
            raise refuse("costs", "no such cost table file")
        return self


def _alternatives(choices) -> str:
    return " or ".join(choices) if len(choices) == 2 else "one of " + ", ".join(choices)


DEFAULTS = Options()


@functools.cache
def command_flags(command: str = "optimize") -> tuple[Flag, ...]:
    """The flags of ``relsat optimize`` (``command="optimize"``) or ``relsat batch`` (``"batch"``), in
    field order, each resolved: its name, the type it reads and its default on that command."""
    hints = typing.get_type_hints(Options)
    out = []
    for f in dataclasses.fields(Options):
        fl = f.metadata.get("flag")
        if fl is None or (command == "batch" and fl.batch is False):
            continue
        fl = dataclasses.replace(fl, attr=f.name, name=fl.name or "--" + f.name.replace("_", "-"),
                                 type=fl.type or hints[f.name])
        if command == "batch" and isinstance(fl.batch, dict):
            fl = dataclasses.replace(fl, **fl.batch)
        if fl.default is _FIELD:
            value = getattr(DEFAULTS, f.name)
            value = not value if fl.negate else value
            fl = dataclasses.replace(fl, default=list(value or ()) if typing.get_origin(fl.type) is list else value)
        out.append(fl)
    return tuple(out)


def flag_name(attr: str) -> str:
    """The command-line flag of ``Options`` field ``attr``: ``flag_name("node_limit") == "--node-limit"``."""
    return _NAMES[attr]


_NAMES = {f.attr: f.name for f in command_flags("optimize")}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib|%)?\s*$", re.IGNORECASE)


def check_memory_limit(value) -> None:
    """RelsatError (one line) unless ``value`` is a memory size DuckDB can run in: a number > 0 with a unit
    (``16GB``, ``512MiB``) or a percentage of the memory (``50%``). DuckDB itself reads a negative size as
    no limit and a bare number not at all."""
    text = str(value)
    m = _SIZE.match(text)
    if m is None or m.group(2) is None:
        raise RelsatError(f"{flag_name('memory_limit')} {text}: expected a size above 0 with a unit, such as 16GB or 512MB "
                          "(or a percentage of the memory, such as 50%)")
    number = float(m.group(1))
    if number <= 0 or (m.group(2) == "%" and number > 100):
        raise RelsatError(f"{flag_name('memory_limit')} {text}: expected a size above 0 (such as 16GB), or a percentage in (0, 100]")
    try:
        duckdb.connect(config={"memory_limit": text}).close()
    except duckdb.Error as e:
        first = " ".join(str(e).split("\n")[0].split())
        raise RelsatError(f"{flag_name('memory_limit')} {text}: too small for the e-graph database to start ({first}); "
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
            raise RelsatError(f"{flag_name('input_shapes')} {spec!r}: expected NAME=D0,D1,... with integer dims") from None
        bad = [d for d in shapes[name] if d < 1]
        if bad:
            raise RelsatError(f"{flag_name('input_shapes')} {spec}: dim {bad[0]} is not a size; every dim must be 1 or more")
        elements = 1
        for d in shapes[name]:
            elements *= d
        if memory is not None and elements > memory:
            raise RelsatError(f"{flag_name('input_shapes')} {spec}: {elements:.3g} elements do not fit in this machine's memory "
                              f"({memory / 2**30:.0f} GiB); give the sizes the model is meant to run at")
    return shapes
