"""benchmarks/compare.py: one small zoo model through every system, verified, timed, reported."""

from __future__ import annotations


import numpy as np
import onnx
import pytest

from relsat.benchmarks import compare
from relsat.driver.boundary.verify import verify

MODEL = "resnet50"  # small variant: BatchNormalization folding gives relsat something to do


def _opts() -> compare.Options:
    # no timing inside relsat (the comparison times the models itself); analytic costs fold the BNs
    return compare.Options(budget_s=0.05, min_runs=3, node_limit=2000, cost_model="analytic",
                           relsat_kwargs={"measure": False})


def _wrong(model, opts, tmp):
    """A system that returns a numerically different model (one weight perturbed)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    w = m.graph.initializer[0]
    arr = onnx.numpy_helper.to_array(w).copy()
    arr += 1.0
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    path = tmp / "wrong.onnx"
    onnx.save(m, path)
    return path, {}


def _crash(model, opts, tmp):
    raise RuntimeError("boom")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    pytest.importorskip("onnxsim")
    pytest.importorskip("onnxoptimizer")
    systems = dict(compare.MAKERS, wrong=_wrong, crash=_crash)
    work = tmp_path_factory.mktemp("compare")
    return compare.compare_model(MODEL, small=True, opts=_opts(), systems=systems, workdir=work,
                                 progress=lambda s: None)


def test_every_system_reported_and_verified(result):
    by = result.by_system()
    assert list(by)[:5] == list(compare.SYSTEMS)
    original = onnx.load(by["original"].path)
    for name in compare.SYSTEMS:
        s = by[name]
        assert s.status == "ok", (name, s.message)
        # checked again here, independently of the status the comparison recorded
        check = verify(original, s.path)
        assert check.ok, (name, check.message)
        assert s.median_ms is not None and s.median_ms > 0 and s.runs >= 3
        assert s.q1_ms <= s.median_ms <= s.q3_ms
        assert len(s.times) == s.runs == by["original"].runs
        assert s.median_ms == pytest.approx(1e3 * float(np.median(s.times)))
        assert s.speedup == pytest.approx(float(np.median(by["original"].times / s.times)))
        assert len(s.cpu_times) == s.runs and (s.cpu_times > 0).all()
        assert s.cpu_speedup == pytest.approx(float(np.median(by["original"].cpu_times / s.cpu_times)))
        assert s.nodes == len(onnx.load(s.path).graph.node)
    assert by["original"].speedup == 1.0
    # BN folding by relsat, onnxsim and onnxoptimizer removes the 19 BatchNormalization nodes
    assert by["relsat"].nodes < by["original"].nodes
    ops = {n.op_type for n in onnx.load(by["relsat"].path).graph.node}
    assert "BatchNormalization" not in ops
    assert by["ort-offline"].foreign_ops > 0  # NCHWc / com.microsoft operators


def test_bad_systems_are_not_timed(result):
    by = result.by_system()
    assert by["wrong"].status == "verification failed" and by["wrong"].median_ms is None
    assert "> tolerance" in by["wrong"].message
    assert by["crash"].status == "error" and "boom" in by["crash"].message and by["crash"].median_ms is None


def test_missing_package_is_reported(tmp_path):
    def missing(model, opts, tmp):
        compare._require("relsat_no_such_package")

    r = compare.compare_model(MODEL, small=True, opts=_opts(), systems={"original": compare.make_original,
                              "ghost": missing}, workdir=tmp_path, progress=lambda s: None)
    assert r.by_system()["ghost"].status == "not installed"
    assert r.by_system()["original"].median_ms > 0


def test_markdown_table_and_section(result, tmp_path):
    ac = [{"system": "relsat", "n": 4, "seconds": 0.5, "peak_mib": 100.0, "enodes": 50, "eclasses": 11,
           "exact": True}, {"system": "egglog", "n": 4, "seconds": 0.01, "peak_mib": 50.0, "enodes": 50,
                            "eclasses": 11, "exact": True}]
    text = compare.render([result], ac, "",
                          command="python -m relsat.benchmarks.compare --small", opts=_opts(),
                          started="2026-01-01 00:00", load=(0.0, 0.0), chart=None)
    lines = text.splitlines()
    assert lines[0] == "## Peer comparison"
    header = next(l for l in lines if l.startswith("| model | original |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    row = next(l for l in lines if l.startswith(f"| {MODEL} (small) |"))
    cells = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
    by = result.by_system()
    for name in compare.SYSTEMS:
        assert cells[name].startswith(f"{by[name].median_ms:.3f}")
    assert cells["wrong"] == "verification failed" and cells["crash"] == "error"
    assert ("| n | e-nodes | e-classes | relsat s | relsat peak MiB (at start) | egglog s | egglog peak MiB (at start) "
            "| exact |") in lines
    assert "| 4 | 50 | 11 | 0.5 | 100.0 | 0.01 | 50.0 | True |" in lines
    # the section replaces itself and leaves the other sections alone
    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\n## Before\n\nkeep me\n\n## Peer comparison\n\nold\n\n## After\n\nkeep me too\n")
    compare.write_section(md, text)
    compare.write_section(md, text)
    out = md.read_text()
    assert out.count("## Peer comparison") == 1 and "\nold\n" not in out
    assert out.index("## Before") < out.index("## Peer comparison") < out.index("## After")
    assert "keep me\n" in out and "keep me too\n" in out
    md2 = tmp_path / "NEW.md"
    md2.write_text("# Results\n")
    compare.write_section(md2, text)
    assert md2.read_text().startswith("# Results\n\n## Peer comparison\n")


def test_chart(result, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "c.png"
    assert compare.chart([result], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paired_verdicts():
    rng = np.random.default_rng(1)
    base = rng.uniform(1.0, 3.0, 400)  # load varies from round to round, alike for both systems

    def res(rel_factor):
        mk = lambda name, t: compare.SystemResult(name, "ok", median_ms=1e3 * float(np.median(t)), times=t,
                                                  speedup=float(np.median(base / t)), runs=len(t))
        return compare.ModelResult("m", True, 1, [mk("original", base), mk("relsat", base * rel_factor),
                                                  mk("onnxsim", base * 0.9)])
    med, lo, hi = compare.paired_ratio(base * 1.5, base)
    assert med == pytest.approx(1.5) and lo == pytest.approx(1.5) and hi == pytest.approx(1.5)
    assert compare.verdicts(res(0.8)).startswith("ahead: relsat / onnxsim = 0.889")
    assert compare.verdicts(res(1.0)).startswith("behind: relsat / onnxsim = 1.111")
    assert compare.verdicts(res(0.91)).startswith("tie: ")
    noisy = base * rng.uniform(0.5, 1.5, 400)  # unpaired noise much larger than the 2% difference
    r = compare.ModelResult("m", True, 1, [
        compare.SystemResult("original", "ok", times=base, speedup=1.0),
        compare.SystemResult("relsat", "ok", times=noisy * 0.98, speedup=1.0),
        compare.SystemResult("onnxsim", "ok", times=base, speedup=1.0)])
    assert compare.verdicts(r).startswith("tie: ")


def test_ac_add_rows():
    pytest.importorskip("egglog")
    rows, note = compare.ac_add([4])
    if not rows:
        pytest.skip(note)
    assert {r["system"].split()[0] for r in rows} == {"relsat", "egglog"}
    for r in rows:  # the exact answer for n = 4: 2^n - n - 1 Add e-classes, 3^n - 2^(n+1) + 1 Add e-nodes
        assert (r["n"], r["eclasses"], r["enodes"], r["exact"]) == (4, 11, 50, True)
        assert r["seconds"] >= 0 and r["peak_mib"] > 0
