"""The options `relsat optimize` and `relsat batch` share, declared once.

Each constant is the typer option (flag, default, help) both commands use as a parameter
default; ``optimize_kwargs`` turns the parsed values into the keywords of
``relsat.driver.optimize.optimize``.
"""

from __future__ import annotations

import typer

from .errors import RelsatError

RULES = typer.Option(["default"], "--rules", help="rule set name or .rules file (repeatable)")
INPUT_SHAPE = typer.Option([], "--input-shape", help="NAME=D0,D1,... for dynamic dims")
ITER_LIMIT = typer.Option(10, "--iter-limit")
NODE_LIMIT = typer.Option(2000, "--node-limit")
TIME_LIMIT = typer.Option(60.0, "--time-limit", help="saturation time limit, seconds")
EXTRACTOR = typer.Option("ilp", "--extractor", help="ilp | greedy")
COST_MODEL = typer.Option("measured", "--cost-model", help="measured (ONNX Runtime, cached) | analytic")
PROVIDER = typer.Option("cpu", "--provider", help="cpu | cuda: where costs and latency are measured")
THREADS = typer.Option(1, "--threads", help="intra-op threads for profiling and latency (per worker in batch)")
COSTS = typer.Option(None, "--costs", help="import this cost table (relsat costs export) first")
NO_MEASURE = typer.Option(False, "--no-measure", help="skip the final latency guard")
MIP_GAP = typer.Option(1e-4, "--mip-gap", help="relative MIP gap at which the ILP stops")
ILP_TIME_LIMIT = typer.Option(30.0, "--ilp-time-limit", help="ILP time limit, seconds")


def parse_shapes(specs: list[str]) -> dict[str, list[int]]:
    """``--input-shape NAME=D0,D1,...`` values as {name: dims}."""
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            if not sep:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise RelsatError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with integer dims") from None
    return shapes


def optimize_kwargs(*, rules, input_shape, iter_limit, node_limit, time_limit, extractor, cost_model, provider,
                    threads, costs, no_measure, mip_gap, ilp_time_limit) -> dict:
    """The shared options as keywords of ``optimize`` (``--no-measure`` is ``measure=False``)."""
    return dict(rules=rules, input_shapes=parse_shapes(input_shape) or None, iter_limit=iter_limit,
                node_limit=node_limit, time_limit=time_limit, extractor=extractor, cost_model=cost_model,
                provider=provider, threads=threads, costs=costs, measure=not no_measure, mip_gap=mip_gap,
                ilp_time_limit=ilp_time_limit)
