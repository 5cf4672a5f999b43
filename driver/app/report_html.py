"""``relsat report``: one self-contained HTML page over a batch folder or one optimize report.

This module owns the page: reading what ``relsat batch`` wrote (``results.duckdb``'s rows and the
per-model JSON reports they name; a folder of reports without a results table; or one report
``relsat optimize --report`` wrote), optionally the peers' timings from
``python -m relsat.benchmarks.bench_corpus --out FILE.jsonl`` (``--peers``: relsat batch and optimize
time no peer, so peers come only from there), and writing one HTML file whose plots are inline SVG
drawn here (no script, no stylesheet or font from anywhere else: the page works offline):

- **speedup per model**: relsat's measured wall-clock speedup (median over median) with a whisker
  from the interquartile ranges of the two timings (original q1 / optimized q3 .. original q3 /
  optimized q1), hollow where only a predicted cost ratio exists; the peers' speedups at the same
  thread count beside it (their medians only: bench_corpus records no spread);
- **where the time went**: the pipeline's phases per model (``phases_s``), stacked;
- **e-graph growth**: e-nodes and e-classes after each saturation round (``iterations``);
- **predicted vs measured**: every candidate graph's predicted latency against its measured one
  (``candidates``), all models on log axes, and a table per model;
- a table per model and, per model, its candidates, verification, notices or failure reason.

Every text from the data (model names, paths, notices, reasons) is escaped.  The page is written
atomically (``outputs.write_text_atomic``) and replaces only a page this module wrote (it carries
``GENERATOR``); anything else at the path is refused with a one-line ``RelsatError``, as are a source
with no report, an unreadable report and an unreadable ``--peers`` file.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from relsat.driver.errors import RelsatError, error_line
from relsat.driver.boundary.outputs import is_report, write_text_atomic
from relsat.driver.version import __version__

GENERATOR = "relsat report-html"  # the page's <meta name="generator">: the mark of a page relsat may replace
DEFAULT_NAME = "report.html"  # the page's name in a batch folder
WRITTEN = ("written", "simplified")  # the statuses of the candidate a report's model was written from
# (``relsat.driver.search.candidates``: faster beyond noise, or doing less and not slower)
PHASE_ORDER = ("import", "profile", "saturate", "extract", "context", "choose", "export", "verify", "latency")
# colour-blind-safe (Okabe-Ito and Tol's muted), one per series
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#332288",
           "#117733", "#882255", "#44AA99", "#999933", "#AA4499", "#6699CC")
RELSAT_COLOUR = "#0072B2"
PEER_COLOURS = {"onnxsim": "#E69F00", "onnxslim": "#009E73", "onnxoptimizer": "#CC79A7",
                "ort-transformers": "#D55E00", "relsat-on-onnxsim": "#56B4E9", "relsat (bench)": "#332288"}


# ------------------------------------------------------------------------------------------ the data
@dataclass
class Model:
    """One model of the page: its results row (a batch's; built from the report otherwise) and report."""

    name: str
    status: str  # ok | failed
    row: dict
    report: dict | None
    report_path: Path | None = None
    peers: dict = field(default_factory=dict)  # system -> {"ms": float | None, "status": str}
    peer_threads: int | None = None
    original_peer_ms: float | None = None

    @property
    def latency(self) -> dict | None:
        lat = (self.report or {}).get("latency")
        return lat if isinstance(lat, dict) else None


@dataclass
class Source:
    """What the page is made from."""

    path: Path
    kind: str  # "batch" | "reports" | "report"
    models: list[Model]
    peers_files: list[Path] = field(default_factory=list)


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _read_report(path: Path) -> dict:
    """The JSON report at ``path``, or a one-line RelsatError saying why it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RelsatError(f"{path}: cannot read the report ({e.strerror or error_line(e)})") from None
    except UnicodeDecodeError:
        raise RelsatError(f"{path}: not a relsat report (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RelsatError(f"{path}: not a relsat report (invalid JSON: {error_line(e)})") from None
    if not isinstance(data, dict) or not {"nodes_in", "nodes_out", "verification"} <= set(data):
        raise RelsatError(f"{path}: not a relsat report (a JSON file without nodes_in, nodes_out, verification)")
    return data


def _row_from_report(name: str, rep: dict) -> dict:
    from relsat.driver.app.batch_model import row_from_report

    return {"model": name, "status": "ok", "reason": None, **row_from_report(rep)}


def _report_name(rep: dict, path: Path) -> str:
    return str(rep.get("model") or path.stem)


def load(source: Path) -> Source:
    """The models of a batch folder (its results table, else its ``*.json`` reports) or of one report file."""
    source = Path(source)
    if not source.exists():
        raise RelsatError(f"{source}: no such file or folder")
    if source.is_file():
        rep = _read_report(source)
        return Source(source, "report", [Model(_report_name(rep, source), "ok", _row_from_report(
            _report_name(rep, source), rep), rep, source)])
    if not source.is_dir():
        raise RelsatError(f"{source}: not a file or folder")
    table = source / "results.duckdb"
    if table.exists():
        return Source(source, "batch", _batch_models(source, table))
    reports = sorted(p for p in source.glob("*.json") if p.is_file() and is_report(p))
    if not reports:
        raise RelsatError(f"{source}: no relsat reports here (neither a batch's results.duckdb nor a report "
                          "*.json); run relsat batch or relsat optimize --report first")
    models = []
    for p in reports:
        rep = _read_report(p)
        models.append(Model(p.stem, "ok", _row_from_report(p.stem, rep), rep, p))
    return Source(source, "reports", models)


def _batch_models(folder: Path, table: Path) -> list[Model]:
    from relsat.driver.app.batch_model import NotOurs, read_results

    try:
        rows, _ = read_results(table)
    except NotOurs as e:
        raise RelsatError(f"{table}: not a relsat batch's results table ({e})") from None
    if not rows:
        raise RelsatError(f"{folder}: the batch's results table has no model yet")
    models = []
    for name in sorted(rows):
        row = rows[name]
        rep, where = None, None
        if row.get("status") == "ok" and row.get("report"):
            # a batch writes the report into its folder; the row's path is where that folder was then
            where = folder / Path(row["report"]).name
            if not where.is_file():
                raise RelsatError(f"{where}: the report of model {name} is missing (its row in {table.name} names it)")
            rep = _read_report(where)
        models.append(Model(name, row.get("status") or "ok", row, rep, where))
    return models


def read_peers(path: Path) -> dict[str, dict]:
    """Rows of a bench_corpus results file (JSON lines) by model; the last row of a model wins."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RelsatError(f"--peers {path}: cannot read it ({getattr(e, 'strerror', None) or error_line(e)})") from None
    out = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise RelsatError(f"--peers {path}:{i}: not a JSON line ({error_line(e)})") from None
        if not isinstance(row, dict) or not isinstance(row.get("model"), str):
            raise RelsatError(f"--peers {path}:{i}: not a bench_corpus row (no model name)")
        out[row["model"]] = row
    return out


def attach_peers(models: list[Model], rows: dict[str, dict]) -> None:
    """Each model's peers from its bench_corpus row: at the thread count its report was timed at when
    the row has it, else the fewest threads timed; failed peers with their reason."""
    for m in models:
        row = rows.get(m.name)
        if row is None:
            continue
        timed = sorted(int(k[3:-1]) for k in row if k.startswith("ms_") and k.endswith("t") and k[3:-1].isdigit()
                       and isinstance(row[k], dict))
        want = (m.report or {}).get("threads")
        n = want if want in timed else (timed[0] if timed else None)
        ms = row.get(f"ms_{n}t", {}) if n is not None else {}
        m.peer_threads, m.original_peer_ms = n, _num(ms.get("original"))
        names = [k[:-len("_status")] for k in row if k.endswith("_status")]
        for s in names + [s for s in ms if s not in names and s not in ("original", "relsat")]:
            status = str(row.get(f"{s}_status", "verified"))
            m.peers[s] = {"ms": _num(ms.get(s)), "status": status}
        if _num(ms.get("relsat")) is not None:
            m.peers["relsat (bench)"] = {"ms": _num(ms["relsat"]), "status": "verified"}


# ------------------------------------------------------------------------------------------ numbers
def candidate_speedup(m: Model) -> tuple[float | None, float | None, float | None]:
    """The latency guard's timing of the best candidate against the input model: (speedup, low, high), wall-clock
    medians, the range from the two timings' interquartile ranges (original q1 / candidate q3 .. q3 / q1)."""
    lat = m.latency
    if not lat:
        return None, None, None
    o, p = lat.get("original") or {}, lat.get("optimized") or {}
    lo = hi = None
    if all(_num(x) for x in (o.get("q1_ms"), o.get("q3_ms"), p.get("q1_ms"), p.get("q3_ms"))):
        lo, hi = o["q1_ms"] / p["q3_ms"], o["q3_ms"] / p["q1_ms"]
    return _num(lat.get("speedup")), lo, hi


def speedup(m: Model) -> tuple[float | None, float | None, float | None, str]:
    """relsat's speedup of a model as written: (value, low, high, source).  ``kept`` (1.0) where the input
    model was written unchanged (the best candidate's timing is :func:`candidate_speedup`); ``measured``:
    the guard's wall-clock medians with the range from the two timings' interquartile ranges; else the
    results row's speedup (``predicted``: a cost ratio)."""
    written = (m.report or {}).get("written", m.row.get("written"))
    if m.status == "ok" and written == "original":
        return 1.0, None, None, "kept"
    lat = m.latency
    if lat:
        o, p = lat.get("original") or {}, lat.get("optimized") or {}
        v = _num(lat.get("speedup"))
        lo = hi = None
        if all(_num(x) for x in (o.get("q1_ms"), o.get("q3_ms"), p.get("q1_ms"), p.get("q3_ms"))):
            lo, hi = o["q1_ms"] / p["q3_ms"], o["q3_ms"] / p["q1_ms"]
        if v is not None:
            return v, lo, hi, "measured"
    v = _num(m.row.get("speedup"))
    src = m.row.get("speedup_source") or ""
    if v is None:
        return None, None, None, ""
    return v, None, None, "measured" if src.startswith("measured") else "predicted"


def peer_speedup(m: Model, system: str) -> float | None:
    p = m.peers.get(system) or {}
    if p.get("ms") and m.original_peer_ms:
        return m.original_peer_ms / p["ms"]
    return None


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _e(text) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def _f(v, fmt="{:.3f}", none="&ndash;") -> str:
    v = _num(v)
    return none if v is None else fmt.format(v)


def _ms(v, none="&ndash;") -> str:
    v = _num(v)
    if v is None:
        return none
    if v < 1:
        return f"{v * 1000:.3g}&nbsp;&micro;s"
    return f"{v:.4g}&nbsp;ms"


def _s(v) -> str:
    v = _num(v)
    return "&ndash;" if v is None else (f"{v:.2f}&nbsp;s" if v < 100 else f"{v:.0f}&nbsp;s")


# ------------------------------------------------------------------------------------------ SVG
def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** k
            if lo <= v <= hi:
                ticks.append(v)
    return ticks or [lo, hi]


def _tick_label(v: float) -> str:
    return f"{v:g}" if 1e-3 <= abs(v) < 1e5 or v == 0 else f"{v:.0e}"


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{_e(label)}"><title>{_e(label)}</title>' + "".join(body) + "</svg>")


def _text(x, y, s, *, anchor="start", size=12, cls="", weight=None, fill=None) -> str:
    extra = (f' font-weight="{weight}"' if weight else "") + (f' fill="{fill}"' if fill else "")
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}"{c}{extra}>{_e(s)}</text>'


