"""What every test shares: a cost cache of the run's own.

Without one, a test that optimizes with measured costs and no ``cost_cache`` reads and writes the user's cost cache
(``$RELSAT_COST_CACHE`` or ``<user cache dir>/relsat/costs.duckdb``): a developer's suite run stored its profiles
and call overheads there, timed while the suite loaded the machine, and later runs of relsat priced with them.  Here
the whole session points ``RELSAT_COST_CACHE`` at a file in its temporary folder (subprocesses inherit it); tests
that set it themselves (``monkeypatch``) still do.
"""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _own_cost_cache(tmp_path_factory):
    before = os.environ.get("RELSAT_COST_CACHE")
    os.environ["RELSAT_COST_CACHE"] = str(tmp_path_factory.mktemp("cost-cache") / "costs.duckdb")
    yield
    if before is None:
        os.environ.pop("RELSAT_COST_CACHE", None)
    else:
        os.environ["RELSAT_COST_CACHE"] = before
