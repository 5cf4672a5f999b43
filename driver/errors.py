"""The one user-facing error type of relsat.

``RelsatError`` is raised for problems the user can fix (a missing or broken model
file, a bad ``--input-shape``, a model ONNX Runtime refuses, a failed
verification).  Its message is one line that names the file, node or input and
the reason; the CLI prints it without a traceback.  ``resource_error`` turns running
out of memory or disk (DuckDB's out-of-memory error, a full temp directory, ENOSPC,
MemoryError) into one naming the limit and what to raise.
"""

import errno
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


def resource_error(exc: BaseException, *, memory_limit=None, temp_dir=None) -> RelsatError | None:
    """A RelsatError naming the limit that ``exc`` ran into and what to raise, when it is running out of
    memory (the e-graph database's ``--memory-limit``, or the machine's) or of disk (the temp folder DuckDB
    spills to, or the folder being written); None for any other exception.  The exceptions ``exc`` was raised
    while handling count too (a DuckDB transaction aborted by running out of memory fails the next statement
    with "Current transaction is aborted")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = _resource_error(exc, memory_limit, temp_dir)
        if found is not None:
            return found
        exc = exc.__cause__ or exc.__context__
    return None


def _resource_error(exc: BaseException, memory_limit, temp_dir) -> RelsatError | None:
    text = error_line(exc)
    name = type(exc).__name__
    spill = temp_dir or "DuckDB's temp folder (beside --db, or the system's)"
    if "max_temp_directory_size" in text or isinstance(exc, OSError) and exc.errno == errno.ENOSPC \
            or "No space left on device" in text:
        where = (exc.filename if isinstance(exc, OSError) and exc.filename else spill)
        return RelsatError(f"out of disk space in {where} ({_first_sentence(text)}); free space there or point "
                           "--temp-dir at a folder on a larger disk")
    if isinstance(exc, MemoryError) or name == "OutOfMemoryException" or text.startswith("Out of Memory Error"):
        limit = (f"--memory-limit {memory_limit}" if memory_limit is not None
                 else "the e-graph database's default memory limit (80% of this machine's memory)")
        return RelsatError(f"out of memory: the run needed more than {limit} ({_first_sentence(text)}); raise "
                           "--memory-limit (with --temp-dir on a large disk DuckDB spills beyond it), or lower "
                           "--node-limit")
    return None


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.)])\s+(?=[A-Z*])", text, maxsplit=1)[0].rstrip(".")