def _marker(shape: str, x: float, y: float, colour: str, r: float = 5, hollow: bool = False, tip: str = "") -> str:
    fill = "#fff" if hollow else colour
    t = f"<title>{_e(tip)}</title>" if tip else ""
    common = f'fill="{fill}" stroke="{colour}" stroke-width="1.8"'
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {common}>{t}</rect>'
    if shape == "diamond":
        pts = f"{x:.1f},{y - r - 1:.1f} {x + r + 1:.1f},{y:.1f} {x:.1f},{y + r + 1:.1f} {x - r - 1:.1f},{y:.1f}"
        return f'<polygon points="{pts}" {common}>{t}</polygon>'
    if shape == "down":
        pts = f"{x:.1f},{y + r + 1:.1f} {x + r + 1:.1f},{y - r:.1f} {x - r - 1:.1f},{y - r:.1f}"
        return f'<polygon points="{pts}" {common}>{t}</polygon>'
    if shape == "cross":
        d = f"M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}"
        return f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2.4">{t}</path>'
    if shape == "triangle":
        pts = f"{x:.1f},{y - r - 1:.1f} {x + r + 1:.1f},{y + r:.1f} {x - r - 1:.1f},{y + r:.1f}"
        return f'<polygon points="{pts}" {common}>{t}</polygon>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {common}>{t}</circle>'


