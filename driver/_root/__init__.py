"""A tensor-graph superoptimizer: equality saturation in DuckDB, ILP extraction with HiGHS.

It reads an ONNX model, keeps every equivalent form of its graph that the rewrite rules reach in an
e-graph, extracts the cheapest one and writes it as an ONNX model verified to compute the same
outputs.  The command line is ``relsat`` (``relsat --help``); this is the Python API.

The API (``import relsat`` is light: the pipeline is imported on first use of these names)
------------------------------------------------------------------------------------------

optimize(model_or_path, options=None, *, db=None, output=None, keep_egraph=False, ..., **overrides)
    Optimize one model (a path or an ``onnx.ModelProto``); returns an ``OptimizeResult``.
    Keyword overrides change single fields of the options::

        from relsat import optimize
        result = optimize("model.onnx", output="fast.onnx", node_limit=5000)
        result.report.written, result.report["nodes_out"]

Options(rules=("default",), node_limit=2000, cost_model="measured", measure=True, ...)
    Every knob of an optimization with its default (the CLI's flags), frozen; ``replace`` makes a
    changed copy and ``check`` validates it::

        from relsat import Options, optimize
        opts = Options(cost_model="analytic", measure=False)
        result = optimize("model.onnx", opts.replace(node_limit=500))

OptimizeResult(model, report, egraph=None)
    What ``optimize`` returns: the model written (or that would be), the ``Report`` (a mapping;
    ``report.as_dict()`` is the JSON report) and, with ``keep_egraph=True``, the open e-graph::

        result = optimize("model.onnx", cost_model="analytic", measure=False)
        result.model.graph.node, result.report["verification"]["worst"]

__version__
    The version string (``relsat.__version__``).

The subpackages live in the repository's top-level folders: relsat.relations,
relsat.programs, relsat.driver, relsat.extract and relsat.benchmarks; ``docs/ARCHITECTURE.md``
explains the layers.
"""

from relsat.driver.version import __version__

__all__ = ["optimize", "Options", "OptimizeResult", "__version__"]


def __getattr__(name: str):
    """``from relsat import optimize`` (and ``Options``, ``OptimizeResult``), imported on first use so
    that ``import relsat`` stays light."""
    if name in ("optimize", "OptimizeResult"):
        from relsat.driver.app import optimize as pipeline

        value = getattr(pipeline, name)
    elif name == "Options":
        from relsat.driver.options import Options as value
    else:
        raise AttributeError(f"module 'relsat' has no attribute {name!r}")
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    """The module's names and the lazily imported API (``dir(relsat)``, ``help(relsat)``), without
    importing it."""
    return sorted(set(globals()) | set(__all__))
