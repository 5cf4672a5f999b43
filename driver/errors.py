"""The one user-facing error type of relsat.

``RelsatError`` is raised for problems the user can fix (a missing or broken model
file, a bad ``--input-shape``, a model ONNX Runtime refuses, a failed
verification).  Its message is one line that names the file, node or input and
the reason; the CLI prints it without a traceback.
"""


class RelsatError(Exception):
    """A user-facing error whose str() is one line naming what failed and why."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
