"""The ``relsat`` command line: optimize, costs, zoo, query, rules.

Every user-facing failure is a RelsatError printed as one line on stderr with
exit status 1; nothing is written unless the step that writes succeeds.  ``optimize``
also ends in one line when it is interrupted (SIGINT or SIGTERM: exit status 130 or
143, its temporary files removed, each output whole or absent) or runs out of memory or
disk (the limit named, and what to raise): ``_Signals`` and ``_stops``.

The options of ``optimize`` and ``batch`` that set an ``Options`` field are not declared here:
``with_options`` generates them from the fields' metadata (relsat.driver.options), where each
flag's name, default and help are written once.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from relsat.driver.app.batch import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_MODEL_TIMEOUT_S, worker_threads
from relsat.driver.errors import RelsatError, error_line
from relsat.driver.options import Options, command_flags
from relsat.driver.boundary.outputs import write_text_atomic
from relsat.driver.app.explain import explain as _explain_command
from relsat.driver.app.report_html import report as _report_command

app = typer.Typer(add_completion=False, no_args_is_help=True, help="relsat: a tensor-graph superoptimizer.")
zoo_app = typer.Typer(no_args_is_help=True, help="The benchmark model zoo.")
rules_app = typer.Typer(no_args_is_help=True, help="Rule sets: list and verify.")
costs_app = typer.Typer(no_args_is_help=True, help="The persistent cache of measured operator costs.")
app.add_typer(zoo_app, name="zoo")
app.add_typer(rules_app, name="rules")
app.add_typer(costs_app, name="costs")
out = Console()
err = Console(stderr=True)


def with_options(command: str, *, last: tuple[str, ...] = ()):
    """The flags of ``Options`` as options of a command (``optimize`` or ``batch``), generated from the
    fields' metadata (``options.command_flags``: name, type, default and help declared once, beside
    the field): the decorated function takes them as ``**flags`` (the command line's values, by field
    name; ``_options`` turns them into an ``Options``).  Its own parameters come first, but those
    named in ``last``, which follow the flags in the help."""

    def wrap(fn):
        keyword = inspect.Parameter.KEYWORD_ONLY  # typer passes every parameter by name
        own = [p.replace(kind=keyword) for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.kind is not p.VAR_KEYWORD]
        generated = [inspect.Parameter(f.attr, keyword, annotation=f.type,
                                       default=typer.Option(f.default, f.name, help=f.text()))
                     for f in command_flags(command)]
        fn.__signature__ = inspect.Signature([p for p in own if p.name not in last] + generated
                                             + [p for p in own if p.name in last])
        return fn

    return wrap


def _options(command: str, flags: dict, **fixed) -> Options:
    """The command line's values of the ``Options`` flags of ``command`` (and ``fixed`` field values) as
    an ``Options`` (checked)."""
    values = {f.attr: f.read(flags[f.attr]) for f in command_flags(command)}
    return Options(**dict(values, **fixed)).check()


def _fail(e: Exception) -> None:
    err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)  # [brackets] are text
    raise typer.Exit(1)


@contextmanager
def _one_line(cannot: str):
    """A command's step that ends, when it fails, in one line: its own RelsatError as it is, anything else
    as ``cannot: <the error's first line>``."""
    try:
        yield
    except RelsatError as e:
        _fail(e)
    except Exception as e:
        _fail(RelsatError(f"{cannot}: {error_line(e)}"))


def _load_input(spec: str):
    if spec.startswith("zoo:"):
        from relsat.driver.boundary import zoo

        name = spec[4:]
        if name not in zoo.ALL_NAMES:
            raise RelsatError(f"{spec}: unknown zoo model; known: {', '.join(zoo.ALL_NAMES)}")
        return zoo.build(name)
    return spec


