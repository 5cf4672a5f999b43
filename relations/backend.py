"""The backend a model is optimized for: ``--provider`` resolved once into what runs and times here.

``Options.backend`` (relsat.driver.options) turns the provider name into a :class:`Backend` with
:func:`resolve`, and that object is passed down: to the one-node profiler (extract/profile.py),
the whole-graph profiler (extract/context.py), the latency guard and the measured choice
(driver/boundary/latency.py, driver/search/candidates.py) and the pipeline (driver/app/optimize.py).  No module below
reads the provider name to decide something; each asks the backend:

- ``session(model, threads=, optimize=)``: an ONNX Runtime session on the backend's execution
  providers (``ort_providers``), ``ProviderMissing`` where ONNX Runtime has none for it here;
- ``timing``: what times one node (``"cpu"``, ``"cuda"`` through onnxruntime-gpu, ``"cuda-torch"``
  through PyTorch), None where nothing can time it here (costs then come from a cost table only);
  ``cost_backends``: whose cached costs stand for it, preferred first;
- ``whole_graph``: what runs and times whole models (``"onnxruntime"``, ``"torch"`` for CUDA
  without onnxruntime-gpu, or None); ``profiles_graphs``: whether ONNX Runtime's profiler can
  give per-kernel times of whole graphs (in-context costs);
- ``contrib``: whether com.microsoft operators run (ONNX Runtime does; the PyTorch fallback runs
  only those it maps);
- ``metric(threads)`` and ``clock(threads)``: how a latency is judged: CPU time of the calling
  thread with one thread on the CPU (ONNX Runtime runs the kernels on that thread, so other
  processes on a shared machine do not count), wall clock otherwise.

``available()`` lists the provider names that can run here.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import onnxruntime as ort

from . import runtime

PROVIDERS = ("cpu", "cuda")  # the --provider values
_ORT = {"cpu": runtime.CPU_PROVIDERS, "cuda": ("CUDAExecutionProvider", *runtime.CPU_PROVIDERS)}


class ProviderMissing(RuntimeError):
    """The execution provider asked for is not available here."""


@dataclass(frozen=True)
class Backend:
    """Where the optimized model is meant to run, as far as this machine can run it (module docstring)."""

    name: str  # the --provider value it was resolved from: "cpu" or "cuda"
    ort_providers: tuple[str, ...]  # ONNX Runtime's providers for it here; () when onnxruntime has none
    torch_cuda: bool = False  # PyTorch with CUDA stands in where onnxruntime-gpu is missing

    @property
    def cuda(self) -> bool:
        return self.name == "cuda"

    @property
    def timing(self) -> str | None:
        if self.ort_providers:
            return self.name
        return "cuda-torch" if self.cuda and self.torch_cuda else None

    @property
    def here(self) -> bool:
        """Whether anything can run (and time) this backend on this machine."""
        return self.timing is not None

    @property
    def cost_backends(self) -> tuple[str, ...]:
        return ("cuda", "cuda-torch") if self.cuda else ("cpu",)

    @property
    def whole_graph(self) -> str | None:
        if self.ort_providers:
            return "onnxruntime"
        return "torch" if self.cuda and self.torch_cuda else None

    @property
    def profiles_graphs(self) -> bool:
        return bool(self.ort_providers)

    @property
    def contrib(self) -> bool:
        return bool(self.ort_providers)

    def metric(self, threads: int) -> str:
        """``"cpu"`` (the calling thread's CPU time) with one thread on the CPU, else ``"wall"``."""
        return "cpu" if threads == 1 and not self.cuda else "wall"

    def clock(self, threads: int):
        return time.thread_time if self.metric(threads) == "cpu" else time.perf_counter

    def unavailable(self) -> str:
        """Why nothing runs this backend here (one line), for errors and notices."""
        return (f"--provider {self.name}: no CUDA here (needs onnxruntime-gpu with a GPU, or PyTorch with CUDA; "
                f"onnxruntime has {', '.join(ort.get_available_providers())})")

    def session(self, model, *, threads: int | None = None, optimize: bool = True,
                options: ort.SessionOptions | None = None) -> ort.InferenceSession:
        """An ONNX Runtime session of ``model`` (ModelProto, bytes or path) on this backend
        (``relations.runtime.session``); ProviderMissing where onnxruntime cannot run it here."""
        if not self.ort_providers:
            raise ProviderMissing(f"provider {self.name!r}: not available in this ONNX Runtime "
                                  f"(available: {', '.join(ort.get_available_providers())})")
        return runtime.session(model, providers=self.ort_providers, threads=threads, optimize=optimize,
                               options=options)


def _torch_cuda() -> bool:
    try:
        import torch
    except (ImportError, OSError):  # no torch, or a torch whose CUDA libraries do not load
        return False
    return bool(torch.cuda.is_available())


@functools.lru_cache(maxsize=None)
def resolve(name: str) -> Backend:
    """The backend for a ``--provider`` value (ValueError for an unknown one); the CUDA one checks
    onnxruntime's providers and PyTorch once."""
    if name not in PROVIDERS:
        raise ValueError(f"--provider {name}: expected {' or '.join(PROVIDERS)}")
    if name == "cpu":
        return CPU
    ort_here = "CUDAExecutionProvider" in ort.get_available_providers()
    return Backend("cuda", _ORT["cuda"] if ort_here else (), torch_cuda=not ort_here and _torch_cuda())


def available() -> list[str]:
    """The provider names that can run here: ``"cpu"`` and possibly ``"cuda"``."""
    return [p for p in PROVIDERS if resolve(p).here]


CPU = Backend("cpu", _ORT["cpu"])
