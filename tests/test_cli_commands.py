"""The command line has every command the modules define: explain and report (defined beside what they read)
are reachable through ``relsat``, and the zoo's seed models through ``zoo:NAME`` and ``zoo build seeds``."""

import subprocess
import sys

import onnx

from relsat.driver.boundary import zoo

CLI = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()"]


def relsat(*args, cwd=None):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_explain_and_report_are_commands_that_fail_in_one_line(tmp_path):
    for cmd in ("explain", "report"):
        p = relsat(cmd, tmp_path / "missing")
        assert p.returncode == 1, (cmd, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "missing" in p.stderr, (cmd, p.stderr)
    listed = relsat("--help").stdout
    assert "explain" in listed and "report" in listed


def test_zoo_build_seeds_writes_einnet_s_models(tmp_path):
    p = relsat("zoo", "build", "seeds", "--small", "-o", tmp_path)
    assert p.returncode == 0, p.stderr
    assert sorted(f.stem for f in tmp_path.glob("*.onnx")) == sorted(zoo.SEED_NAMES)
    assert onnx.load(tmp_path / "fsrcnn.onnx").graph.name == "fsrcnn_small"
    p = relsat("zoo", "build", "nope", "-o", tmp_path)
    assert p.returncode == 1 and "longformer" in p.stderr and "seeds" in p.stderr
