"""Issue 29, item 5: progress and logs. Off a terminal (pipes), ``relsat optimize`` prints one line per phase
with its time as the phase ends, then the summary; ``--quiet`` prints only the path written (and errors);
ONNX Runtime's own log lines stay out unless ``--verbose``; the batch table fits 80 columns.

The real CLI in a subprocess with stdout and stderr piped; real ONNX Runtime and DuckDB."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

F = TensorProto.FLOAT
PHASE = re.compile(r"^relsat: (import|profile|profile \(the [a-z ]+\)|derive|saturate|extract|export|verify|latency|context|choose): \d+\.\d\d s$")


def _relus(n: int = 5) -> onnx.ModelProto:
    names = ["x"] + [f"r{i}" for i in range(n - 1)] + ["y"]
    return helper.make_model(helper.make_graph(
        [helper.make_node("Relu", [a], [b]) for a, b in zip(names, names[1:])], "relus",
        [helper.make_tensor_value_info("x", F, [16, 32])], [helper.make_tensor_value_info("y", F, [16, 32])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def cli(*args, cwd: Path, columns: int = 250):
    env = dict(os.environ, RELSAT_COST_CACHE=str(cwd / "costs.duckdb"), COLUMNS=str(columns))
    p = subprocess.run([sys.executable, "-c", "from relsat.driver.app.cli import main; main()", *map(str, args)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(_relus(), path)
    return path


QUICK = ("--cost-model", "analytic", "--no-measure")


def test_off_a_terminal_one_line_per_phase_with_its_time(tmp_path):
    code, out, err = cli("optimize", _model(tmp_path), "-o", tmp_path / "o.onnx", *QUICK, cwd=tmp_path)
    assert code == 0, err
    lines = err.splitlines()
    assert lines and all(PHASE.match(line) for line in lines), err  # nothing but the phase lines, no control codes
    phases = [line.split(":")[1].strip() for line in lines]
    for name in ("import", "saturate", "extract", "export", "verify"):
        assert phases.count(name) == 1, (name, err)
    assert phases.index("import") < phases.index("saturate") < phases.index("extract") < phases.index("verify")
    assert "\x1b" not in out + err
    # the summary names what was predicted and what decided
    assert "predicted cost" in out and "input " in out and "result" in out
    assert "wrote the optimized model (not timed: the predicted costs decided)" in " ".join(out.split())


def test_quiet_prints_only_the_path(tmp_path):
    code, out, err = cli("optimize", _model(tmp_path), "-o", tmp_path / "o.onnx", "--quiet", *QUICK, cwd=tmp_path)
    assert code == 0, err
    assert out == f"{tmp_path / 'o.onnx'}\n" and err == ""


def test_quiet_still_prints_errors(tmp_path):
    code, out, err = cli("optimize", tmp_path / "missing.onnx", "-o", tmp_path / "o.onnx", "-q", *QUICK,
                         cwd=tmp_path)
    assert code == 1 and out == "" and err.startswith("error:") and len(err.splitlines()) == 1


def test_verbose_prints_every_step(tmp_path):
    code, out, err = cli("optimize", _model(tmp_path), "-o", tmp_path / "o.onnx", "--verbose", *QUICK, cwd=tmp_path)
    assert code == 0, err
    assert "extracting ..." in err.splitlines() and any(PHASE.match(line) for line in err.splitlines())


_ORT_NOISE = """
import onnxruntime as ort, sys
from relsat.driver.app import cli
cli._ort_log(sys.argv[1] == "verbose")
so = ort.SessionOptions()  # a session that logs through the default logger: its warnings are ONNX Runtime's own
so.log_severity_level = -1
sess = ort.InferenceSession(sys.argv[2], so, providers=["CPUExecutionProvider"])
"""


def _noisy(tmp_path: Path) -> Path:
    """A model whose initializer is also a graph input: ONNX Runtime warns about it when loading it."""
    w = helper.make_tensor("w", F, [2], [1.0, 2.0])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("w", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])], [w]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "noisy.onnx"
    onnx.save(model, path)
    return path


def test_onnx_runtime_log_lines_only_with_verbose(tmp_path):
    path = _noisy(tmp_path)
    runs = {mode: subprocess.run([sys.executable, "-c", _ORT_NOISE, mode, str(path)], capture_output=True, text=True)
            for mode in ("quiet", "verbose")}
    assert all(r.returncode == 0 for r in runs.values()), runs
    assert "onnxruntime" not in runs["quiet"].stderr, runs["quiet"].stderr
    assert "onnxruntime" in runs["verbose"].stderr, runs["verbose"].stderr


def test_the_batch_table_fits_80_columns(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a_model_with_a_rather_long_name", "b"):
        onnx.save(_relus(), models / f"{name}.onnx")
    code, out, err = cli("batch", models, "-o", tmp_path / "out", *QUICK, cwd=tmp_path, columns=80)
    assert code == 0, err
    lines = out.splitlines()
    assert lines and max(map(len, lines)) <= 80, out
    # one line per model: its name, status, speedup and nodes together
    for name in ("a_model_with_a_rather_long_name", "b"):
        row = next(line for line in lines if line.startswith(name))
        assert " ok " in row and "5 -> 1" in row, out


def test_long_phases_report_their_steps_for_the_bars():
    """``on_progress`` hears the steps of the long phases (what the terminal's bars show): saturation rounds of
    --iter-limit, a search's steps of --budget; ``on_phase`` every timed phase as it ends."""
    from relsat import optimize

    ticks, ended = [], []
    optimize(_relus(), cost_model="analytic", measure=False, iter_limit=7,
             on_progress=lambda done, total: ticks.append((done, total)), on_phase=lambda n, s: ended.append(n))
    assert ticks and ticks[0] == (1, 7) and all(t == 7 for _, t in ticks)
    assert ended[:1] == ["import"] and "saturate" in ended and ended[-1] == "verify"
    ticks.clear()
    optimize(_relus(), cost_model="analytic", measure=False, search="backtrack", budget=3,
             on_progress=lambda done, total: ticks.append((done, total)))
    assert (1, 3) in ticks


def test_on_a_terminal_no_phase_lines_and_the_live_line_goes():
    import io

    from rich.console import Console

    from relsat import optimize
    from relsat.driver.app import cli

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    with cli._Progress(console) as p:
        optimize(_relus(), cost_model="analytic", measure=False, on_status=p.status, on_progress=p.advance,
                 on_phase=p.phase)
    assert "relsat: import" not in buf.getvalue()


def test_rules_generate_off_a_terminal_one_line_per_step_with_its_time(tmp_path):
    """``rules generate`` printed its steps as they began and then nothing while it verified; off a terminal
    each step is now a line with its time, and ONNX Runtime's own lines stay out."""
    code, out, err = cli("rules", "generate", "--max-ops", "1", "--family", "matrix", "--jobs", "1", "--trials", "1",
                         "--no-prove", "-o", tmp_path / "g.rules", cwd=tmp_path)
    assert code == 0, err
    lines = err.splitlines()
    assert re.fullmatch(r"relsat: enumerating matrix up to 1 operators: \d+\.\d\d s", lines[0]), err
    assert re.fullmatch(r"relsat: verifying \d+ rules under ONNX Runtime: \d+\.\d\d s", lines[1]), err
    assert len(lines) == 2 and "onnxruntime" not in err.lower()
    assert (tmp_path / "g.rules").exists() and "wrote" in out


_RELSAT_SESSION = """
import sys
from relsat.driver.app import cli
from relsat.relations import runtime
cli._ort_log(sys.argv[1] == "verbose")
runtime.session(sys.argv[2])  # a session relsat makes: its own log lines follow --verbose too
"""


def test_relsat_s_own_sessions_log_only_with_verbose(tmp_path):
    path = _noisy(tmp_path)
    runs = {mode: subprocess.run([sys.executable, "-c", _RELSAT_SESSION, mode, str(path)], capture_output=True,
                                 text=True) for mode in ("quiet", "verbose")}
    assert all(r.returncode == 0 for r in runs.values()), runs
    assert "onnxruntime" not in runs["quiet"].stderr, runs["quiet"].stderr
    assert "onnxruntime" in runs["verbose"].stderr, runs["verbose"].stderr


def test_rules_generate_reports_its_verification_count():
    """The long step of ``rules generate`` (verifying the candidates under ONNX Runtime) reports how many
    rules are done of how many, for the terminal's bar: counts that rise to the total, in one process and in
    worker processes."""
    from relsat.driver.app import cli
    from relsat.programs import generate as gen

    for jobs in (1, 2):
        ticks, steps = [], []
        rep = gen.generate(max_ops=1, families=["matrix"], jobs=jobs, trials=1, prove=False, status=steps.append,
                           progress=lambda done, total: ticks.append((done, total)))
        total = len(rep.rules)
        assert total > 1 and ticks[0] == (0, total) and ticks[-1] == (total, total), ticks
        assert all(t == total for _, t in ticks) and [d for d, _ in ticks] == sorted({d for d, _ in ticks})
        assert steps[-1] == f"verifying {total} rules under ONNX Runtime ..."

    # the bar on a terminal shows the count while the step runs, and the line goes at the end
    import io

    from rich.console import Console

    buf = io.StringIO()
    with cli._Progress(Console(file=buf, force_terminal=True, width=100)) as p:
        p.step("verifying 3 rules under ONNX Runtime ...")
        p.advance(2, 3)
        shown = p._bar.get_renderable()
        text = Console(file=io.StringIO(), width=100)
        text.print(shown)
        assert "2/3" in text.file.getvalue() and "verifying 3 rules" in text.file.getvalue()
    assert "relsat: verifying" not in buf.getvalue()
