"""Costs of every catalog operator: its example (tests/catalog_cases.py) imported, priced by the catalog's
FLOP rule (extract/analytic.py) and measured as a one-node model under ONNX Runtime (extract/measured.py,
the node written by relations/onnx_form.py at its domain's opset), with nothing per operator outside
the catalog."""

import math

import pytest

from catalog_cases import IDS, OPERATORS, example_model
from relsat.driver.boundary.onnx_import import import_model
from relsat.extract.analytic import analytic_costs
from relsat.extract.measured import measured_costs


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
def test_operator_is_priced_and_measured(op):
    imported = import_model(example_model(op))
    g = imported.egraph

    def cost():
        return g.sql("SELECT ms, source FROM costs WHERE op = ?", [op.op_type])

    analytic_costs(g)
    ((ms, source),) = cost()
    assert source == "analytic" and ms > 0 and math.isfinite(ms)
    measured_costs(g, imported.opset_imports, sample_budget_s=0.2)
    ((ms, source),) = cost()
    assert source == "measured" and ms > 0 and math.isfinite(ms), (ms, source)
