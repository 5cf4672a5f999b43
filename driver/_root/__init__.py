"""relsat: a tensor-graph superoptimizer (equality saturation in DuckDB, ILP extraction with HiGHS).

The subpackages live in the repository's top-level folders: relsat.relations,
relsat.programs, relsat.driver, relsat.extract and relsat.benchmarks; ``docs/ARCHITECTURE.md``
explains the layers. The Python API::

    from relsat import optimize
    result = optimize("model.onnx", output="fast.onnx", node_limit=5000)
    result.report["nodes_out"], result.report.written
"""

from relsat.driver.version import __version__

__all__ = ["optimize", "Options", "OptimizeResult", "__version__"]


def __getattr__(name: str):
    """``from relsat import optimize`` (and ``Options``, ``OptimizeResult``), imported on first use so
    that ``import relsat`` stays light."""
    if name in ("optimize", "OptimizeResult"):
        from relsat.driver.app import optimize as pipeline

        return getattr(pipeline, name)
    if name == "Options":
        from relsat.driver.options import Options

        return Options
    raise AttributeError(f"module 'relsat' has no attribute {name!r}")