@app.command()
@with_options("optimize", last=("report",))
def optimize(
    model: str = typer.Argument(..., help="an ONNX file, or zoo:NAME for a built-in benchmark model"),
    output: Path = typer.Option(..., "-o", "--output", help="where to write the optimized model"),
    db: Optional[Path] = typer.Option(None, "--db", help="keep the e-graph in this DuckDB file"),
    report: Optional[Path] = typer.Option(None, "--report", help="write the JSON report here"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only errors and the path written"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="every step as it happens, and ONNX Runtime's "
                                 "own log lines"),
    **flags,
) -> None:
    """Optimize one model: saturate with the rules, extract the cheapest graph, verify, time, write."""
    from relsat.driver.app.optimize import optimize as run
    from relsat.driver.boundary.outputs import check_outputs, protected_paths

    outputs = [("-o", output), ("--db", db), ("--report", report)]
    with _Signals() as sig, _stops(sig, outputs, memory_limit=flags["memory_limit"], temp_dir=flags["temp_dir"],
                                   what=model):
        source = _load_input(model)
        # the report here, also against -o and --db, which the pipeline checks in its first step
        check_outputs(source=None if model.startswith("zoo:") else source, report=report,
                      others=[("-o", output), ("--db", db)], protected=protected_paths(None, flags["costs"]))
        _ort_log(verbose)
        with _Progress(err, quiet=quiet, verbose=verbose) as progress:
            options = _options("optimize", flags)

            def on_status(text: str) -> None:
                sig.check()  # an interrupt a step swallowed (a fallback's except) stops the run here
                progress.status(text)

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                try:
                    result = run(source, options, db=db, output=output, on_status=on_status,
                                 on_round=lambda it: on_status(f"saturating: round {it.round}, {it.enodes} e-nodes"),
                                 on_progress=progress.advance, on_phase=progress.phase)
                finally:
                    for w in caught if not quiet else ():
                        err.print(f"[yellow]warning:[/yellow] {w.message}", highlight=False, soft_wrap=True)
        sig.check()
        rep = result.report
        rep["input"] = model
        rep["output"] = str(output)
        if report:
            write_text_atomic(report, json.dumps(rep.as_dict(), indent=2, default=str))
    if quiet:
        out.print(escape(str(output)), highlight=False, soft_wrap=True)
    else:
        _summary(rep)


def _ort_log(verbose: bool) -> None:
    """ONNX Runtime's own log lines (its default logger and relsat's sessions: warnings and errors it prints
    itself, beside the exceptions relsat reports) only with --verbose."""
    from relsat.relations import runtime

    runtime.set_log_severity(2 if verbose else 4)


class _Progress:
    """What a command shows while it runs. On a terminal: a live line with the current step and, for a long
    phase that counts its steps (saturation rounds, signatures profiled, search steps), a progress bar; the
    line goes when the command ends. Off a terminal (a pipe, a log file): one line per phase as it ends, with
    its time (``relsat: saturate: 1.23 s``), and with ``verbose`` every step's text too. ``quiet``: nothing.
    A command whose steps are only texts (``rules generate``) calls :meth:`step`: each text is a phase that
    ends when the next begins."""

    def __init__(self, console: Console, *, quiet: bool = False, verbose: bool = False):
        self.console, self.quiet, self.verbose = console, quiet, verbose
        self.live = console.is_terminal and not quiet
        self._bar = self._task = None
        self._text = ""
        self._step: tuple[str, float] | None = None  # the step (name, start) :meth:`step` began

    def __enter__(self) -> "_Progress":
        if self.live:
            from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
            from rich.progress import TimeElapsedColumn
            from rich.text import Text

            class Count(ProgressColumn):  # done/total, nothing for a phase that does not count its steps
                def render(self, task) -> Text:
                    return Text("" if task.total is None else f"{int(task.completed)}/{int(task.total)}",
                                style="progress.download")

            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 Count(), TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("loading ...", total=None)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.end_step()
        if self._bar is not None:
            self._bar.stop()

    def step(self, text: str) -> None:
        """A new step, in words: the one before it ends (its line off a terminal)."""
        self.end_step()
        self._step = (text.rstrip(" .") or text, time.perf_counter())
        self.status(text)

    def end_step(self) -> None:
        if self._step is not None:
            name, t = self._step
            self._step = None
            self.phase(name, time.perf_counter() - t)

    def status(self, text: str) -> None:
        """The current step, in words."""
        if text == self._text:
            return
        self._text = text
        if self._bar is not None:
            self._bar.update(self._task, description=escape(text))
        elif self.verbose and not self.quiet:
            self.console.print(escape(text), highlight=False, soft_wrap=True)

    def advance(self, done: int, total: int | None) -> None:
        """``done`` of ``total`` steps of the current phase."""
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)

    def phase(self, name: str, seconds: float) -> None:
        """A phase ended: its line off a terminal; the bar starts again for the next phase."""
        if self._bar is not None:  # a fresh task: one without a total shows no count
            self._bar.remove_task(self._task)
            self._task = self._bar.add_task(escape(self._text), total=None)
        elif not self.quiet:
            self.console.print(f"relsat: {escape(name)}: {seconds:.2f} s", highlight=False, soft_wrap=True)


