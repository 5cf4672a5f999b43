"""``relsat report`` (driver/app/report_html.py): the page over a real batch, its content without a
browser, the one-line errors and the output checks, and the page in headless Chromium (Debian's
``chromium`` driven by Playwright): it loads with no console error and no request outside the file,
shows every model and its plots; the screenshot is kept in ``tests/artifacts/`` (ignored by git)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from relsat.driver.app import report_html as R
from relsat.driver.app.batch import run_batch
from relsat.driver.boundary import zoo
from relsat.driver.errors import RelsatError

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MODELS = ("nasrnn", "squeezenet")
PEERS = [
    {"model": "nasrnn", "ms_1t": {"original": 0.052, "relsat": 0.0497, "onnxsim": 0.0515, "onnxslim": 0.0508},
     "onnxsim_status": "verified", "onnxslim_status": "verified", "onnxoptimizer_status": "failed: crash: <boom>"},
]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """A real batch, timing on (latency, candidates): two small zoo models and a broken file."""
    root = tmp_path_factory.mktemp("report_html")
    models = root / "models"
    models.mkdir()
    for name in MODELS:
        zoo.save(zoo.build(name, small=True), models / f"{name}.onnx")
    (models / "broken.onnx").write_bytes(b"not a model")
    mp = pytest.MonkeyPatch()
    mp.setenv("RELSAT_COST_CACHE", str(root / "costs.duckdb"))
    try:
        # one candidate a model (default 3): fewer graphs to time, still a candidate for every plot and table
        res = run_batch(models, root / "out", jobs=1, threads=1, node_limit=300, iter_limit=2, candidates=1)
    finally:
        mp.undo()
    assert {r["model"]: r["status"] for r in res.rows} == {"nasrnn": "ok", "squeezenet": "ok", "broken": "failed"}
    peers = root / "bench.jsonl"
    peers.write_text("".join(json.dumps(r) + "\n" for r in PEERS))
    return root / "out", peers


def _app():
    app = typer.Typer()
    app.command()(R.report)
    return app


def test_the_page_holds_every_model_and_the_reports_numbers(batch):
    out, peers = batch
    res = CliRunner().invoke(_app(), [str(out), "--peers", str(peers)])
    assert res.exit_code == 0, res.output
    page = out / "report.html"
    assert f"{page}: 3 model(s), 2 optimized, 1 failed" in res.output
    text = page.read_text()
    assert text.isascii() and "<script" not in text
    assert not re.search(r"(src|href)\s*=\s*\"(https?:)?//", text)  # nothing fetched: inline SVG and CSS only
    assert text.count('<svg class="plot"') >= 5  # speedup, phases, a growth chart per model, the scatter
    for name in MODELS + ("broken",):
        assert f'id="model-{name}"' in text and f">{name}</a>" in text
    assert "not an ONNX model" in text  # the failure's reason
    for name in MODELS:
        rep = json.loads((out / f"{name}.json").read_text())
        for c in rep["candidates"]:  # every candidate with its predicted latency
            assert R._ms(c["predicted_ms"]) in text
        for k, v in rep["phases_s"].items():
            assert f"{name}: {k} {v:.2f} s" in text  # each phase's seconds, in its bar's tooltip
        for it in rep["iterations"]:
            assert f"round {it['round']:g}: {it['enodes']:g}" in text  # e-nodes per round
        if rep["written"] == "original":
            assert f">{name}</a></td><td>original</td><td class=\"n\"><span class=\"\">1.000x</span>" in text
        elif rep["latency"]:
            assert f"{rep['latency']['speedup']:.3f}x" in text
    # the peers, with the failed one's reason escaped
    assert "onnxsim" in text and f"{0.052 / 0.0515:.3f}x" in text
    assert "crash: &lt;boom&gt;" in text and "<boom>" not in text
    # written again: it replaces its own page
    assert CliRunner().invoke(_app(), [str(out)]).exit_code == 0
    assert "No peers" in page.read_text()


def test_one_report_and_a_folder_of_reports_with_names_as_user_data(batch, tmp_path):
    out, _ = batch
    rep = json.loads((out / "nasrnn.json").read_text())
    one = tmp_path / "r.json"
    one.write_text(json.dumps(rep))
    path, src = R.write_report(one)
    assert path == tmp_path / "r.html" and src.kind == "report" and [m.name for m in src.models] == ["nasrnn"]
    folder = tmp_path / "reports"
    folder.mkdir()
    evil = '<img src=x onerror=alert(1)>&"'
    (folder / f"{evil}.json").write_text(json.dumps(dict(rep, model=None)))
    (folder / "notes.json").write_text('{"not": "a report"}')  # not a report: left out
    path, src = R.write_report(folder, title="<b>mine</b>")
    text = path.read_text()
    assert [m.name for m in src.models] == [evil]
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;&amp;&quot;" in text
    assert "<b>mine</b>" not in text and "&lt;b&gt;mine&lt;/b&gt;" in text


def test_one_line_errors_and_outputs_it_must_not_replace(batch, tmp_path):
    out, _ = batch
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RelsatError, match="no relsat reports here"):
        R.write_report(empty)
    with pytest.raises(RelsatError, match="no such file or folder"):
        R.write_report(tmp_path / "nowhere")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RelsatError, match=r"bad\.json: not a relsat report \(invalid JSON"):
        R.write_report(bad)
    # a batch folder whose report is unreadable
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("*.onnx", "report.html", ".batch.lock"))
    (copy / "nasrnn.json").write_text("[]")
    with pytest.raises(RelsatError, match=r"copy/nasrnn\.json: not a relsat report"):
        R.write_report(copy, tmp_path / "p.html")
    (copy / "nasrnn.json").unlink()
    with pytest.raises(RelsatError, match="the report of model nasrnn is missing"):
        R.write_report(copy, tmp_path / "p.html")
    (copy / "results.duckdb").write_bytes(b"mine")
    with pytest.raises(RelsatError, match="not a relsat batch's results table"):
        R.write_report(copy, tmp_path / "p.html")
    # outputs: a user's file is never replaced, nor the report the page is made from, nor a folder
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my own page</html>")
    good = tmp_path / "good.json"
    good.write_text((out / "nasrnn.json").read_text())
    for target, why in ((mine, "not a relsat report page"), (good, "which the page is made from"),
                        (tmp_path, "is a folder")):
        with pytest.raises(RelsatError, match=why):
            R.write_report(good, target)
    assert mine.read_text() == "<html>my own page</html>"
    res = CliRunner().invoke(_app(), [str(good), "-o", str(mine)])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and res.output.startswith("error: ")
    with pytest.raises(RelsatError, match=r"--peers .*: not a JSON line"):
        R.write_report(good, tmp_path / "x.html", peers=[bad])


def test_the_page_in_headless_chromium(batch):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian's chromium package: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    out, peers = batch
    page_path, src = R.write_report(out, out / "browser.html", peers=[peers])
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report_html.png"
    problems, requests = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            assert problems == []
            assert requests == [page_path.resolve().as_uri()]  # nothing but the page itself
            for m in src.models:
                heading = page.locator(f"#model-{R._anchor(m.name)} h3").first
                assert heading.is_visible() and heading.inner_text() == m.name
                assert page.locator("table a", has_text=m.name).first.is_visible()
            plots = page.locator("svg.plot")
            assert plots.count() == 5  # speedup, phases, two growth charts, predicted vs measured
            for i in range(plots.count()):
                box = plots.nth(i).bounding_box()
                assert box and box["width"] > 300 and box["height"] > 100
            assert page.locator("#speedup ~ svg.plot").first.locator("circle, rect, polygon").count() > 4
            n_cands = sum(len((m.report or {}).get("candidates") or []) for m in src.models)
            scatter = page.locator("svg.plot").last
            assert scatter.locator("circle, rect, polygon").count() >= n_cands
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
