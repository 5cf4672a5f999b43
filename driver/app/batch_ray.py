"""``relsat batch --executor ray``: each model a Ray task, on this machine or a Ray cluster.

Owns the Ray executor of :func:`relsat.driver.app.batch.run_batch`; everything else of a batch is the
same for both executors: finding the models, resume, ``results.csv`` and ``summary.md``
(:mod:`relsat.driver.app.batch`), running a model and committing its files and row
(:mod:`relsat.driver.app.batch_model`).  Ray is imported
only here, and only when this executor is asked for (``pip install 'relsat[ray]'``).

What runs where:

- The driver (the process running ``relsat batch``) joins the Ray instance at ``address`` (None:
  the one ``ray start`` left on this machine, else a new local one, shut down at the end), submits
  at most ``jobs`` tasks at once and records each model as its task reports it
  (:class:`relsat.driver.app.batch_model.Recorder`).  An address given is probed first: a server that
  does not answer as a gRPC server within ``connect_timeout`` (``--connect-timeout``, 15 s) is a
  one-line error at once, where ``ray.init`` would retry it for minutes, deaf to Ctrl-C.
- A task (:func:`_optimize_task`) reserves ``num_cpus`` = the options' thread count and runs
  :func:`relsat.driver.app.batch_model.model_fields` on whatever node Ray places it: it writes the model's
  files into its stage folder ``OUTDIR/.<name>.stage-ray<N>/`` and the driver moves them into
  place.  So the models, OUTDIR, rule files and ``--costs`` must be at the same paths on every node
  (a shared filesystem), with relsat installed on each.
- The cost cache: a task prices with a cache of its own, a temporary DuckDB file on its node,
  seeded with the driver's cache (exported as Parquet into Ray's object store once, and again after
  rows came back), and returns the rows it added (measured, or imported from ``--costs``) as
  Parquet bytes; the driver merges them into its cache (``$RELSAT_COST_CACHE`` or the user cache),
  where the local executor's workers store them directly.
- Time-outs: a task reports when it starts, and ``model_timeout`` counts from then (time spent
  waiting for free CPUs does not count); a task past it is cancelled with ``force`` (Ray kills its
  worker process).  A task whose worker dies (a crash, the OOM killer) is that model's failure;
  tasks are never retried.  Ray reuses its worker processes across models, so the imports are paid
  once per worker, not once per model as with the local executor.
- Ctrl-C cancels the tasks in flight and removes their stage folders.  A driver killed with SIGKILL
  takes a Ray instance it started down with it, task workers included (seen with Ray 2.60: two of
  its agent processes, ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``, outlived it); the
  stage folders left are removed by the next run, as with the local executor.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import warnings
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from relsat.driver.app.batch_model import ModelTask, Recorder, model_fields, one_line, remove_temps, stage_dir, timeout_reason
from relsat.driver.errors import RelsatError, error_line

INSTALL = "pip install 'relsat[ray]'"


def require_ray():
    """The ``ray`` module, or a one-line RelsatError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise RelsatError(f"--executor ray: Ray is not installed ({INSTALL})") from None
    return ray


DEFAULT_CONNECT_TIMEOUT_S = 15.0
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address ``host:port`` or ``ray://host:port`` (None when it has no port)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def _probe(address: str, timeout_s: float) -> None:
    """Fail within ``timeout_s`` (a one-line RelsatError) unless a gRPC server, as Ray's GCS and its
    client server are, answers at ``address``: a TCP connection, then the HTTP/2 preface answered
    with a SETTINGS frame (the connection alone with ``RAY_USE_TLS``).  ``ray.init`` itself retries
    a missing or silent server for minutes and does not stop on Ctrl-C meanwhile."""
    where = _host_port(address)
    if where is None:
        return  # Ray refuses a malformed address itself, at once
    host, port = where
    if "://" not in address:  # ray.init replaces a loopback host with this node's address
        try:
            from ray._private.services import resolve_ip_for_localhost

            host = resolve_ip_for_localhost(host)
        except Exception:
            pass
    head = f"--executor ray: cannot join a Ray instance at {address}"
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # gRPC over TLS does not answer a plain HTTP/2 preface: the connection must do
            sock.sendall(_H2_PREFACE)
            frame = b""
            while len(frame) < 9:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                chunk = sock.recv(9 - len(frame))
                if not chunk:
                    break
                frame += chunk
    except socket.timeout:
        raise RelsatError(f"{head}: no answer within {timeout_s:g} s (--connect-timeout)") from None
    except OSError as e:
        raise RelsatError(f"{head}: {e.strerror or error_line(e)}") from None
    if len(frame) < 9 or frame[3] != 4:
        raise RelsatError(f"{head}: {host}:{port} answers, but not as a Ray head node (no gRPC server there)")


