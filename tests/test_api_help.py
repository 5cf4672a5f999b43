"""``help(relsat)`` and ``dir(relsat)`` show the Python API, each name with an example, while ``import
relsat`` stays light: the pipeline is imported on first use of its names (issue 29, item 6)."""

import inspect
import pydoc
import subprocess
import sys

import relsat

API = ("optimize", "Options", "OptimizeResult")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_import_and_dir_do_not_import_the_pipeline():
    """A fresh interpreter: ``import relsat`` and ``dir(relsat)`` list the API without importing
    ``relsat.driver.app.optimize``; the first use of a name imports it."""
    out = _run("import sys, relsat\n"
               "names = dir(relsat)\n"
               "print(all(n in names for n in ('optimize', 'Options', 'OptimizeResult', '__version__')))\n"
               "print('relsat.driver.app.optimize' in sys.modules)\n"
               "relsat.optimize\n"
               "print('relsat.driver.app.optimize' in sys.modules)\n").split()
    assert out == ["True", "False", "True"]


def test_dir_lists_the_api():
    names = dir(relsat)
    assert set(API) | {"__version__"} <= set(names) and names == sorted(names)
    assert relsat.__all__ == ["optimize", "Options", "OptimizeResult", "__version__"]


def test_the_lazy_names_are_the_pipeline_s():
    from relsat.driver.app.optimize import OptimizeResult, optimize
    from relsat.driver.options import Options

    assert (relsat.optimize, relsat.Options, relsat.OptimizeResult) == (optimize, Options, OptimizeResult)
    from relsat import optimize as again  # the form the README uses

    assert again is optimize


def test_help_shows_the_api():
    """What ``help(relsat)`` prints: the description lists every name with an example, and pydoc's
    CLASSES and FUNCTIONS sections document them (with their own examples)."""
    text = pydoc.render_doc(relsat, renderer=pydoc.plaintext)
    description = text.split("CLASSES")[0]
    for name in API:
        assert name in description
    assert "from relsat import optimize" in description and "Options(" in description
    classes = text.split("CLASSES", 1)[1].split("FUNCTIONS", 1)[0]
    functions = text.split("FUNCTIONS", 1)[1]
    assert "class Options(" in classes and "class OptimizeResult(" in classes
    assert "optimize(model_or_path" in functions
    assert text.count("Example::") >= 3  # Options, OptimizeResult, optimize
    assert "VERSION" in text and relsat.__version__ in text


def test_every_api_name_has_a_docstring_with_an_example():
    for name in API:
        doc = inspect.getdoc(getattr(relsat, name))
        assert doc and "Example::" in doc, name
        example = doc.split("Example::", 1)[1]
        assert "from relsat import" in example or "optimize(" in example, name
    for method in ("replace", "as_dict", "check"):
        assert "Options(" in inspect.getdoc(getattr(relsat.Options, method)), method
