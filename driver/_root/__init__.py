"""relsat: a tensor-graph superoptimizer (equality saturation in DuckDB, ILP extraction with HiGHS).

The subpackages live in the repository's top-level folders: relsat.relations,
relsat.programs, relsat.driver, relsat.extract and relsat.benchmarks.
"""

__version__ = "0.1.0"