SHAPES = ("square", "diamond", "triangle", "down", "cross", "square", "diamond", "triangle")


def speedup_plot(models: list[Model], peers: list[str], threshold: float) -> str:
    """relsat's speedup per model with its range, the peers' beside it, the no-change line and the guard's band."""
    rows = list(models)
    if not rows:
        return '<p class="empty">No model to plot.</p>'
    label_w, right, row_h = 200, 110, 30
    width = 1100
    plot_w = width - label_w - right
    legend = [("relsat (measured)", "circle", RELSAT_COLOUR, False),
              ("relsat (predicted cost only)", "circle", RELSAT_COLOUR, True),
              ("input model kept (1x)", "square", "#777", False),
              ("its best candidate, not written", "circle", "#777", True)]
    legend += [(s, SHAPES[i % len(SHAPES)], PEER_COLOURS.get(s, PALETTE[(i + 1) % len(PALETTE)]), False)
               for i, s in enumerate(peers)]
    placed, lx, ly = [], 10, 14
    for item in legend:
        w = 30 + 7 * len(item[0])
        if lx + w > width - 10:
            lx, ly = 10, ly + 20
        placed.append((lx, ly, item))
        lx += w
    top = ly + 32
    values = [1.0 - threshold, 1.0 + threshold]
    for m in rows:
        v, lo, hi, _ = speedup(m)
        values += [x for x in (v, lo, hi, candidate_speedup(m)[0]) if x]
        values += [x for x in (peer_speedup(m, s) for s in peers) if x]
    lo_v, hi_v = min(values), max(values)
    pad = (hi_v - lo_v) * 0.06 or 0.05
    lo_v, hi_v = max(0.0, lo_v - pad), hi_v + pad
    height = top + row_h * len(rows) + 40

    def X(v):
        return label_w + (v - lo_v) / (hi_v - lo_v) * plot_w

    body = []
    bottom = top + row_h * len(rows)
    band = (X(1 / (1 + threshold)), X(1 + threshold))
    body.append(f'<rect x="{band[0]:.1f}" y="{top}" width="{band[1] - band[0]:.1f}" height="{bottom - top}" '
                f'fill="#eee"><title>within the latency guard\'s {threshold:.0%} (noise): the input model is '
                'kept</title></rect>')
    for t in _nice_ticks(lo_v, hi_v, 6):
        x = X(t)
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
        body.append(_text(x, bottom + 16, f"{_tick_label(t)}x", anchor="middle", size=11, cls="axis"))
    x1 = X(1.0)
    body.append(f'<line x1="{x1:.1f}" y1="{top - 6}" x2="{x1:.1f}" y2="{bottom}" stroke="#444" stroke-width="1.2"/>')
    body.append(_text(x1, top - 10, "1x: no change", anchor="middle", size=11, cls="axis"))
    body.append(_text(label_w + plot_w / 2, bottom + 34, "speedup over the input model (higher is faster)",
                      anchor="middle", size=12, cls="axis"))
    for lx, ly, (name, shape, colour, hollow) in placed:
        body.append(_marker(shape, lx + 6, ly, colour, 5, hollow))
        body.append(_text(lx + 16, ly + 4, name, size=12))
    for i, m in enumerate(rows):
        y = top + row_h * i + row_h / 2
        if i % 2:
            body.append(f'<rect x="0" y="{y - row_h / 2:.1f}" width="{width}" height="{row_h}" fill="#000" '
                        'fill-opacity="0.03"/>')
        body.append(f'<a href="#model-{_anchor(m.name)}">' + _text(label_w - 10, y + 4, _clip(m.name, 26),
                                                                       anchor="end", size=12) + "</a>")
        if m.status != "ok":
            body.append(_text(label_w + 6, y + 4, _clip(f"failed: {m.row.get('reason') or ''}", 110), size=12,
                              fill="#b00020"))
            continue
        v, lo, hi, src = speedup(m)
        if v is not None:
            body.append(_text(width - right + 12, y + 4, f"{v:.3f}x" + {"measured": "", "kept": " (kept)"}.get(
                src, " (pred.)"),
                              size=12, weight="600" if src == "measured" else None))
        n = len(peers)
        offsets = [0.0] + [(j + 1) * (row_h * 0.6 / max(n, 1)) - row_h * 0.3 - row_h * 0.3 / max(n, 1)
                           for j in range(n)] if n else [0.0]
        if lo is not None and hi is not None:
            body.append(f'<line x1="{X(lo):.1f}" y1="{y:.1f}" x2="{X(hi):.1f}" y2="{y:.1f}" stroke="{RELSAT_COLOUR}" '
                        f'stroke-width="2"><title>{_e(m.name)}: {lo:.3f}x .. {hi:.3f}x (interquartile ranges of '
                        'the two timings)</title></line>')
            for e in (lo, hi):
                body.append(f'<line x1="{X(e):.1f}" y1="{y - 5:.1f}" x2="{X(e):.1f}" y2="{y + 5:.1f}" '
                            f'stroke="{RELSAT_COLOUR}" stroke-width="2"/>')
        if v is not None:
            cv = candidate_speedup(m)[0]
            why = {"measured": "measured, wall-clock medians", "predicted": "predicted cost ratio",
                   "kept": "the input model was written unchanged"
                           + (f"; the best candidate timed {cv:.3f}x" if cv is not None else "")}[src]
            if src == "kept":
                if cv is not None:
                    body.append(_marker("circle", X(cv), y, "#777", 4.5, True,
                                        f"{m.name}: the best candidate timed {cv:.3f}x; not written"))
                body.append(_marker("square", X(v), y, "#777", 5, False, f"{m.name}: relsat 1x ({why})"))
            else:
                body.append(_marker("circle", X(v), y, RELSAT_COLOUR, 6, src != "measured",
                                    f"{m.name}: relsat {v:.3f}x ({why})"))
        for j, s in enumerate(peers):
            ps = peer_speedup(m, s)
            if ps is None:
                continue
            colour = PEER_COLOURS.get(s, PALETTE[(j + 1) % len(PALETTE)])
            yy = y + (offsets[j + 1] if n > 1 else 0)
            body.append(_marker(SHAPES[j % len(SHAPES)], X(ps), yy, colour, 4.5, False,
                                f"{m.name}: {s} {ps:.3f}x (median, {m.peer_threads} thread(s))"))
    return _svg(width, height, body, "Speedup per model, relsat and peers")