EXIT_ON_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells report them


class _Signals:
    """SIGINT (Ctrl-C) and SIGTERM while a command runs: the first of them is recorded and raises
    KeyboardInterrupt where the command is, so that every ``finally`` runs (the pipeline closes its
    e-graph and removes its temporary files); ``check()`` raises it again where a step swallowed it
    (DuckDB turns it into "Query interrupted"); ``quiet()`` holds further signals while the command
    cleans up. The previous handlers come back on exit."""

    def __init__(self):
        self.received: int | None = None
        self._quiet = False
        self._previous: dict = {}

    def __enter__(self) -> "_Signals":
        for s in EXIT_ON_SIGNAL:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum
        if not self._quiet:
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.received is not None and not self._quiet:
            raise KeyboardInterrupt

    def quiet(self) -> None:
        self._quiet = True


def _stamp(path: Optional[Path]):
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@contextmanager
def _stops(sig: _Signals, outputs, *, memory_limit, temp_dir, what: str):
    """How a command that writes ``outputs`` ((flag, path) pairs) ends when it does not finish: a signal
    ends it with one line naming what was written before it (each file whole: written through a rename)
    and exit status 130 (SIGINT) or 143 (SIGTERM); running out of memory or disk ends it with one line
    naming the limit and what to raise (``errors.resource_error``); a RelsatError or an OSError with one
    line and status 1. Every temporary file of an e-graph not committed is removed in each case."""
    from relsat.driver.errors import resource_error
    from relsat.driver.boundary.outputs import discard_uncommitted

    before = {flag: _stamp(p) for flag, p in outputs if p is not None}
    try:
        yield
    except typer.Exit:
        raise
    except BaseException as e:  # noqa: BLE001: every way out is one line
        sig.quiet()
        discard_uncommitted()
        if sig.received is not None or isinstance(e, KeyboardInterrupt):
            _interrupted(sig.received or signal.SIGINT, outputs, before)
        if isinstance(e, RelsatError):
            _fail(e)
        found = resource_error(e, memory_limit=memory_limit, temp_dir=temp_dir)
        if found is not None:
            _fail(found)
        if isinstance(e, OSError):  # a file system problem the checks could not foresee
            _fail(RelsatError(f"{e.filename or what}: {e.strerror or e}"))
        raise
    finally:
        sig.quiet()
        discard_uncommitted()


def _interrupted(signum: int, outputs, before: dict) -> None:
    written = [f"{flag} {p}" for flag, p in outputs if p is not None and _stamp(p) not in (None, before.get(flag))]
    done = ("; written before it stopped, whole: " + ", ".join(written)) if written else "; nothing written"
    err.print(f"[red]interrupted[/red] by {signal.Signals(signum).name}{escape(done)}", highlight=False,
              soft_wrap=True)
    raise typer.Exit(EXIT_ON_SIGNAL.get(signum, 130))


