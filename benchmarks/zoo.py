"""The model zoo, for the benchmarks: the module :mod:`relsat.driver.zoo` itself, where the builders live
(the command line serves them: ``relsat optimize zoo:NAME``, ``relsat zoo build``).

``relsat.benchmarks.zoo`` is an alias, not a copy: importing it gives that same module object, so that
what is set on it (a test's ``monkeypatch.setattr(zoo, ...)``) is what ``relsat.driver.zoo`` reads.
"""

import sys

from relsat.driver import zoo

sys.modules[__name__] = zoo