def phases_plot(models: list[Model]) -> str:
    """Seconds per pipeline phase per model, stacked horizontal bars."""
    rows = [(m, {k: v for k, v in ((m.report or {}).get("phases_s") or {}).items() if _num(v) is not None})
            for m in models if m.report]
    rows = [(m, p) for m, p in rows if p]
    if not rows:
        return '<p class="empty">No phase times recorded.</p>'
    names = [k for k in PHASE_ORDER if any(k in p for _, p in rows)]
    names += sorted({k for _, p in rows for k in p} - set(names))
    colour = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(names)}
    label_w, top, row_h, width = 200, 56, 26, 1100
    plot_w = width - label_w - 90
    total = max(sum(p.values()) for _, p in rows) or 1.0
    ticks = _nice_ticks(0, total, 6)
    hi = max(ticks[-1], total)
    bottom = top + row_h * len(rows)
    height = bottom + 40

    def X(v):
        return label_w + v / hi * plot_w

    body, lx, ly = [], 10, 16
    for k in names:
        w = 30 + 7 * len(k)
        if lx + w > width:
            lx, ly = 10, ly + 20
        body.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{colour[k]}"/>')
        body.append(_text(lx + 16, ly, k, size=12))
        lx += w
    for t in ticks:
        body.append(f'<line x1="{X(t):.1f}" y1="{top}" x2="{X(t):.1f}" y2="{bottom}" class="grid"/>')
        body.append(_text(X(t), bottom + 16, f"{_tick_label(t)} s", anchor="middle", size=11, cls="axis"))
    body.append(_text(label_w + plot_w / 2, bottom + 34, "seconds per phase of the pipeline", anchor="middle",
                      size=12, cls="axis"))
    for i, (m, p) in enumerate(rows):
        y = top + row_h * i + 4
        body.append(f'<a href="#model-{_anchor(m.name)}">' + _text(label_w - 10, y + 13, _clip(m.name, 26),
                                                                       anchor="end", size=12) + "</a>")
        x = 0.0
        for k in names:
            if k not in p:
                continue
            w = p[k] / hi * plot_w
            body.append(f'<rect x="{X(x):.2f}" y="{y}" width="{max(w, 0.0):.2f}" height="{row_h - 8}" '
                        f'fill="{colour[k]}"><title>{_e(m.name)}: {_e(k)} {p[k]:.2f} s</title></rect>')
            x += p[k]
        body.append(_text(X(x) + 6, y + 13, f"{x:.1f} s", size=11, cls="axis"))
    return _svg(width, height, body, "Time per phase per model")


def _line_chart(series: list[tuple[str, str, list[tuple[float, float]], bool]], *, width: int, height: int,
                title: str, xlabel: str, ylabel: str) -> str:
    """A small line chart: ``series`` of (name, colour, points, dashed)."""
    left, right, top, bottom_pad = 58, 12, 30, 38
    pts = [p for _, _, s, _ in series for p in s]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_ticks = _nice_ticks(0, max(ys) * 1.05 or 1, 4)
    y_hi = max(y_ticks[-1], max(ys))
    pw, ph = width - left - right, height - top - bottom_pad

    def X(v):
        return left + (v - x_lo) / (x_hi - x_lo) * pw

    def Y(v):
        return top + ph - v / y_hi * ph

    body = [_text(left, 16, title, size=13, weight="600")]
    for t in y_ticks:
        body.append(f'<line x1="{left}" y1="{Y(t):.1f}" x2="{left + pw}" y2="{Y(t):.1f}" class="grid"/>')
        body.append(_text(left - 6, Y(t) + 4, _tick_label(t), anchor="end", size=10, cls="axis"))
    x_ticks = sorted({round(x) for x in xs}) if len(set(xs)) <= 12 else _nice_ticks(x_lo, x_hi, 6)
    for t in x_ticks:
        body.append(_text(X(t), top + ph + 14, _tick_label(t), anchor="middle", size=10, cls="axis"))
    body.append(_text(left + pw / 2, height - 6, xlabel, anchor="middle", size=11, cls="axis"))
    body.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#888"/>')
    lx = left + pw
    for name, colour, s, dashed in reversed(series):
        lx -= 14 + 6.5 * len(name)
        body.append(f'<line x1="{lx:.1f}" y1="{top - 10}" x2="{lx + 10:.1f}" y2="{top - 10}" stroke="{colour}" '
                    f'stroke-width="2"{" stroke-dasharray=&quot;4 3&quot;" if dashed else ""}/>')
        body.append(_text(lx + 13, top - 6, name, size=10))
    for name, colour, s, dashed in series:
        d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s)
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        body.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for x, y in s:
            body.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="{colour}"><title>{_e(name)}, '
                        f'{_e(xlabel)} {x:g}: {y:g}</title></circle>')
    return _svg(width, height, body, f"{title}: {ylabel}")