def _summary(rep: dict) -> None:
    """The summary table: what was predicted (the cost table's figures), what was measured (medians and their
    spread) and what was written, each named; every limit that cut the run; the verification."""
    t = Table(title=f"relsat optimize {rep['input']}", show_header=False)
    t.add_row("result", escape(rep.get("verdict") or rep.get("written") or ""))
    t.add_row("nodes", f"{rep['nodes_in']} -> {rep['nodes_out']}")
    t.add_row("e-graph", f"{rep['enodes']} e-nodes, {rep['eclasses']} e-classes, "
              f"{len(rep['iterations'])} rounds, stop: {rep['stop_reason']}")
    for lim in rep.get("limits") or ():
        t.add_row("limit", f"{lim['limit']} ({lim['flag']} {lim['value']}) cut the run: {lim['cut']}")
    top = ", ".join(f"{k} x{v}" for k, v in list(rep["rules_applied"].items())[:4] if v) or "none"
    t.add_row("rules applied", top)
    x, pr = rep["extraction"], rep.get("predicted") or {}
    gap = "" if x["gap"] is None else f", gap {x['gap']:.2%}"
    if pr:
        t.add_row("predicted cost", f"input {pr['input']:.4f} -> extracted {pr['extracted']:.4f} {pr['unit']} "
                  f"(costs: {pr['costs']}; {x['method']} {x['status']}{gap})")
        ctx = pr.get("in_context")
        if ctx:
            before = "" if ctx["input"] is None else f"input {ctx['input']:.4f} -> "
            t.add_row("predicted in context", f"{before}extracted {ctx['extracted']:.4f} ms (whole-graph profiles "
                      "of this run)")
    else:
        t.add_row("model cost", f"{rep['cost_before']:.4f} -> {rep['cost_after']:.4f} ms "
                  f"({rep.get('cost_label') or rep['cost_model']}), {x['method']} {x['status']}{gap}")
    p = rep.get("profile")
    if p:
        fb = f", {p['failed']} fell back to analytic" if p["failed"] else ""
        t.add_row("profiling", f"{p['signatures']} signatures ({p['provider']}, {p['threads']} thread(s)): "
                  f"{p['measured']} timed, {p['cached']} from the cache{fb}")
    m = rep.get("measured")
    if m:
        def iv(blocks):
            return f" [{blocks[0]:.3f}-{blocks[1]:.3f}]" if blocks else ""

        which = "written" if rep.get("written") == "optimized" else "fastest candidate"
        noise = "" if m["noise"] is None else f", noise {m['noise']:.1%}"
        if m.get("block_ratios"):
            from relsat.driver.app.phases import block_range  # (loaded already: the run imported it)

            noise += f", by block {block_range(m['block_ratios'])}"
        t.add_row("measured latency", escape(
            f"input {m['input_ms']:.3f}{iv(m['input_blocks_ms'])} -> {which} {m['candidate_ms']:.3f}"
            f"{iv(m['candidate_blocks_ms'])} ms, {m['speedup']:.3f}x ({m['metric']}, medians [interval of block "
            f"medians]{noise}, threshold {m['threshold']:.0%}, {m['runs']} runs)"))
    elif (rep.get("fidelity") or {}).get("original_measured_ms") is not None:
        f = rep["fidelity"]
        t.add_row("measured latency", f"input {f['original_measured_ms']:.3f} ms "
                  f"({'CPU time' if f.get('metric') == 'cpu' else 'wall clock'}); no candidate graph to time against it")
    elif rep.get("latency") is None:
        t.add_row("measured latency", "not timed")
    v = rep["verification"]
    t.add_row("verification", f"{'ok' if v['ok'] else 'FAILED'}, max abs error {v['max_abs_err']:.2e} "
              f"({v.get('draws', 0)} input draws)" if v.get("draws") else v["message"])
    b = rep.get("binding") or {}
    if b.get("symbols"):
        t.add_row("dynamic dims", "kept; costed and timed at " + ", ".join(f"{k}={v[0]}" for k, v in b["symbols"].items())
                  + "; verified also at " + ", ".join(f"{k}={v[1]}" for k, v in b["symbols"].items()))
    elif b.get("fixed"):
        t.add_row("shapes", "fixed (--fix-shapes): " + "; ".join(f"{k} {v}" for k, v in b["costed"].items()))
    t.add_row("time", ", ".join(f"{k} {s:.2f}s" for k, s in rep["phases_s"].items()))
    for n in rep["notices"]:
        t.add_row("notice", n)
    t.add_row("written", rep["output"])
    out.print(t)