def check_address(address: str | None, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Probe the Ray address given (``address``, or ``$RAY_ADDRESS`` without one; :func:`_probe`),
    unless this process is connected to Ray already."""
    import ray

    if ray.is_initialized():
        return
    target = address if address not in (None, "auto") else os.environ.get("RAY_ADDRESS") or address
    if target not in (None, "auto", "local"):
        _probe(target, timeout_s)


def _connect(ray, address: str | None, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> bool:
    """Join (or start) a Ray instance unless this process already did; True if it must shut down.
    An address given is probed first (:func:`check_address`)."""
    if ray.is_initialized():
        return False
    check_address(address, timeout_s)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except Exception as e:
        where = f" at {address}" if address else ""
        raise RelsatError(f"--executor ray: cannot start or join a Ray instance{where}: {error_line(e)}") from None
    return True


# ---------------------------------------------------------------- the task (on a Ray worker)


def _optimize_task(task: ModelTask, outdir: Path, options: dict, keep_db: bool, tag: str, seed: bytes | None):
    """A Ray task (a generator): yields ("started", host name) first, then ("done", fields, stage
    folder, the cost rows it added as Parquet bytes or None)."""
    yield ("started", socket.gethostname())
    stage = stage_dir(outdir, task.name, tag)
    if options["cost_model"] != "measured":  # no cost cache, no folder for one
        yield ("done", model_fields(task, outdir, options, keep_db, stage), str(stage), None)
        return
    # (a task killed at its timeout leaves this folder behind: the kill is a SIGKILL)
    with tempfile.TemporaryDirectory(prefix="relsat-ray-costs-") as tmp:
        cache = _seeded_cache(Path(tmp), seed)
        try:
            fields = model_fields(task, outdir, options, keep_db, stage, cost_cache=cache)
            added = _added_rows(cache, Path(tmp), seed)
        finally:  # closed before its folder is removed
            cache.close()
    yield ("done", fields, str(stage), added)


def _seeded_cache(tmp: Path, seed: bytes | None):
    from relsat.extract.cost_cache import CostCache

    cache = CostCache(tmp / "costs.duckdb")
    if seed is not None:
        (tmp / "seed.parquet").write_bytes(seed)
        cache.import_(tmp / "seed.parquet")
    return cache


def _added_rows(cache, tmp: Path, seed: bytes | None) -> bytes | None:
    """The rows of ``cache`` that are not in the seed (new keys, or re-measured), as Parquet bytes."""
    import duckdb

    from relsat.relations.schema import literal

    after, added = tmp / "after.parquet", tmp / "added.parquet"
    cache.export(after)
    query = f"SELECT * FROM read_parquet({literal(str(after))})"
    if seed is not None:
        query += f" EXCEPT SELECT * FROM read_parquet({literal(str(tmp / 'seed.parquet'))})"
    with duckdb.connect() as con:
        con.execute(f"COPY ({query}) TO {literal(str(added))} (FORMAT parquet)")
        n = con.execute(f"SELECT count(*) FROM read_parquet({literal(str(added))})").fetchone()[0]
    return added.read_bytes() if n else None


# ---------------------------------------------------------------- the driver


@dataclass
class _Remote:
    task: ModelTask
    gen: object  # the task's ObjectRefGenerator
    expected: Path  # its stage folder
    started: float  # submitted, then started
    deadline: float | None = None  # set once it starts


class _Costs:
    """The driver's side of the cost cache: the seed the tasks start from, and merging what they add."""

    def __init__(self, ray, tmp: Path):
        from relsat.driver.boundary.outputs import open_cost_cache

        self.ray, self.tmp, self.cache = ray, tmp, open_cost_cache()
        self._seed, self._stale, self._n = None, True, 0

    def seed(self):
        """An object reference to the cache as Parquet bytes (None while it is empty)."""
        if self._stale:
            path = self.tmp / "seed.parquet"
            self._seed = None
            if self.cache.count():
                self.cache.export(path)
                self._seed = self.ray.put(path.read_bytes())
            self._stale = False
        return self._seed

    def merge(self, name: str, added: bytes) -> int:
        self._n += 1
        path = self.tmp / f"added-{self._n}.parquet"
        path.write_bytes(added)
        try:
            n = self.cache.import_(path)
        except Exception as e:  # the cache is locked or unwritable: the model's result stands
            warnings.warn(f"cost rows measured for {name} not merged into {self.cache.path}: {error_line(e)}",
                          stacklevel=2)
            return 0
        finally:
            path.unlink(missing_ok=True)
        self._stale = True
        return n


def _failure(ray, e: Exception) -> dict:
    """The row fields of a task that ended in a Ray error rather than reporting."""
    if isinstance(e, ray.exceptions.RayTaskError):  # raised in the task outside model_fields
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
        return {"reason": one_line(f"internal error: {type(cause).__name__}: {cause}"), "detail": str(e)}
    first = (str(e).strip().splitlines() or [""])[0]
    hint = " (out of memory?)" if isinstance(e, ray.exceptions.OutOfMemoryError) else ""
    return {"reason": one_line(f"worker process died{hint}: {type(e).__name__}: {first}")}


def _cancel(ray, run: _Remote) -> None:
    """Kill a task's worker process and wait (briefly) until Ray says it is gone."""
    ray.cancel(run.gen, force=True)
    try:
        ray.get(next(run.gen), timeout=30)
    except Exception:  # TaskCancelledError, or the worker already gone
        pass


@contextmanager
def ray_executor(address: str | None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S):
    """Connect to Ray (:func:`_connect`, giving up on an address that does not answer within
    ``connect_timeout`` seconds) and give the function that runs a batch's models on it; disconnect
    at the end if this connected."""
    ray = require_ray()
    shutdown = _connect(ray, address, connect_timeout)
    try:
        yield partial(_schedule, ray)
    finally:
        if shutdown:
            ray.shutdown()


def _schedule(ray, todo: deque[ModelTask], rec: Recorder, options: dict, jobs: int,
              model_timeout: float | None) -> None:
    """Run ``todo`` as Ray tasks, at most ``jobs`` at once, recording each model through ``rec``."""
    remote = ray.remote(max_retries=0)(_optimize_task)
    num_cpus = options.get("threads") or 1
    outdir, keep_db = rec.outdir, rec.keep_db
    running: dict[int, _Remote] = {}  # by id() of the generator
    submitted = 0
    with tempfile.TemporaryDirectory(prefix="relsat-batch-") as tmp:
        costs = _Costs(ray, Path(tmp)) if options["cost_model"] == "measured" else None
        try:
            while todo or running:
                while todo and len(running) < jobs:
                    task = todo.popleft()
                    tag = f"ray{submitted}"
                    submitted += 1
                    gen = remote.options(num_cpus=num_cpus, name=f"relsat-batch-{task.name}").remote(
                        task, outdir, options, keep_db, tag, costs.seed() if costs else None)
                    running[id(gen)] = _Remote(task, gen, stage_dir(outdir, task.name, tag), time.monotonic())
                    rec.status(task, "waiting for a Ray worker")
                deadlines = [r.deadline for r in running.values() if r.deadline is not None]
                wait_s = 0.5 if not deadlines else max(0.0, min(0.5, min(deadlines) - time.monotonic()))
                ready, _ = ray.wait([r.gen for r in running.values()], num_returns=1, timeout=wait_s)
                for gen in ready:
                    run = running[id(gen)]
                    try:
                        msg = ray.get(next(gen))
                    except Exception as e:  # a Ray error: the worker died, or the task raised
                        del running[id(gen)]
                        rec.finish(run.task, dict(_failure(ray, e), status="failed",
                                                  wall_s=time.monotonic() - run.started))
                        continue
                    if msg[0] == "started":
                        run.started = time.monotonic()
                        run.deadline = run.started + model_timeout if model_timeout else None
                        rec.status(run.task, f"running on {msg[1]}")
                    else:
                        del running[id(gen)]
                        fields, stage, added = msg[1:]
                        if added is not None:
                            rec.result.costs_merged += costs.merge(run.task.name, added)
                        rec.finish(run.task, fields, stage, run.expected)
                now = time.monotonic()
                for run in [r for r in running.values() if r.deadline is not None and now >= r.deadline]:
                    _cancel(ray, run)
                    del running[id(run.gen)]
                    rec.finish(run.task, {"status": "failed", "wall_s": now - run.started,
                                          "reason": timeout_reason(model_timeout)})
        finally:
            for run in list(running.values()):  # Ctrl-C or an error here: no tasks left, no half files
                _cancel(ray, run)
                remove_temps(outdir, run.task.name)
        if rec.result.costs_merged:
            from rich.markup import escape

            rec.print(f"merged {rec.result.costs_merged} cost rows measured by the Ray tasks into "
                      f"{escape(str(costs.cache.path))}")
