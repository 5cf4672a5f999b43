"""The ac-add benchmark through the CLI (``bench_ac_add --cli``): a run with the user's defaults (no ``--db``, so
no explanations) counts the e-graph from its report, a ``--db`` run from the file's ``enodes`` view; both reach
the exact e-graph, and the counts agree."""

import os

import pytest

from relsat.benchmarks.bench_ac_add import exact_counts, run_cli


@pytest.mark.skipif(not os.access("/usr/bin/time", os.X_OK), reason="the benchmark reads peak RSS with /usr/bin/time")
def test_the_cli_run_counts_the_same_egraph_with_and_without_a_db():
    plain, kept = run_cli(6, timeout=300), run_cli(6, timeout=300, db=True)
    assert plain["exact"] and kept["exact"], (plain, kept)
    assert (plain["eclasses"], plain["enodes"]) == (kept["eclasses"], kept["enodes"]) == exact_counts(6)
    assert plain["rounds"] == kept["rounds"]