def _cache(path: Optional[Path]):
    from relsat.driver.boundary.outputs import open_cost_cache

    return open_cost_cache(path)


@costs_app.command("export")
def costs_export(file: Path = typer.Argument(..., help="destination: .csv, .parquet, or a DuckDB file"),
                 cache: Optional[Path] = typer.Option(None, "--cache", help="the cost cache (default: "
                                                      "$RELSAT_COST_CACHE or the user cache directory)")) -> None:
    """Write every cached operator cost to FILE (import it elsewhere with optimize --costs FILE)."""
    from relsat.extract.cost_cache import default_path

    with _one_line(f"{file}: cannot export the cost cache"):
        where = cache or default_path()
        if not Path(where).exists():
            raise RelsatError(f"{where}: no cost cache yet (run relsat optimize first)")
        from relsat.driver.boundary.outputs import check_outputs

        check_outputs(cost_table=file, protected=[("the cost cache", Path(where))])
        c = _cache(where)
        file.parent.mkdir(parents=True, exist_ok=True)
        c.export(file)
        n = c.count()
    out.print(f"{file}: {n} operator costs exported from {c.path}", highlight=False)


@costs_app.command("import")
def costs_import(file: Path = typer.Argument(..., help="a table written by relsat costs export"),
                 cache: Optional[Path] = typer.Option(None, "--cache", help="the cost cache to merge into")) -> None:
    """Merge an exported cost table into the cost cache (its rows win over local ones)."""
    with _one_line(f"{file}: cannot import it as a cost table"):
        if not file.is_file():
            raise RelsatError(f"{file}: no such cost table file")
        c = _cache(cache)
        n = c.import_(file)
    out.print(f"{file}: {n} operator costs merged into {c.path}", highlight=False)


@costs_app.command("info")
def costs_info(cache: Optional[Path] = typer.Option(None, "--cache", help="the cost cache")) -> None:
    """Where the cost cache is and what it holds, by provider, threads and ONNX Runtime version."""
    import duckdb

    from relsat.extract.cost_cache import default_path

    where = cache or default_path()
    if not Path(where).exists():
        out.print(f"cost cache: {where} (none yet: relsat optimize creates it)", highlight=False)
        return
    try:
        c = _cache(where)
        rows = c.summary()
    except (RelsatError, duckdb.Error) as e:
        _fail(RelsatError(f"cost cache: {error_line(e)}"))
    out.print(f"cost cache: {c.path} ({sum(r[3] for r in rows)} operator costs)", highlight=False)
    t = Table("provider", "threads", "onnxruntime", "costs", "op types", "last measured")
    for r in rows:
        t.add_row(*[str(v) for v in r])
    out.print(t)


@zoo_app.command("build")
def zoo_build(name: str = typer.Argument(..., help="a zoo model name, all (TASO's ten) or seeds (EinNet's)"),
              output: Path = typer.Option(..., "-o", "--output", help="output folder"),
              small: bool = typer.Option(False, "--small", help="the reduced-size variants")) -> None:
    """Write benchmark models and print their node counts by op type."""
    from relsat.driver.boundary import zoo

    names = {"all": zoo.NAMES, "seeds": zoo.SEED_NAMES}.get(name, (name,))
    try:
        for n in names:
            if n not in zoo.ALL_NAMES:
                raise RelsatError(f"zoo model {n!r}: unknown; known: {', '.join(zoo.ALL_NAMES)}, all, seeds")
    except RelsatError as e:
        _fail(e)
    output.mkdir(parents=True, exist_ok=True)
    for n in names:
        model = zoo.build(n, small=small)
        path = output / f"{n}.onnx"
        zoo.save(model, path)
        counts = ", ".join(f"{k} {v}" for k, v in zoo.op_counts(model).items())
        out.print(f"{path}: {len(model.graph.node)} nodes ({counts})", highlight=False)


QUERY_FORMATS = ("table", "csv", "json")


