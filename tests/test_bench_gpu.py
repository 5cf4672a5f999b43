"""benchmarks/bench_gpu.py, the GPU benchmark of issue 25, run with ``--dry-run`` (the same path on the CPU) on
one small zoo model: the Markdown section it writes has a row for the model whose latencies parse back as
numbers and agree with the speedups beside them and with results.json."""

import importlib.util
import json

import pytest

from relsat.benchmarks import bench_gpu


def _table(md: str) -> tuple[list[str], list[list[str]]]:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
            if line.startswith("| ")]
    return rows[0], rows[1:]


def test_dry_run_writes_a_row_per_model_with_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))  # never the user's cost cache
    md_path = tmp_path / "gpu.md"
    bench_gpu.main(["--dry-run", "--models", "squeezenet", "--total-budget", "80", "--out", str(tmp_path / "out"),
                    "--markdown", str(md_path)])
    md = md_path.read_text()
    assert md.strip() == capsys.readouterr().out.strip()
    assert md.startswith("## GPU dry run on the CPU (issue 25): not a GPU figure")
    assert "--dry-run --models squeezenet" in md  # the command is recorded
    head, rows = _table(md)
    assert [r[0] for r in rows] == ["squeezenet"]
    row = dict(zip(head, rows[0]))
    assert row["set"] == "zoo small"
    assert row["written"] in ("original", "optimized"), row["notes"]
    n_in, n_out = (int(x) for x in row["nodes in -> out"].split(" -> "))
    assert n_in == 65 and n_out > 0
    assert "-" not in (row["original ms"], row["relsat ms"]), row["notes"]
    original, relsat = float(row["original ms"]), float(row["relsat ms"])
    assert 0 < original < 1e4 and 0 < relsat < 1e4
    # the speedup is computed from unrounded latencies; the table rounds them (0.2 ms to a few digits)
    assert float(row["relsat speedup"]) == pytest.approx(original / relsat, rel=0.02)
    if importlib.util.find_spec("onnxsim") is not None:  # the bench extra: onnxsim is a peer
        assert row["onnxsim ms"] != "-", row["notes"]
        onnxsim = float(row["onnxsim ms"])
        assert 0 < onnxsim < 1e4
        assert float(row["onnxsim speedup"]) == pytest.approx(original / onnxsim, abs=2e-3)
    assert row["rules fired (applications)"] not in ("", "-")
    float(row["optimize s"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["model"] for r in saved] == ["squeezenet"]
    assert f"{saved[0]['ms']['original']:.3f}" == row["original ms"]


def test_unknown_model_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown model"):
        bench_gpu.main(["--dry-run", "--models", "no_such_model", "--out", str(tmp_path)])