def growth_plot(m: Model) -> str:
    its = [i for i in (m.report or {}).get("iterations") or [] if isinstance(i, dict)]
    if not its:
        return ""
    rounds = [(_num(i.get("round")) or k + 1) for k, i in enumerate(its)]
    en = [(r, _num(i.get("enodes")) or 0) for r, i in zip(rounds, its)]
    ec = [(r, _num(i.get("eclasses")) or 0) for r, i in zip(rounds, its)]
    return _line_chart([("e-nodes", "#0072B2", en, False), ("e-classes", "#D55E00", ec, True)],
                       width=362, height=210, title=_clip(m.name, 34), xlabel="round", ylabel="e-graph size")


def scatter_plot(models: list[Model]) -> str:
    """Every candidate graph: predicted (x) against measured (y) latency, log axes, one colour per model."""
    pts = []
    for i, m in enumerate(x for x in models if x.report):
        for c in (m.report or {}).get("candidates") or []:
            p, q = _num(c.get("predicted_ms")), _num(c.get("measured_ms"))
            if p and q and p > 0 and q > 0:
                pts.append((m, i, c, p, q))
    if not pts:
        return ('<p class="empty">No candidate was both predicted and measured (timing was off: '
                '<code>--no-measure</code>, <code>--candidates 0</code> or analytic costs).</p>')
    width, height, left, right, top, bottom_pad = 820, 480, 70, 280, 20, 50
    pw, ph = width - left - right, height - top - bottom_pad
    vals = [v for *_, p, q in pts for v in (p, q)]
    lo, hi = min(vals) / 1.25, max(vals) * 1.25
    L = math.log10

    def X(v):
        return left + (L(v) - L(lo)) / (L(hi) - L(lo)) * pw

    def Y(v):
        return top + ph - (L(v) - L(lo)) / (L(hi) - L(lo)) * ph

    body = []
    for t in _log_ticks(lo, hi):
        body.append(f'<line x1="{X(t):.1f}" y1="{top}" x2="{X(t):.1f}" y2="{top + ph}" class="grid"/>')
        body.append(f'<line x1="{left}" y1="{Y(t):.1f}" x2="{left + pw}" y2="{Y(t):.1f}" class="grid"/>')
        body.append(_text(X(t), top + ph + 14, _tick_label(t), anchor="middle", size=10, cls="axis"))
        body.append(_text(left - 6, Y(t) + 4, _tick_label(t), anchor="end", size=10, cls="axis"))
    body.append(f'<line x1="{X(lo):.1f}" y1="{Y(lo):.1f}" x2="{X(hi):.1f}" y2="{Y(hi):.1f}" stroke="#444" '
                'stroke-dasharray="6 4"><title>predicted = measured</title></line>')
    body.append(_text(X(hi) - 6, Y(hi) + 16, "predicted = measured", anchor="end", size=11, cls="axis"))
    body.append(_text(left + pw / 2, height - 14, "predicted latency (ms, log scale)", anchor="middle", size=12,
                      cls="axis"))
    body.append(f'<text transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
                'font-size="12" class="axis">measured latency (ms, log scale)</text>')
    seen = []
    for m, i, c, p, q in pts:
        if (m.name, i) not in seen:
            seen.append((m.name, i))
    for k, (name, i) in enumerate(seen[:22]):
        y = top + 14 + 19 * k
        body.append(_marker("circle", left + pw + 24, y - 4, PALETTE[i % len(PALETTE)], 5))
        body.append(_text(left + pw + 36, y, _clip(name if k < 21 or len(seen) == 22 else f"and {len(seen) - 21} more",
                                                  30), size=12))
    for m, i, c, p, q in pts:
        colour = PALETTE[i % len(PALETTE)]
        status = str(c.get("status") or "")
        shape = "square" if status == "input" else "diamond" if status in WRITTEN else "circle"
        tip = (f"{m.name}, {c.get('label')}: predicted {p:.4g} ms, measured {q:.4g} ms "
               f"(x{q / p:.2f}), {status}")
        body.append(_marker(shape, X(p), Y(q), colour, 5 if shape != "diamond" else 6, status not in
                            ("input", *WRITTEN), tip))
    return _svg(width, height, body, "Predicted against measured latency of every candidate")


def _clip(s: str, n: int) -> str:
    s = str(s)
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _anchor(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else f"_{ord(ch):x}" for ch in str(name))


# ------------------------------------------------------------------------------------------ the page
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1b1b1b;
 margin:0;background:#fafafa}
main{max-width:1320px;margin:0 auto;padding:18px 28px 60px}
h1{font-size:22px;margin:6px 0 2px} h2{font-size:18px;margin:30px 0 6px;border-bottom:1px solid #ddd;
 padding-bottom:4px} h3{font-size:15px;margin:18px 0 4px}