@app.command(context_settings={"ignore_unknown_options": True})
def query(db: Path = typer.Argument(..., help="a saved e-graph (relsat optimize --db)"),
          sql: str = typer.Argument(..., help="one SQL query (it may start with a -- comment)"),
          fmt: str = typer.Option("table", "--format", help="table | csv | json")) -> None:
    """Run SQL against a saved e-graph (read only; the query can read nothing but the e-graph)."""
    import duckdb

    try:
        if fmt not in QUERY_FORMATS:
            raise RelsatError(f"--format {fmt}: expected one of {', '.join(QUERY_FORMATS)}")
        if not sql.strip():
            raise RelsatError("query: the SQL is empty; give one query, e.g. relsat query e.duckdb "
                              "\"SELECT count(*) FROM eclass\"")
        from relsat.driver.boundary.outputs import open_egraph_readonly

        con = open_egraph_readonly(db)
        try:
            cur = con.execute(sql)
            if cur is None or cur.description is None:  # nothing ran (only comments) or nothing to show
                raise RelsatError(f"{db}: the SQL returns no result; give one query that does, such as a SELECT")
            rows, cols = cur.fetchall(), [d[0] for d in (cur.description or [])]
        except duckdb.Error as e:
            raise RelsatError(f"{db}: {error_line(e)}") from None
        finally:
            con.close()
    except RelsatError as e:
        _fail(e)
    if fmt == "json":
        print(json.dumps([dict(zip(cols, r)) for r in rows], default=str))
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        w.writerows(rows)
    else:
        t = Table(*cols)
        for r in rows:
            t.add_row(*[str(v) for v in r])
        out.print(t)


@rules_app.command("list")
def rules_list(names: List[str] = typer.Argument(None, help="rule set names or files (default: all shipped)")) -> None:
    """Show the rules of a set."""
    from relsat.programs.parser import format_rule, load_rules

    from relsat.programs.rulesets import RULES_DIR, rule_files

    try:
        files = rule_files(names) if names else sorted(RULES_DIR.glob("*.rules"))
        for f in files:
            rs = load_rules(f)
            out.print(f"[bold]{f.stem}[/bold] ({len(rs.rules)} rules)")
            for r in rs.rules:
                out.print("  " + format_rule(r), highlight=False, soft_wrap=True)
    except Exception as e:  # RuleError carries file:line:col
        _fail(e)


@rules_app.command("check")
def rules_check(names: List[str] = typer.Argument(..., help="rule set names or files")) -> None:
    """Evaluate both sides of every rule on random tensors under ONNX Runtime; then name the rules that are
    instances of another rule given (``programs.subsume``: they add nothing where it runs), which is no failure."""
    from relsat.programs.parser import load_rules
    from relsat.programs.subsume import redundant
    from relsat.programs.verify import check_ruleset

    from relsat.programs.rulesets import rule_files

    failed = 0
    try:
        sets = [(f, load_rules(f)) for f in rule_files(names)]
        for f, rs in sets:
            for c in check_ruleset(rs):
                status = "ok" if c.ok else ("skipped" if getattr(c, "skipped", None) else "DIFFERS")
                failed += status != "ok"
                out.print(f"{f.stem}:{c.rule}: {status} {c.message or ''}", highlight=False)
        where = {}
        for f, rs in sets:
            for r in rs.rules:
                where.setdefault(r.name, f.stem)
        together = sum(len(rs.rules) for _, rs in sets) == len(where)  # (names shared by two files: file by file)
        groups = [[r for _, rs in sets for r in rs.rules]] if together else [list(rs.rules) for _, rs in sets]
        for group in groups:
            for name, cover in redundant(group).items():
                out.print(f"{where[name]}:{name}: an instance of {where[cover]}:{cover} (it adds nothing where that "
                          "rule runs)", highlight=False)
    except Exception as e:
        _fail(e)
    if failed:
        raise typer.Exit(1)


