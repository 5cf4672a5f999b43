"""benchmarks/bench_gpu.py, the GPU benchmark of issue 25, run with ``--dry-run`` (the same path on the CPU) on
one small zoo model: the Markdown section it writes has a row for the model whose latencies parse back as
numbers and agree with the speedups beside them and with results.json. With ``--jobs 2`` on the two dry-run
models the optimizations overlap and the rows are those ``--jobs 1`` gives."""

import importlib.util
import json
import os
import shutil

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
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
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
        # from the unrounded latencies (the rounded ones can be 0.5 % off at 0.2 ms)
        assert float(row["onnxsim speedup"]) == pytest.approx(saved[0]["ms"]["original"] / saved[0]["ms"]["onnxsim"],
                                                              abs=6e-4)
    assert row["rules fired (applications)"] not in ("", "-")
    float(row["optimize s"])
    assert [r["model"] for r in saved] == ["squeezenet"]
    assert f"{saved[0]['ms']['original']:.3f}" == row["original ms"]


def test_unknown_model_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown model"):
        bench_gpu.main(["--dry-run", "--models", "no_such_model", "--out", str(tmp_path)])


RELSAT_KEYS = {"nodes_out", "written", "rules_fired", "op_changes", "optimize_s", "optimize_start", "optimize_end"}


@pytest.mark.slow  # 25 s: the suite's longest; the dry run above keeps the harness covered by default
def test_jobs_overlap_the_optimizations_and_keep_the_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    runs = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        bench_gpu.main(["--dry-run", "--jobs", str(jobs), "--total-budget", "80", "--out", str(out),
                        "--markdown", str(out / "gpu.md")])
        runs[jobs] = (out / "gpu.md").read_text(), json.loads((out / "results.json").read_text())
    for jobs, (md, saved) in runs.items():
        assert [r["model"] for r in saved] == list(bench_gpu.DRY_MODELS)
        assert [r[0] for r in _table(md)[1]] == list(bench_gpu.DRY_MODELS)
        for r in saved:
            assert r["ms"].get("original", 0) > 0 and RELSAT_KEYS <= set(r), r["notes"]
        assert ("timed afterwards, one model at a time" in md) == (jobs == 2)  # the section says what ran at once
    one, two = runs[1][1], runs[2][1]
    assert [sorted(r) for r in one] == [sorted(r) for r in two]
    assert [sorted(r["ms"]) for r in one] == [sorted(r["ms"]) for r in two]
    assert one[0]["optimize_end"] <= one[1]["optimize_start"]  # one after the other
    a, b = two
    assert a["optimize_start"] < b["optimize_end"] and b["optimize_start"] < a["optimize_end"]  # at the same time


def test_core_slices_give_each_job_cpus_of_its_own():
    cores = set(os.sched_getaffinity(0))
    for n in (1, 2, 3, 64):
        slices = bench_gpu.core_slices(n)
        assert len(slices) == n and all(slices) and set().union(*slices) <= cores
        if n <= len(cores):
            assert sum(map(len, slices)) == len(set().union(*slices))  # disjoint
    assert bench_gpu.core_slices(1) == [tuple(sorted(cores))]
    if shutil.which("taskset"):
        assert bench_gpu._pinned((0, 1)) == ["taskset", "-c", "0,1"]
    assert bench_gpu._pinned(()) == []


def test_a_corpus_model_gets_a_bigger_share_of_phase_one_than_a_small_zoo_model():
    w = bench_gpu.WEIGHT
    assert w["corpus"] > w["zoo small"]
    # equal weights: N over the models left, as before the weights
    assert bench_gpu.share("zoo small", 10 * w["zoo small"], 10, 4) == pytest.approx(0.4)
    # 2 corpus and 8 small zoo models left, 4 jobs: the corpus model's share is its weight's part of N
    mixed = 2 * w["corpus"] + 8 * w["zoo small"]
    assert bench_gpu.share("corpus", mixed, 10, 4) == pytest.approx(4 * w["corpus"] / mixed)
    ratio = bench_gpu.share("corpus", mixed, 10, 4) / bench_gpu.share("zoo small", mixed, 10, 4)
    assert ratio == pytest.approx(w["corpus"] / w["zoo small"])
    # N or fewer left: all of what is left; never more than all of it
    assert bench_gpu.share("zoo small", 3.0, 3, 4) == 1.0
    assert bench_gpu.share("corpus", w["corpus"] + w["zoo small"], 5, 4) <= 1.0


def test_a_failed_runs_line_names_its_error_before_the_advice_that_follows_it():
    """A CUDA fault prints its error, then three lines of advice: the row's note named only the advice (run 1 on the
    H200, four corpus models)."""
    import subprocess
    err = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
           "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
           "CUDA kernel errors might be asynchronously reported at some other API call, so\n"
           "the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
           "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
    line = bench_gpu._tail(subprocess.CompletedProcess([], 1, "", err))
    assert line.startswith("torch.AcceleratorError: CUDA error: device-side assert triggered / ")
    assert line.endswith("enable device-side assertions.")
    plain = bench_gpu._tail(subprocess.CompletedProcess([], 1, "", "a\nb\nValueError: bad\n"))
    assert plain == "a / b / ValueError: bad"  # the error among the last lines: not twice
    assert bench_gpu._tail(subprocess.CompletedProcess([], 3, "", "")) == "exit 3"
