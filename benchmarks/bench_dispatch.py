"""Skyward's local pool side by side with peers, in one run, reported as ratios.

    python benchmarks/bench_dispatch.py [--workers 4] [--repeat 3]

Peers: the standard library's ``ProcessPoolExecutor`` and ``multiprocessing.Pool``, and
``dask.distributed`` (a ``LocalCluster`` of processes) when it is installed
(``pip install distributed``). Each scenario runs ``--repeat`` times per tool; the best time
is kept. Ratios are peer time / Skyward time: above 1 means Skyward is faster.

Scenarios:
- start: from nothing to N ready workers (and back to nothing).
- round trip: one tiny call at a time, 300 in a row (dispatch latency).
- map: 5,000 tiny calls, results in order (throughput of small tasks).
- broadcast: a 100 MB numpy array to every worker, each returns its sum. Skyward pickles it
  once; the executors pickle it once per task, as users of them do.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

import skyward as sky


def noop(x: int) -> int:
    return x


def total(a: np.ndarray) -> float:
    return float(a.sum())


class Tool:
    """A peer as a uniform set of operations."""

    def __init__(self, name: str, open_: Callable[[int], AbstractContextManager[Any]]) -> None:
        self.name = name
        self.open = open_


@contextmanager
def skyward_pool(n: int) -> Iterator[Any]:
    with sky.ComputePool(nodes=n, quiet=True) as pool:
        yield Ops(
            call=lambda x: pool.run(noop, x),
            map=lambda xs: pool.map(noop, xs),
            broadcast=lambda a: pool.broadcast(total, a),
        )


@contextmanager
def executor_pool(n: int) -> Iterator[Any]:
    with ProcessPoolExecutor(n) as ex:
        list(ex.map(noop, range(n)))  # start every process, as the pool does before it returns
        yield Ops(
            call=lambda x: ex.submit(noop, x).result(),
            map=lambda xs: list(ex.map(noop, xs, chunksize=1)),
            broadcast=lambda a: [f.result() for f in [ex.submit(total, a) for _ in range(n)]],
        )


@contextmanager
def mp_pool(n: int) -> Iterator[Any]:
    with multiprocessing.get_context("fork").Pool(n) as p:
        yield Ops(
            call=lambda x: p.apply(noop, (x,)),
            map=lambda xs: p.map(noop, xs, chunksize=1),
            broadcast=lambda a: [r.get() for r in [p.apply_async(total, (a,)) for _ in range(n)]],
        )


@contextmanager
def dask_pool(n: int) -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(n)
        workers = list(client.scheduler_info()["workers"])

        def broadcast(a: np.ndarray) -> list[float]:
            [data] = client.scatter([a], broadcast=True)
            futures = [client.submit(total, data, workers=[w], pure=False) for w in workers]
            return client.gather(futures)  # type: ignore[no-any-return]

        yield Ops(
            call=lambda x: client.submit(noop, x, pure=False).result(),
            map=lambda xs: client.gather(client.map(noop, xs, pure=False)),
            broadcast=broadcast,
        )


class Ops:
    def __init__(self, **ops: Callable[..., Any]) -> None:
        self.__dict__.update(ops)


def best(repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(tool: Tool, n: int, repeat: int, data: np.ndarray) -> dict[str, float]:
    def cycle() -> None:
        with tool.open(n):
            pass

    results = {"start and stop": best(repeat, cycle)}
    with tool.open(n) as ops:
        results["round trip (per call)"] = (
            best(repeat, lambda: [ops.call(i) for i in range(300)]) / 300
        )
        results["map 5,000"] = best(repeat, lambda: ops.map(range(5000)))
        results["broadcast 100 MB"] = best(repeat, lambda: ops.broadcast(data))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    tools = [
        Tool("skyward", skyward_pool),
        Tool("ProcessPoolExecutor", executor_pool),
        Tool("multiprocessing.Pool", mp_pool),
    ]
    try:
        import distributed  # noqa: F401

        tools.append(Tool("dask.distributed", dask_pool))
    except ImportError:
        print("dask.distributed not installed: skipped (pip install distributed)", file=sys.stderr)

    data = np.random.default_rng(0).random(100_000_000 // 8)
    table = {tool.name: measure(tool, args.workers, args.repeat, data) for tool in tools}
    ours = table["skyward"]
    print(f"\n{args.workers} workers, best of {args.repeat}, Python {sys.version.split()[0]}\n")
    header = f"{'scenario':<24}" + "".join(f"{name:>24}" for name in table)
    print(header)
    print("-" * len(header))
    for scenario, base in ours.items():
        cells = []
        for name, row in table.items():
            value = row[scenario]
            shown = f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"
            ratio = "" if name == "skyward" else f" ({value / base:.2f}x)"
            cells.append(f"{shown}{ratio:>10}")
        print(f"{scenario:<24}" + "".join(f"{c:>24}" for c in cells))
    print("\n(x) = peer time / skyward time; above 1 means skyward is faster")


if __name__ == "__main__":
    main()