@rules_app.command("generate")
def rules_generate(
    output: Path = typer.Option(..., "-o", "--output", help="the rule file to write (the shipped one: "
                                "programs/rules/generated.rules)"),
    max_ops: int = typer.Option(3, "--max-ops", help="operators per side of a rule"),
    family: List[str] = typer.Option(None, "--family", help="term families to enumerate (default: all; "
                                     "see programs/universe.py)"),
    jobs: int = typer.Option(2, "--jobs", "-j", help="worker processes verifying the candidates"),
    trials: int = typer.Option(5, "--trials", help="random instances per rule under ONNX Runtime"),
    no_prove: bool = typer.Option(False, "--no-prove", help="skip the z3 proofs (every rule is then 'tested')"),
    report: Optional[Path] = typer.Option(None, "--report", help="write the counts and every candidate's "
                                          "verdict as JSON"),
) -> None:
    """Generate rules (TASO's method): enumerate small graphs, group them by fingerprint, prune,
    verify under ONNX Runtime, prove with z3 where the algebra is known, write a rule file."""
    from relsat.programs import generate as gen
    from relsat.programs.universe import FAMILIES

    families = list(family or FAMILIES)
    command = " ".join(["relsat rules generate", f"--max-ops {max_ops}", *(f"--family {f}" for f in family or ()),
                        f"--trials {trials}", *(["--no-prove"] if no_prove else []), f"-o {output}"])
    try:
        if max_ops < 1:
            raise RelsatError(f"--max-ops {max_ops}: must be at least 1")
        bad = [f for f in families if f not in FAMILIES]
        if bad:
            raise RelsatError(f"--family {bad[0]}: no such family (one of {', '.join(FAMILIES)})")
        _ort_log(False)
        with _Progress(err) as progress:
            rep = gen.generate(max_ops=max_ops, families=families, jobs=jobs, trials=trials, prove=not no_prove,
                               command=command, status=progress.step, progress=progress.advance)
        write_text_atomic(output, gen.render(rep))
        if report:
            write_text_atomic(report, json.dumps(gen.report_json(rep), indent=2) + "\n")
    except Exception as e:
        _fail(e)
    t = Table("count", "value")
    for k, v in rep.counts.items():
        t.add_row(k, str(v))
    for k, v in rep.seconds.items():
        t.add_row(f"seconds: {k}", f"{v:.1f}")
    out.print(t)
    out.print(f"wrote {output} ({rep.counts['written']} rules)", highlight=False)


@app.command()
@with_options("batch")
def batch(
    models: str = typer.Argument(..., help="a folder (every *.onnx under it) or a glob such as 'zoo/*.onnx'"),
    outdir: Path = typer.Option(..., "-o", "--output", help="output folder: models, reports, results table"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="models optimized at once, one worker process (or Ray task) "
                                                   "each (more than 1 on one machine perturbs measured costs "
                                                   "and latencies)"),
    model_timeout: float = typer.Option(DEFAULT_MODEL_TIMEOUT_S, "--model-timeout",
                                        help="seconds per model before its worker is killed (0: no limit)"),
    keep_db: bool = typer.Option(False, "--keep-db", help="keep each e-graph as OUTDIR/NAME.duckdb"),
    skip_failed: bool = typer.Option(False, "--skip-failed",
                                     help="on a rerun, also skip models that failed with the same options"),
    force: bool = typer.Option(False, "--force", help="optimize every model again, even those done, and replace "
                               "files in OUTDIR that relsat batch did not write (refused without it)"),
    executor: str = typer.Option("local", "--executor", help="local (worker processes here) | ray (a Ray task per "
                                 "model, --threads CPUs each; needs pip install 'relsat\\[ray]')"),  # \[: not markup
    address: Optional[str] = typer.Option(None, "--address", help="--executor ray: the Ray cluster to join "
                                          "(auto: the one `ray start` started; default: join or start a local one)"),
    connect_timeout: float = typer.Option(DEFAULT_CONNECT_TIMEOUT_S, "--connect-timeout",
                                          help="--executor ray: seconds for the --address to answer before "
                                          "giving up"),
    **flags,
) -> None:
    """Optimize every model of a folder or glob in parallel; write OUTDIR/results.{duckdb,csv} and summary.md."""
    from relsat.driver.app.batch import run_batch

    # Ctrl-C interrupts the batch (run_batch stops the workers and records what finished) even when this
    # process started with SIGINT ignored, as a shell's background job does (optimize's _Signals does the same)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # without --threads the workers share the cores
        options = _options("batch", flags, threads=worker_threads(jobs) if flags["threads"] is None else flags["threads"])
        result = run_batch(models, outdir, jobs=jobs, model_timeout=model_timeout, keep_db=keep_db,
                           skip_failed=skip_failed, force=force, executor=executor, address=address,
                           connect_timeout=connect_timeout, console=err, options=options)
    except RelsatError as e:
        _fail(e)
    _print_batch_summary(out, result)
    n = len(result.rows)
    if result.interrupted:
        err.print(f"[red]interrupted:[/red] {result.ran} models finished this run; rerun to resume", highlight=False)
        raise typer.Exit(130)
    if result.failed:
        err.print(f"[red]{result.failed} of {n} models failed[/red] (reasons in {result.outdir / 'summary.md'})",
                  highlight=False)
        raise typer.Exit(1)
    err.print(f"all {n} models optimized ({result.skipped} done earlier); results in {result.outdir}", highlight=False)


