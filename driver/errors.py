"""The one user-facing error type of relsat.

``RelsatError`` is raised for problems the user can fix (a missing or broken model
file, a bad ``--input-shape``, a model ONNX Runtime refuses, a failed
verification).  Its message is one line that names the file, node or input and
the reason; the CLI prints it without a traceback.
"""


import re


def error_line(exc: BaseException) -> str:
    """An exception's whole message on one line (whitespace collapsed, ONNX Runtime's status
    prefix removed)."""
    text = " ".join((str(exc).strip() or type(exc).__name__).split())
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)


class RelsatError(Exception):
    """A user-facing error whose str() is one line naming what failed and why."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
