"""Rule files and queries that used to end in a traceback (issue 26, item 4): each ends in one line, with the
file, line and column where there is one.  The real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from relsat.driver.boundary import zoo
from relsat.programs.ir import RuleError
from relsat.programs.parser import MAX_NESTING, load_rules, parse_rules


def relsat(*args, cwd):
    env = dict(os.environ, RELSAT_COST_CACHE=str(cwd / "costs.duckdb"), COLUMNS="250")
    return subprocess.run([sys.executable, "-c", "from relsat.driver.app.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def one_line(r) -> str:
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    path = d / "mlp.onnx"
    zoo.save(zoo.build("bert", small=True), path)
    return path


def nested(depth: int) -> str:
    return "deep: " + "(Relu " * depth + "?x" + ")" * depth + " => (Relu ?x)\n"


def test_a_rule_file_that_is_not_utf8_is_one_line_at_its_first_bad_byte(tmp_path, model):
    (tmp_path / "latin1.rules").write_bytes("relu2: (Relu (Relu ?x)) => (Relu ?x)\n# café\n".encode("latin-1"))
    for args in (("rules", "check", "latin1.rules"), ("rules", "list", "latin1.rules"),
                 ("optimize", model, "-o", "o.onnx", "--rules", "latin1.rules", "--cost-model", "analytic",
                  "--no-measure")):
        line = one_line(relsat(*args, cwd=tmp_path))
        assert line.startswith("error: latin1.rules:2:6: byte 0xe9 is not UTF-8"), line
    assert not (tmp_path / "o.onnx").exists()


def test_an_included_file_that_is_not_utf8_is_reported_where_it_is_and_where_it_is_included(tmp_path):
    (tmp_path / "latin1.rules").write_bytes(b"# caf\xe9\n")
    (tmp_path / "top.rules").write_text('\ninclude "latin1.rules"\n')
    line = one_line(relsat("rules", "check", "top.rules", cwd=tmp_path))
    assert "latin1.rules:1:6: byte 0xe9" in line and "(included at top.rules:2:9)" in line


def test_a_rule_nested_3000_deep_is_one_line_at_the_parenthesis_too_deep(tmp_path, model):
    (tmp_path / "deep.rules").write_text(nested(3000))
    col = len("deep: ") + 6 * MAX_NESTING + 1  # the (MAX_NESTING + 1)-th '('
    for args in (("rules", "check", "deep.rules"),
                 ("optimize", model, "-o", "o.onnx", "--rules", "deep.rules", "--cost-model", "analytic",
                  "--no-measure")):
        line = one_line(relsat(*args, cwd=tmp_path))
        assert line.startswith(f"error: deep.rules:1:{col}: parentheses nested more than {MAX_NESTING} deep"), line


def test_a_rule_nested_as_deep_as_allowed_is_read_and_checked(tmp_path):
    (tmp_path / "ok.rules").write_text(nested(MAX_NESTING - 1))
    assert len(load_rules(tmp_path / "ok.rules").rules) == 1
    with pytest.raises(RuleError, match="nested more than"):
        parse_rules(nested(MAX_NESTING + 1))
    r = relsat("rules", "check", "ok.rules", cwd=tmp_path)
    assert r.returncode == 0 and "deep: ok" in r.stdout, r.stdout + r.stderr


def test_a_folder_given_as_a_rule_file_is_one_line(tmp_path):
    (tmp_path / "dir.rules").mkdir()
    assert one_line(relsat("rules", "check", "dir.rules", cwd=tmp_path)) == "error: dir.rules: is a folder, not a rule file"


def test_an_empty_query_is_one_line(tmp_path, model):
    from relsat.driver.app.optimize import optimize

    # the e-graph is built in this process (a CLI run took ~2 s more); the queries are the CLI's
    optimize(str(model), db=tmp_path / "e.duckdb", cost_model="analytic", measure=False,
             cost_cache=tmp_path / "costs.duckdb")
    assert "the SQL is empty" in one_line(relsat("query", "e.duckdb", "", cwd=tmp_path))
    assert "returns no result" in one_line(relsat("query", "e.duckdb", "-- only a comment", cwd=tmp_path))
    ok = relsat("query", "e.duckdb", "SELECT count(*) AS n FROM eclass", "--format", "csv", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("n\n")
