"""Interrupts and limits (issue 26, item 3), with the real CLI in a subprocess, real DuckDB and ONNX Runtime.

SIGINT and SIGTERM sent while ``relsat optimize --db`` is busy (its e-graph's temporary file exists) end it with
one line and exit status 130 or 143, no temporary file left, and each of -o, --db and --report whole or absent.
Running out of memory (``--memory-limit``) or of disk (a full ``--temp-dir``, on a small tmpfs mounted when run
as root) ends in one line naming the limit; limits that mean nothing are refused before any work."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from relsat.driver.boundary import zoo
from relsat.driver.boundary.outputs import egraph_problem


def start(*args, cwd: Path):
    env = dict(os.environ, RELSAT_COST_CACHE=str(cwd / "costs.duckdb"), COLUMNS="250")
    return subprocess.Popen([sys.executable, "-c", "from relsat.driver.app.cli import main; main()", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)


def run(*args, cwd: Path):
    p = start(*args, cwd=cwd)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


PHASE_LINE = re.compile(r"^relsat: [a-z ()]+: \d+\.\d\d s$")  # off a terminal, each phase that ended (issue 29)


def one_line(err: str) -> str:
    """The one line the run ended in, after the lines of the phases it finished."""
    lines = [line for line in err.splitlines() if line.strip() and not PHASE_LINE.match(line)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name or p.name.startswith(".relsat"))


def whole_or_absent(folder: Path) -> None:
    if (folder / "o.onnx").exists():
        onnx.checker.check_model(onnx.load(str(folder / "o.onnx")))
    if (folder / "e.duckdb").exists():
        assert egraph_problem(folder / "e.duckdb") is None
    if (folder / "r.json").exists():
        assert "verification" in json.loads((folder / "r.json").read_text())


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "resnet50.onnx"
    zoo.save(zoo.build("resnet50", small=True), path)  # a few seconds of import and saturation
    return path


@pytest.fixture(scope="module")
def busy_model(tmp_path_factory) -> Path:
    """ResNet-50 at full size (100 MB of weights): about 5 s from the e-graph's temporary file to the end
    (derive 2 s, export 1.5 s), so a signal 1.2 s in lands while the run works; the small one's second
    after the file was over before the signal once (CI, 2026-12-04: the process was already at its end)."""
    path = tmp_path_factory.mktemp("busy") / "resnet50.onnx"
    zoo.save(zoo.build("resnet50", small=False), path)
    return path


def interrupt(model: Path, folder: Path, signum: int, delay: float, *extra):
    """Start optimize, wait until its e-graph's temporary file exists (the run is busy), wait ``delay`` more
    seconds and send ``signum``; returns (exit status, stderr)."""
    folder.mkdir()
    # merge's rules keep saturation busy for a few seconds (default alone ends before the longest delay)
    p = start("optimize", model, "-o", "o.onnx", "--db", "e.duckdb", "--report", "r.json", "--rules", "default",
              "--rules", "merge", *extra, cwd=folder)
    deadline = time.monotonic() + 120
    while not any(n.startswith(".e.duckdb.tmp-") for n in os.listdir(folder)):
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(delay)
    p.send_signal(signum)
    _, err = p.communicate(timeout=120)
    return p.returncode, err


# SIGINT at 0.4 s and SIGTERM at 1.2 s by default (each signal; on the full-size model the first lands in
# import, the second in derive, seconds before the run ends); the other four with -m slow (~1-2 s each)
@pytest.mark.parametrize("delay, signum, code", [
    pytest.param(0.0, signal.SIGINT, 130, marks=pytest.mark.slow),
    pytest.param(0.0, signal.SIGTERM, 143, marks=pytest.mark.slow),
    (0.4, signal.SIGINT, 130),
    pytest.param(0.4, signal.SIGTERM, 143, marks=pytest.mark.slow),
    pytest.param(1.2, signal.SIGINT, 130, marks=pytest.mark.slow),
    (1.2, signal.SIGTERM, 143),
], ids=["0.0-2-130", "0.0-15-143", "0.4-2-130", "0.4-15-143", "1.2-2-130", "1.2-15-143"])
def test_a_signal_ends_optimize_in_one_line_and_leaves_no_temporary_file(busy_model, tmp_path, signum, code, delay):
    folder = tmp_path / "run"
    rc, err = interrupt(busy_model, folder, signum, delay, "--cost-model", "analytic", "--no-measure")
    assert rc == code, err
    assert one_line(err).startswith(f"interrupted by {signal.Signals(signum).name}")
    assert leftovers(folder) == []
    whole_or_absent(folder)


def test_sigint_while_profiling_with_measured_costs(model, tmp_path):
    rc, err = interrupt(model, tmp_path / "run", signal.SIGINT, 1.5)  # a fresh cost cache: operators being timed
    assert rc == 130, err
    assert one_line(err).startswith("interrupted by SIGINT")
    assert leftovers(tmp_path / "run") == []
    whole_or_absent(tmp_path / "run")


# 1MB with -m slow: 10KB and 20MB name the limit by default
@pytest.mark.parametrize("limit", ["10KB", pytest.param("1MB", marks=pytest.mark.slow), "20MB"])
def test_running_out_of_memory_is_one_line_naming_the_limit(model, tmp_path, limit):
    rc, _, err = run("optimize", model, "-o", "o.onnx", "--db", "e.duckdb", "--cost-model", "analytic",
                     "--no-measure", "--memory-limit", limit, cwd=tmp_path)
    assert rc == 1
    line = one_line(err)
    assert line.startswith("error: out of memory") and f"--memory-limit {limit}" in line and "raise" in line
    assert leftovers(tmp_path) == [] and not (tmp_path / "o.onnx").exists() and not (tmp_path / "e.duckdb").exists()


def test_a_full_temp_dir_is_one_line_naming_it(model, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        rc, _, err = run("optimize", model, "-o", "o.onnx", "--db", "e.duckdb", "--cost-model", "analytic",
                         "--no-measure", "--memory-limit", "25MB", "--temp-dir", small, cwd=tmp_path)
        line = one_line(err)
        assert rc == 1
        assert (line.startswith(f"error: out of disk space in {small}") and "--temp-dir" in line) or (
            line.startswith("error: out of memory") and "--memory-limit 25MB" in line), line
        assert os.listdir(small) == [] and leftovers(tmp_path) == []
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


# -5GB and 0 with -m slow: 0GB gets the same message from the same check by default
@pytest.mark.parametrize("flag, value, says", [
    pytest.param("--memory-limit", "-5GB", "expected a size above 0", marks=pytest.mark.slow),
    pytest.param("--memory-limit", "0", "expected a size above 0", marks=pytest.mark.slow),
    ("--memory-limit", "0GB", "expected a size above 0"),
    ("--input-shape", "x=0,64", "every dim must be 1 or more"),
    ("--input-shape", "x=99999999999,64", "do not fit in this machine's memory"),
])
def test_limits_that_mean_nothing_are_refused_before_any_work(model, tmp_path, flag, value, says):
    rc, _, err = run("optimize", model, "-o", "o.onnx", "--db", "e.duckdb", flag, value, cwd=tmp_path)
    assert rc == 1
    line = one_line(err)
    assert line.startswith(f"error: {flag} {value}: ") and says in line, line
    assert sorted(os.listdir(tmp_path)) == []  # nothing made, not even the cost cache
