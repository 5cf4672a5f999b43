"""relsat's version: the one place it is written (the package root re-exports it as ``relsat.__version__``;
the driver stamps it on reports and batch option hashes).  Keep it equal to pyproject.toml's ``version``."""

__version__ = "0.1.0"