.sub{color:#555;margin:0 0 10px} .note{color:#555;font-size:13px;max-width:900px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:20px} .card span{color:#555;font-size:12px}
table{border-collapse:collapse;background:#fff;font-size:12.5px;margin:6px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-weight:600} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.failed td{background:#fff3f3} .bad{color:#b00020;font-weight:600} .good{color:#0a7a32;font-weight:600}
.muted{color:#777}
svg.plot{background:#fff;border:1px solid #ddd;border-radius:6px;max-width:100%;height:auto;display:block;margin:6px 0}
svg .grid{stroke:#e3e3e3;stroke-width:1} svg .axis{fill:#444} svg text{font-family:inherit}
svg a text{fill:#0b57d0}
.grid2{display:flex;flex-wrap:wrap;gap:12px}
.model{background:#fff;border:1px solid #ddd;border-radius:6px;padding:4px 16px 12px;margin:14px 0}
.empty{color:#777;font-style:italic} code{background:#f0f0f0;padding:0 3px;border-radius:3px}
.wrap{overflow-x:auto}
"""


def _status_cell(m: Model) -> str:
    if m.status != "ok":
        return '<span class="bad">failed</span>'
    return "ok"


def _speedup_cell(m: Model) -> str:
    v, lo, hi, src = speedup(m)
    if v is None:
        return "&ndash;"
    cls = "good" if v > 1.0 and src == "measured" and (m.row.get("written") == "optimized") else ""
    rng = f' <span class="muted">[{lo:.2f}&ndash;{hi:.2f}]</span>' if lo is not None and hi is not None else ""
    mark = {"measured": "", "kept": ' <span class="muted">(input kept)</span>'}.get(
        src, ' <span class="muted">(predicted)</span>')
    cv, clo, chi = candidate_speedup(m)
    if src == "kept" and cv is not None:
        mark += (f'<br><span class="muted">best candidate {cv:.3f}x'
                 + (f" [{clo:.2f}&ndash;{chi:.2f}]" if clo is not None else "") + "</span>")
    return f'<span class="{cls}">{v:.3f}x</span>{rng}{mark}'


def _summary_table(models: list[Model], peers: list[str]) -> str:
    head = ["model", "written", "speedup [IQR range]", "latency before &rarr; after", "nodes in &rarr; out",
            "e-graph: e-nodes / e-classes, rounds", "optimizer", "verify max abs err"] + [
        f"{_e(p)}" for p in peers]
    out = ['<div class="wrap"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for m in models:
        r, rep = m.row, m.report or {}
        name = f'<a href="#model-{_anchor(m.name)}">{_e(m.name)}</a>'
        if m.status != "ok":
            reason = _e(r.get("reason") or "no reason recorded")
            out.append(f'<tr class="failed"><td>{name}</td><td>{_status_cell(m)}</td>'
                       f'<td colspan="{len(head) - 2}">{reason}</td></tr>')  # failed: no written file
            continue
        before, after = r.get("latency_before_ms"), r.get("latency_after_ms")
        cells = [name, _e(r.get("written") or ""), _speedup_cell(m),
                 f"{_ms(before)} &rarr; {_ms(after)}" if _num(before) else "&ndash;",
                 f"{_e(r.get('nodes_in'))} &rarr; {_e(r.get('nodes_out'))}",
                 f"{_e(r.get('enodes'))} / {_e(r.get('eclasses'))}, {_e(r.get('rounds'))} rounds "
                 f"({_e(r.get('stop_reason'))})", _s(r.get("optimizer_s")),
                 _f(r.get("max_abs_err"), "{:.2e}") if (rep.get("verification") or {}).get("draws", 1)
                 else '<span class="muted">not compared</span>']
        for p in peers:
            ps = peer_speedup(m, p)
            st = (m.peers.get(p) or {}).get("status", "")
            cells.append(f"{ps:.3f}x" if ps else (f'<span class="bad" title="{_e(st)}">x</span>'
                                                   if st.startswith("failed") else "&ndash;"))
        numeric = {2, 3, 4, 6, 7} | set(range(8, 8 + len(peers)))
        out.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(cells)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _candidates_table(m: Model) -> str:
    cands = (m.report or {}).get("candidates") or []
    if not cands:
        return '<p class="empty">No candidate graphs were timed (timing off, or no rewrite to try).</p>'
    head = ["candidate", "nodes", "predicted", "profiled", "measured", "wall clock", "measured / predicted", "status"]
    rows = []
    for c in cands:
        p, q = _num(c.get("predicted_ms")), _num(c.get("measured_ms"))
        ratio = f"{q / p:.2f}" if p and q else "&ndash;"
        st = str(c.get("status") or "")
        cls = ' class="good"' if st in WRITTEN else ""
        rows.append(f"<tr><td>{_e(c.get('label'))}</td><td class=\"n\">{_e(c.get('nodes'))}</td>"
                    f'<td class="n">{_ms(p)}</td><td class="n">{_ms(c.get("profiled_ms"))}</td>'
                    f'<td class="n">{_ms(q)}</td><td class="n">{_ms(c.get("wall_ms"))}</td>'
                    f'<td class="n">{ratio}</td><td><span{cls}>{_e(st)}</span></td></tr>')
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _model_section(m: Model, peers: list[str]) -> str:
    r, rep = m.row, m.report or {}
    parts = [f'<section class="model" id="model-{_anchor(m.name)}"><h3>{_e(m.name)}</h3>']
    if r.get("path"):
        parts.append(f'<p class="note">input <code>{_e(r["path"])}</code>'
                     + (f', report <code>{_e(m.report_path)}</code>' if m.report_path else "") + "</p>")
    elif m.report_path:
        parts.append(f'<p class="note">report <code>{_e(m.report_path)}</code></p>')
    if m.status != "ok":
        parts.append(f'<p class="bad">failed: {_e(r.get("reason") or "no reason recorded")}</p>')
        if r.get("detail"):
            parts.append(f"<details><summary>traceback</summary><pre>{_e(r['detail'])}</pre></details>")
        parts.append("</section>")
        return "".join(parts)
    lat = m.latency
    facts = [("written", _e(rep.get("written", r.get("written")))),
             ("cost", f"{_f(rep.get('cost_before'), '{:.4g}')} &rarr; {_f(rep.get('cost_after'), '{:.4g}')} ms "
                      f"({_e(rep.get('cost_label') or rep.get('cost_model'))})"),
             ("threads, provider", f"{_e(rep.get('threads'))}, {_e(rep.get('provider'))}")]
    if lat:
        o, p = lat.get("original") or {}, lat.get("optimized") or {}
        kept = rep.get("written") == "original"
        facts.append(("latency (wall clock), input &rarr; " + ("best candidate (not written)" if kept else "written"),
                      f"{_ms(o.get('median_ms'))} [{_ms(o.get('q1_ms'))} .. {_ms(o.get('q3_ms'))}] &rarr; "
                      f"{_ms(p.get('median_ms'))} [{_ms(p.get('q1_ms'))} .. {_ms(p.get('q3_ms'))}], medians "
                      f"[quartiles] of {_e(lat.get('runs'))} interleaved runs each"))
        facts.append(("CPU time", f"{_ms(lat.get('original_cpu_ms'))} &rarr; {_ms(lat.get('optimized_cpu_ms'))} "
                                  f"({_f(lat.get('cpu_speedup'), '{:.3f}x')}); the guard compared "
                                  f"{'CPU time' if lat.get('metric') == 'cpu' else 'wall clock'}"))
    v = rep.get("verification") or {}
    facts.append(("verification", (("ok" if v.get("ok") else '<span class="bad">FAILED</span>')
                                   + f", max abs error {_f(v.get('max_abs_err'), '{:.2e}')}, "
                                   f"{_e(v.get('draws', 0))} input draws") if v.get("draws")
                  else _e(v.get("message") or "nothing compared")))
    applied = [(k, n) for k, n in (rep.get("rules_applied") or {}).items() if n]
    if applied:
        facts.append(("rules applied", _e(", ".join(f"{k} x{n}" for k, n in applied[:8]))
                      + (f" and {len(applied) - 8} more" if len(applied) > 8 else "")))
    for p in peers:
        st = (m.peers.get(p) or {}).get("status")
        if st:
            ps = peer_speedup(m, p)
            facts.append((_e(p), (f"{ps:.3f}x, " if ps else "") + _e(st)))
    parts.append("<table><tbody>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
                 + "</tbody></table>")
    parts.append("<h3>Candidates</h3>" + _candidates_table(m))
    notices = rep.get("notices") or []
    if notices:
        parts.append("<h3>Notices</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notices) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


def render(src: Source, *, title: str | None = None, now: _dt.datetime | None = None) -> str:
    """The page (module docstring) as text."""
    models = src.models
    ok = [m for m in models if m.status == "ok"]
    failed = [m for m in models if m.status != "ok"]
    known = ("onnxsim", "onnxslim", "onnxoptimizer", "ort-transformers", "relsat-on-onnxsim", "relsat (bench)")
    peers = sorted({s for m in models for s in m.peers},
                   key=lambda s: (known.index(s) if s in known else len(known) - 0.5, s))
    threshold = next((_num((m.latency or {}).get("threshold")) for m in ok if m.latency), None) or 0.03
    measured = [speedup(m)[0] for m in ok if speedup(m)[3] in ("measured", "kept")]  # kept: exactly 1x
    geo = _geomean(measured)
    written = sum(1 for m in ok if m.row.get("written") in ("optimized", "simplified"))
    now = now or _dt.datetime.now(_dt.timezone.utc)
    title = title or f"relsat report: {src.path.name or src.path}"
    total_s = sum(_num(m.row.get("optimizer_s")) or 0 for m in ok)
    cards = [(str(len(models)), "models"), (str(len(ok)), "optimized"), (str(len(failed)), "failed"),
             (str(written), "rewritten graphs written"),
             (f"{geo:.3f}x" if geo else "&ndash;", f"geomean speedup as written, {len(measured)} model(s)"),
             (f"{total_s:.1f} s", "optimizer time, all models")]
    kinds = {"batch": "a relsat batch folder (results.duckdb and the per-model reports)",
             "reports": "a folder of relsat reports", "report": "one relsat optimize report"}
    if peers:
        threads = sorted({m.peer_threads for m in models if m.peer_threads})
        peer_note = (f"Peers from {', '.join(f'<code>{_e(p)}</code>' for p in src.peers_files)} "
                     f"(bench_corpus, timed at {', '.join(map(str, threads))} thread(s)): their speedup is the "
                     "original's median over theirs in the same interleaved timing; bench_corpus records no "
                     "spread for them. <i>relsat (bench)</i> is relsat's own model in that timing.")
    elif src.peers_files:
        peer_note = ("No model of this page is in " + ", ".join(f"<code>{_e(p)}</code>" for p in src.peers_files)
                     + ", so no peer is shown.")
    else:
        peer_note = ("No peers: <code>relsat batch</code> and <code>relsat optimize</code> time no other tool. "
                     "Pass <code>--peers results.jsonl</code> from <code>python -m relsat.benchmarks.bench_corpus "
                     "--out results.jsonl</code> to plot onnxsim, onnxslim and the others beside relsat.")
    metric = next((str((m.report.get("fidelity") or {}).get("metric") or (m.latency or {}).get("metric") or "")
                   for m in ok if m.report), "")
    metric_text = {"cpu": "the median CPU time of the calling thread (the guard's metric at one thread)",
                   "wall": "the wall-clock median"}.get(metric, "the guard's metric")
    growth = [g for g in (growth_plot(m) for m in ok) if g]
    body = [
        f"<main><h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(kinds[src.kind])}: <code>{_e(src.path)}</code> &middot; written by relsat '
        f"{_e(__version__)} on {_e(now.strftime('%Y-%m-%d %H:%M UTC'))}</p>",
        '<div class="cards">' + "".join(f"<div class=\"card\"><b>{v}</b><span>{k}</span></div>" for v, k in cards)
        + "</div>",
        '<h2 id="speedup">Speedup per model</h2>',
        f'<p class="note">Dots: relsat\'s measured speedup, the input model\'s wall-clock median over the written '
        f"model's, from the latency guard's interleaved runs; the whisker runs from the input's first quartile over "
        f"the written model's third to its third over the first (the spread of both timings). Hollow: no "
        f"whole-model timing (<code>--no-measure</code>), the predicted cost ratio instead. Grey squares: the "
        f"input model was written unchanged (1x; the best candidate's timing is in the table and the tooltip). "
        f"The grey band is the guard's {threshold:.0%}: inside it the input model is written unchanged. "
        f"{peer_note}</p>",
        speedup_plot(models, peers, threshold),
        '<h2 id="models">Models</h2>', _summary_table(models, peers),
        '<h2 id="phases">Where the time went</h2>',
        '<p class="note">Seconds per phase of <code>relsat optimize</code> (<code>phases_s</code>): import, '
        "operator profiling, saturation, extraction, in-context profiling rounds, the measured choice among "
        "candidates, export, verification, the latency guard.</p>",
        phases_plot(models),
        '<h2 id="growth">E-graph growth per round</h2>',
        '<p class="note">E-nodes and e-classes after each saturation round (<code>iterations</code>). A flat line '
        "is saturation: no rule adds anything new.</p>",
        '<div class="grid2">' + "".join(growth) + "</div>" if growth
        else '<p class="empty">No saturation rounds recorded.</p>',
        '<h2 id="candidates">Predicted against measured latency</h2>',
        f'<p class="note">Every candidate graph of every model: its predicted latency (the sum of its e-nodes\' '
        f"in-context costs) against its measured one ({metric_text}). Squares: the input model; filled diamonds: "
        "the graph written; open circles: the other candidates. Points above the dashed line ran slower than "
        "predicted. Colours by model (see the tables below); hover a point for its numbers.</p>",
        scatter_plot(models),
        '<h2 id="details">Per model</h2>',
        "".join(_model_section(m, peers) for m in models),
        "</main>",
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta name="generator" content="{GENERATOR} {_e(__version__)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


# ------------------------------------------------------------------------------------------ writing
def is_report_page(path: Path) -> bool:
    """Whether ``path`` is a page this module wrote (its generator mark near the top)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f'<meta name="generator" content="{GENERATOR}'.encode() in head


def default_output(source: Path) -> Path:
    source = Path(source)
    return source / DEFAULT_NAME if source.is_dir() else source.with_suffix(".html")


def check_output(output: Path, src: Source) -> None:
    """Refuse an output path the page must not replace: a folder, a file it reads, anything not a page of ours."""
    output = Path(output)
    if output.is_dir():
        raise RelsatError(f"-o {output}: is a folder; give a file path")
    inputs = [m.report_path for m in src.models if m.report_path] + list(src.peers_files)
    if src.kind == "batch":
        inputs.append(src.path / "results.duckdb")
    for p in inputs:
        try:
            if output.exists() and os.path.samefile(output, p):
                raise RelsatError(f"-o {output}: is {p}, which the page is made from; relsat never overwrites it")
        except OSError:
            pass
        if output.absolute().resolve() == Path(p).absolute().resolve():
            raise RelsatError(f"-o {output}: is {p}, which the page is made from; relsat never overwrites it")
    if output.exists() or output.is_symlink():
        if not output.is_file():
            raise RelsatError(f"-o {output}: exists and is not a regular file; relsat replaces only a relsat report page")
        if not is_report_page(output):
            raise RelsatError(f"-o {output}: exists and is not a relsat report page; relsat replaces only its own "
                              "pages there (remove the file or choose another path)")
    parent = output.absolute().parent
    if parent.exists() and not parent.is_dir():
        raise RelsatError(f"-o {output}: {parent} is a file, not a folder")


def write_report(source, output=None, *, peers=(), title: str | None = None) -> tuple[Path, Source]:
    """Read ``source`` (a batch folder, a folder of reports, or one report) and ``peers`` (bench_corpus JSON
    lines files), check ``output`` (default: ``report.html`` in the folder, or the report's name with
    ``.html``), write the page atomically.  Returns the page's path and what it was made from."""
    src = load(Path(source))
    src.peers_files = [Path(p) for p in peers or ()]
    rows: dict = {}
    for p in src.peers_files:
        rows.update(read_peers(p))
    attach_peers(src.models, rows)
    output = Path(output) if output is not None else default_output(Path(source))
    check_output(output, src)
    text = render(src, title=title)
    try:
        # ASCII with character references: the same bytes whatever the locale's encoding
        write_text_atomic(output, text.encode("ascii", "xmlcharrefreplace").decode("ascii"))
    except OSError as e:
        raise RelsatError(f"-o {output}: cannot write the page ({e.strerror or error_line(e)})") from None
    return output, src


def report(source: Path = typer.Argument(..., help="a relsat batch folder (OUTDIR of relsat batch), a folder of "
                                          "relsat reports, or one report JSON (relsat optimize --report)"),
           output: Optional[Path] = typer.Option(None, "-o", "--output", help="the HTML page (default: "
                                                 "report.html in the folder, or the report's name with .html)"),
           peers: Optional[list[Path]] = typer.Option(None, "--peers", help="bench_corpus results (JSON lines, "
                                                      "python -m relsat.benchmarks.bench_corpus --out FILE); "
                                                      "repeatable"),
           title: Optional[str] = typer.Option(None, "--title", help="the page's title")) -> None:
    """One self-contained HTML page over a batch folder or a report: speedups, phases, e-graph growth, costs.

    Inline SVG plots, no script, works offline: speedup per model beside the peers (``--peers``) with the
    spread, where the time went per phase, e-graph growth per round, predicted against measured latency
    of every candidate."""
    try:
        path, src = write_report(source, output, peers=peers or (), title=title)
    except RelsatError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    ok = sum(1 for m in src.models if m.status == "ok")
    typer.echo(f"{path}: {len(src.models)} model(s), {ok} optimized, {len(src.models) - ok} failed")