WIDE_BATCH_TABLE = 120  # columns from which the batch table shows every column; narrower, the compact one


def _print_batch_summary(console, result) -> None:
    """The batch's results as a table on ``console``: every column where the console is wide, else (an
    80-column terminal, a pipe) a compact table that fits it (model, status, speedup, written, nodes, seconds)
    with the reasons and what this run did as lines below it."""
    if console.width >= WIDE_BATCH_TABLE:
        t = Table(title=f"relsat batch -> {result.outdir}")
        for c in ("model", "status", "speedup", "from", "written", "opt. s", "e-nodes", "nodes", "this run / reason"):
            t.add_column(c)
        for r in result.rows:
            last = r["this_run"] if r["status"] == "ok" else r.get("reason") or ""
            t.add_row(r["model"], r["status"], _cell(r.get("speedup"), ".3f"), _cell(r.get("speedup_source")),
                      _cell(r.get("written")), _cell(r.get("optimizer_s"), ".2f"), _cell(r.get("enodes")),
                      _nodes(r), last)
        console.print(t)
        return
    t = Table(title=escape(f"relsat batch -> {result.outdir}"), box=None, pad_edge=False, title_justify="left")
    for c, kw in (("model", {"overflow": "fold", "ratio": 1}), ("status", {"no_wrap": True}),
                  ("speedup", {"justify": "right", "no_wrap": True}), ("written", {"no_wrap": True}),
                  ("nodes", {"no_wrap": True}), ("s", {"justify": "right", "no_wrap": True})):
        t.add_column(c, **kw)
    notes = []
    for r in result.rows:
        sp = r.get("speedup")
        measured = (r.get("speedup_source") or "").startswith("measured")
        t.add_row(escape(r["model"]), r["status"], "" if sp is None else f"{sp:.3f}" + ("" if measured else " p"),
                  _cell(r.get("written")), _nodes(r), _cell(r.get("optimizer_s"), ".1f"))
        why = r["this_run"] if r["status"] == "ok" else r.get("reason")
        if why and why != "optimized":
            notes.append(f"{r['model']}: {why}")
    console.print(t)
    if any((r.get("speedup_source") or "").startswith("predicted") for r in result.rows):
        console.print("speedup: measured latency; p: the ratio of predicted costs (not timed)", highlight=False)
    for n in notes:
        console.print(escape(n), highlight=False)


def _nodes(r: dict) -> str:
    return f"{r['nodes_in']} -> {r['nodes_out']}" if r.get("nodes_in") is not None else ""


def _cell(v, spec="") -> str:
    return "" if v is None else (format(v, spec) if spec else str(v))



app.command(name="explain")(_explain_command)  # defined beside what they read (driver/app/explain.py,
app.command(name="report")(_report_command)  # report_html.py); registered here, after the commands above


def main() -> None:
    app()
