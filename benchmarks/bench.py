"""Skyward side by side with Ray, Dask and the standard library, in one run, as ratios.

    pip install -e '.[dev]' -r benchmarks/requirements.txt
    python benchmarks/bench.py              # everything, a few minutes
    python benchmarks/bench.py --quick      # the same scenarios, smaller, under a minute

Writes ``benchmarks/results/<UTC time>.json`` (every sample) and ``.md`` (the table), and
prints the table. Every peer runs in this process tree, on this machine, at the same time:
all pools are open together and the scenarios take turns between them, round by round, so
that noise from other work on the machine falls on every peer alike. Ratios are therefore
only meaningful within one run.

Scenarios (2 nodes or workers unless named):

- ``round trip``: one no-op call at a time, warm (``f() >> pool``, ``ray.get(f.remote())``,
  ``client.submit(f).result()``, ``executor.submit(f).result()``) and two floors: a
  Python pipe echo (a subprocess reading 4-byte-length frames of a small pickled message
  and writing them back, both sides Python, buffered) and a raw pipe (unbuffered ``os.read``
  and ``os.write``) to a process that unpickles a small message and pickles it back.
- ``map``: 10,000 no-op tasks, and 10,000 tasks of 1 ms of CPU work, each peer's way of
  mapping a function over a list; then 10,000 no-op tasks chunked (ours with the automatic
  chunk size, with 1 and with 100 items per call, against ``ProcessPoolExecutor.map`` with
  ``chunksize=1`` and ``100``), on a quiet machine and under ``--load`` busy processes
  (``cpu_load``: endless loops started and stopped by PID), in the same run.
- ``broadcast``: a 100 MB numpy array to every node (``f(a) @ pool``), against two raw pipes
  writing the same bytes in parallel, ``ray.put`` + a task per worker, and ``scatter(...,
  broadcast=True)`` + a task per worker in Dask.
- ``start``: from ``ComputePool(...)`` to ready, 2 and 4 nodes, with and without the jax
  plugin, against as many bare ``python -c "import jax; jax.distributed.initialize(...)"``
  processes (and bare interpreters, for the pool without plugins).
- ``ssh``: a 1-node SSH pool to an OpenSSH server in a network namespace made for the run
  (root and openssh-server needed; ``tests/support/sshhosts.py``), against the ``ssh`` client on the
  same link: no-op round trip, and MB/s for a large argument.
- ``uplink``: a 100 MB broadcast to SSH pools of 2 and 4 hosts (root, openssh-server and
  ``tc``), with the client's side of the bridge shaped to 200 Mbit/s and the hosts free to
  talk to each other at full speed, against the physical floor (the payload ÷ the rate).

Processes we start are stopped by PID or by their own shutdown calls, in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import pickle
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import skyward as sky

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NODES = 2


# ── the work every peer runs ─────────────────────────────────────────────────────────────


def noop(x: Any = None) -> Any:
    return x


def spin_1ms(x: Any = None) -> Any:
    # CPU work rather than sleep: a sleeping worker frees its core for the dispatcher, which
    # would flatter whichever peer has the busiest client.
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
    return x


def nbytes(a: np.ndarray) -> int:
    # Touch the array only as much as the transport must have delivered it: its last byte.
    return int(a.nbytes) + int(a[-1] * 0)


sky_noop = sky.compute(noop)
sky_nbytes = sky.compute(nbytes)


# ── statistics and the report ────────────────────────────────────────────────────────────


@dataclass
class Series:
    """Samples of one tool in one scenario. ``per`` turns a sample into a rate (tasks/s)."""

    samples: list[float] = field(default_factory=list)
    per: float = 0

    def summary(self) -> dict[str, float]:
        xs = sorted(self.samples)
        if not xs:
            return {}
        p99 = xs[min(len(xs) - 1, max(0, math.ceil(0.99 * len(xs)) - 1))]
        out = {
            "n": len(xs),
            "median": statistics.median(xs),
            "p99": p99,
            "min": xs[0],
            "max": xs[-1],
        }
        if self.per:
            out["rate_median"] = self.per / out["median"]
        return out


@dataclass
class Scenario:
    title: str
    tools: dict[str, Series] = field(default_factory=dict)
    note: str = ""
    skipped: str = ""
    rate_unit: str = "tasks/s"  # what ``per`` counts, per second

    def series(self, tool: str, per: int = 0) -> Series:
        return self.tools.setdefault(tool, Series(per=per))


class Report:
    def __init__(self) -> None:
        self.scenarios: dict[str, Scenario] = {}

    def scenario(self, key: str, title: str, note: str = "") -> Scenario:
        return self.scenarios.setdefault(key, Scenario(title, note=note))

    def median(self, key: str, tool: str) -> float | None:
        scenario = self.scenarios.get(key)
        if scenario is None or tool not in scenario.tools or not scenario.tools[tool].samples:
            return None
        return statistics.median(scenario.tools[tool].samples)


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def markdown(report: Report, machine: dict[str, Any], targets: list[dict[str, Any]]) -> str:
    lines = [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
        f"{machine['when']}; versions: {machine['versions']}.",
        "",
        "`÷ first` is each tool's median over the first row's median in the same scenario "
        "(below 1: faster than the first row).",
        "",
    ]
    for key, scenario in report.scenarios.items():
        lines.append(f"### {scenario.title}")
        lines.append("")
        if scenario.skipped:
            lines += [f"Skipped: {scenario.skipped}", ""]
            continue
        if scenario.note:
            lines += [scenario.note, ""]
        first = next(iter(scenario.tools.values()), None)
        base = statistics.median(first.samples) if first and first.samples else None
        rate = any(s.per for s in scenario.tools.values())
        head = "| tool | median | p99 | min | max | n |" + (
            f" {scenario.rate_unit} |" if rate else ""
        )
        lines += [head + " ÷ first |", "|" + "---|" * (head.count("|") - 1 + 1)]
        for tool, series in scenario.tools.items():
            s = series.summary()
            if not s:
                lines.append(f"| {tool} | failed | | | | |" + (" |" if rate else "") + " |")
                continue
            row = (
                f"| {tool} | {_fmt(s['median'])} | {_fmt(s['p99'])} | {_fmt(s['min'])} | "
                f"{_fmt(s['max'])} | {s['n']} |"
            )
            if rate:
                row += f" {s['rate_median']:,.0f} |" if "rate_median" in s else " |"
            row += f" {s['median'] / base:.2f} |" if base else " |"
            lines.append(row)
        lines.append("")
        del key
    lines += ["### Targets", "", "| target | measured | met |", "|---|---|---|"]
    for target in targets:
        measured = "n/a" if target["ratio"] is None else f"{target['ratio']:.2f}x"
        met = {True: "yes", False: "**no**", None: "not measured"}[target["met"]]
        lines.append(f"| {target['name']} | {measured} | {met} |")
    return "\n".join(lines) + "\n"


def _floor_tool(report: Report, nodes: int) -> str:
    scenario = report.scenarios.get(f"uplink{nodes}")
    names = scenario.tools if scenario else {}
    return next((name for name in names if name.startswith("physical floor")), "")


def evaluate_targets(report: Report) -> list[dict[str, Any]]:
    """The issue's targets, as ratios of medians from this run."""

    def ratio(key: str, ours: str, theirs: str) -> float | None:
        a, b = report.median(key, ours), report.median(key, theirs)
        return None if a is None or b is None else a / b

    rows: list[tuple[str, float | None, float]] = [
        ("no-op round trip ≤ 0.25x Ray's", ratio("roundtrip", "skyward >>", "ray"), 0.25),
        (
            "no-op round trip ≤ 3x the Python pipe echo",
            ratio("roundtrip", "skyward >>", "Python pipe echo (floor)"),
            3.0,
        ),
        (
            "no-op round trip ≤ 3x the raw pipe floor",
            ratio("roundtrip", "skyward >>", "raw pipe echo (floor)"),
            3.0,
        ),
        (
            "no-op round trip ≤ 3x the Python pipe echo, both on one core",
            ratio("roundtrip_placed", "skyward >> (one core)", "Python pipe echo (one core)"),
            3.0,
        ),
        (
            "no-op round trip ≤ 3x the Python pipe echo, on two cores",
            ratio("roundtrip_placed", "skyward >> (two cores)", "Python pipe echo (two cores)"),
            3.0,
        ),
        (
            "10,000 no-op tasks at least as fast as ProcessPoolExecutor (time ratio ≤ 1)",
            ratio("map_noop", "skyward pool.map", "ProcessPoolExecutor.map"),
            1.0,
        ),
        (
            f"10,000 no-op tasks, chunksize={CHUNK}, quiet: at least ProcessPoolExecutor's "
            f"(time ratio ≤ 1)",
            ratio(
                "map_chunks",
                f"skyward pool.map chunksize={CHUNK}",
                f"ProcessPoolExecutor.map chunksize={CHUNK}",
            ),
            1.0,
        ),
        (
            f"10,000 no-op tasks, chunksize={CHUNK}, under load: at least ProcessPoolExecutor's",
            ratio(
                "map_chunks_loaded",
                f"skyward pool.map chunksize={CHUNK}",
                f"ProcessPoolExecutor.map chunksize={CHUNK}",
            ),
            1.0,
        ),
        (
            "10,000 no-op tasks, chunksize=1 both, under load: at least ProcessPoolExecutor's",
            ratio(
                "map_chunks_loaded",
                "skyward pool.map chunksize=1",
                "ProcessPoolExecutor.map chunksize=1",
            ),
            1.0,
        ),
        (
            "10,000 no-op tasks under load, ours by default (auto chunks) against "
            "ProcessPoolExecutor by default (chunksize=1)",
            ratio(
                "map_chunks_loaded",
                "skyward pool.map (auto chunks)",
                "ProcessPoolExecutor.map chunksize=1",
            ),
            1.0,
        ),
        (
            "100 MB to 2 nodes within 1.5x of two raw pipes in parallel",
            ratio("broadcast", "skyward @", "2 raw pipes in parallel (floor)"),
            1.5,
        ),
    ]
    for nodes in (2, 4):
        rows.append(
            (
                f"start {nodes} nodes with the jax plugin within 1.3x of bare JAX processes",
                ratio(f"start{nodes}", "skyward + jax plugin", "bare jax processes"),
                1.3,
            )
        )
    ssh_rt = report.median("ssh_roundtrip", "skyward >> (SSH pool)")
    rows.append(
        (
            "over SSH: no-op round trip ≤ 1 ms (measured: median ÷ 1 ms)",
            None if ssh_rt is None else ssh_rt / 1e-3,
            1.0,
        )
    )
    for nodes in (2, 4):
        rows.append(
            (
                f"slow uplink: a broadcast to {nodes} hosts within 1.3x of the physical floor",
                ratio(f"uplink{nodes}", f"skyward @ ({nodes} hosts)", _floor_tool(report, nodes)),
                1.3,
            )
        )
    out = [
        {
            "name": name,
            "ratio": value,
            "limit": limit,
            "met": None if value is None else value <= limit,
        }
        for name, value, limit in rows
    ]
    # Throughput is "at least": OpenSSH's time over ours is our share of its MB/s.
    share = ratio("ssh_bulk", "ssh 'cat > /dev/null', default cipher", "skyward >> (SSH pool)")
    out.append(
        {
            "name": "over SSH: large-argument MB/s ≥ 50% of the OpenSSH client's "
            "(measured: ours ÷ theirs)",
            "ratio": share,
            "limit": 0.5,
            "met": None if share is None else share >= 0.5,
        }
    )
    return out


# ── peers ────────────────────────────────────────────────────────────────────────────────

# The floor: a process that echoes length-prefixed pickles, in the same framing spirit as
# skyward's (length, then bytes), with the same 1 MiB pipes skyward uses.
_ECHO = r"""
import os, pickle, struct, sys
r, w = open(0, "rb", buffering=0), open(1, "wb", buffering=0)
def exact(n):
    buf = bytearray(n); view = memoryview(buf); got = 0
    while got < n:
        k = r.readinto(view[got:])
        if not k: sys.exit(0)
        got += k
    return buf
while True:
    (n,) = struct.unpack("!Q", exact(8))
    if n >> 63:                      # bulk: read the bytes into one buffer, answer 1 byte
        exact(n & ~(1 << 63)); w.write(b"k"); continue
    msg = pickle.loads(exact(n))
    out = pickle.dumps(msg, protocol=5)
    w.write(struct.pack("!Q", len(out)) + out)
"""


# The Python floor (issue 15): the same echo written as ordinary Python would write it, both
# ends through buffered file objects, 4-byte lengths: what any Python process pair talking
# over a pipe pays for one small message each way, with no thread, no future, no framing of
# our own. The raw floor above skips the buffered layers and the flush.
_PY_ECHO = r"""
import pickle, struct, sys
r, w = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = r.read(4)
    if len(head) < 4:
        break
    (n,) = struct.unpack("!I", head)
    msg = pickle.loads(r.read(n))
    out = pickle.dumps(msg, protocol=5)
    w.write(struct.pack("!I", len(out)) + out)
    w.flush()
"""


class PythonPipe:
    """The Python pipe echo: a subprocess reading 4-byte-length frames of a small pickled
    message and writing them back; both sides Python, buffered."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _PY_ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.process.stdin and self.process.stdout
        self._w, self._r = self.process.stdin, self.process.stdout

    def echo(self, message: object) -> object:
        data = pickle.dumps(message, protocol=5)
        self._w.write(struct.pack("!I", len(data)) + data)
        self._w.flush()
        (n,) = struct.unpack("!I", self._r.read(4))
        return pickle.loads(self._r.read(n))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()


class RawPipe:
    """A child process on two pipes: the lower bound for anything that uses pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ECHO],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self.process.stdin and self.process.stdout
        self._w = self.process.stdin.fileno()
        self._r = self.process.stdout.fileno()
        for fd in (self._w, self._r):
            with contextlib.suppress(OSError):
                import fcntl

                fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ, as skyward's pipes

    def _exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self._r, n)
            if not chunk:
                raise EOFError("echo process ended")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def echo(self, message: object) -> object:
        data = pickle.dumps(message, protocol=5)
        os.write(self._w, struct.pack("!Q", len(data)) + data)
        (n,) = struct.unpack("!Q", self._exact(8))
        return pickle.loads(self._exact(n))

    def bulk(self, buffer: memoryview) -> None:
        os.write(self._w, struct.pack("!Q", buffer.nbytes | (1 << 63)))
        view = buffer.cast("B")
        while view.nbytes:
            view = view[os.write(self._w, view) :]
        self._exact(1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()


@dataclass
class Peers:
    """Everything open at once: the same moment for every tool."""

    pool: Any
    pipes: list[RawPipe]
    python_pipe: PythonPipe
    executor: ProcessPoolExecutor | None = None
    ray: Any = None
    ray_fns: dict[str, Any] = field(default_factory=dict)
    dask: Any = None
    dask_workers: list[str] = field(default_factory=list)


def _open_ray(stack: ExitStack, peers: Peers) -> None:
    try:
        import ray
    except ImportError as exc:
        print(f"ray: skipped ({exc}); pip install -r benchmarks/requirements.txt")
        return
    ray.init(
        num_cpus=NODES,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=400 * 2**20,
    )
    stack.callback(ray.shutdown)
    peers.ray = ray
    peers.ray_fns = {
        "noop": ray.remote(noop),
        "spin_1ms": ray.remote(spin_1ms),
        "nbytes": ray.remote(nbytes),
    }
    ray.get([peers.ray_fns["noop"].remote(i) for i in range(200)])  # start its workers


def _open_dask(stack: ExitStack, peers: Peers) -> None:
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        print(f"dask: skipped ({exc}); pip install -r benchmarks/requirements.txt")
        return
    cluster = stack.enter_context(
        LocalCluster(
            n_workers=NODES,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=50,
        )
    )
    client = stack.enter_context(Client(cluster))
    client.wait_for_workers(NODES)
    peers.dask = client
    peers.dask_workers = list(client.scheduler_info()["workers"])


@contextlib.contextmanager
def open_peers(args: argparse.Namespace) -> Iterator[Peers]:
    with ExitStack() as stack:
        pool = stack.enter_context(sky.ComputePool(nodes=NODES, quiet=True))
        pipes = [RawPipe() for _ in range(NODES)]
        for pipe in pipes:
            stack.callback(pipe.close)
        python_pipe = PythonPipe()
        stack.callback(python_pipe.close)
        peers = Peers(pool=pool, pipes=pipes, python_pipe=python_pipe)
        import multiprocessing

        # spawn: forking a process that already runs Ray's and Dask's threads is unsafe.
        executor = ProcessPoolExecutor(NODES, mp_context=multiprocessing.get_context("spawn"))
        stack.callback(executor.shutdown, cancel_futures=True)
        list(executor.map(noop, range(200)))
        peers.executor = executor
        if "ray" not in args.skip:
            _open_ray(stack, peers)
        if "dask" not in args.skip:
            _open_dask(stack, peers)
        yield peers


Tool = tuple[str, Callable[[], Any]]


# ── scenarios ────────────────────────────────────────────────────────────────────────────


def _rotations(items: list[Any], rounds: int) -> Iterator[list[Any]]:
    for r in range(rounds):
        k = r % len(items)
        yield items[k:] + items[:k]


def roundtrip(report: Report, peers: Peers, calls: int, rounds: int) -> None:
    scenario = report.scenario(
        "roundtrip",
        "No-op round trip, sequential, warm (per call)",
        f"{rounds} rounds x {calls} calls per tool, tools interleaved round by round.",
    )
    pool, pipe, python_pipe = peers.pool, peers.pipes[0], peers.python_pipe
    tools: list[tuple[str, Callable[[], Any]]] = [
        ("skyward >>", lambda: sky_noop() >> pool),
        ("Python pipe echo (floor)", lambda: python_pipe.echo(("noop", (), {}))),
        ("raw pipe echo (floor)", lambda: pipe.echo(("noop", (), {}))),
    ]
    if peers.executor is not None:
        ex = peers.executor
        tools.append(("ProcessPoolExecutor", lambda: ex.submit(noop).result()))
    if peers.ray is not None:
        ray, fn = peers.ray, peers.ray_fns["noop"]
        tools.append(("ray", lambda: ray.get(fn.remote())))
    if peers.dask is not None:
        client = peers.dask
        tools.append(("dask", lambda: client.submit(noop, pure=False).result()))
    for name, _ in tools:
        scenario.series(name)
    for _, call in tools:  # warm: imports, caches, connections
        for _ in range(20):
            call()
    clock = time.perf_counter
    for order in _rotations(tools, rounds):
        for name, call in order:
            samples = scenario.series(name).samples
            for _ in range(calls):
                t0 = clock()
                call()
                samples.append(clock() - t0)


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (a process's affinity call moves one thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def placed_roundtrip(report: Report, calls: int, rounds: int) -> None:
    """The round trip again, with the kernel's placement taken out of it: this process on
    CPU 0, and the echo's process and a 1-node pool's worker on CPU 0 too (one core) or on
    CPU 1 (two cores). On a VM, a process woken on the other core costs tens of µs, and
    unpinned the kernel sometimes runs the echo's two processes on one core and sometimes
    not: the plain round trip's floor swings between about 9 and 60 µs with it."""
    cpus = sorted(os.sched_getaffinity(0))
    scenario = report.scenario(
        "roundtrip_placed",
        "No-op round trip, pinned: both processes on one core, and on two",
        f"{rounds} rounds x {calls} calls per tool, tools interleaved round by round; this "
        "process on CPU 0, the other process (the echo, the pool's one worker) on CPU 0 or 1.",
    )
    if len(cpus) < 2:
        scenario.skipped = "needs 2 CPUs"
        return
    first, second = cpus[0], cpus[1]
    with ExitStack() as stack:
        stack.callback(_pin, os.getpid(), set(cpus))
        _pin(os.getpid(), {first})
        pool = stack.enter_context(sky.ComputePool(nodes=1, quiet=True, name="bench-placed"))
        worker = pool.run(os.getpid)
        echo = PythonPipe()
        stack.callback(echo.close)
        tools: list[tuple[str, int, Callable[[], Any]]] = []
        for where, cpu in (("one core", first), ("two cores", second)):
            tools.append((f"skyward >> ({where})", cpu, lambda: sky_noop() >> pool))
            tools.append((f"Python pipe echo ({where})", cpu, lambda: echo.echo(("noop", (), {}))))
        for name, _, _ in tools:
            scenario.series(name)
        clock = time.perf_counter
        for order in _rotations(tools, rounds):
            for name, cpu, call in order:
                _pin(worker, {cpu})
                _pin(echo.process.pid, {cpu})
                for _ in range(20):
                    call()
                samples = scenario.series(name).samples
                for _ in range(calls):
                    t0 = clock()
                    call()
                    samples.append(clock() - t0)


def _map_tools(peers: Peers, fn: Callable[[Any], Any], tasks: int) -> list[Tool]:
    """Each peer's way of mapping ``fn`` over ``range(tasks)`` and waiting for the lot."""
    pool = peers.pool
    tools: list[Tool] = [("skyward pool.map", lambda: pool.map(fn, range(tasks)))]
    if peers.executor is not None:
        ex = peers.executor
        tools.append(("ProcessPoolExecutor.map", lambda: list(ex.map(fn, range(tasks)))))
    if peers.ray is not None:
        ray, remote = peers.ray, peers.ray_fns[fn.__name__]
        tools.append(("ray", lambda: ray.get([remote.remote(i) for i in range(tasks)])))
    if peers.dask is not None:
        client = peers.dask
        tools.append(("dask", lambda: client.gather(client.map(fn, range(tasks), pure=False))))
    return tools


def throughput(report: Report, peers: Peers, tasks: int, repeat: int) -> None:
    for key, fn, label in (("map_noop", noop, "no-op"), ("map_1ms", spin_1ms, "1 ms CPU")):
        scenario = report.scenario(
            key,
            f"{tasks:,} {label} tasks, {NODES} workers (whole batch)",
            f"Each sample maps over {tasks:,} items and waits for every result; "
            f"{repeat} samples per tool, interleaved.",
        )
        tools = _map_tools(peers, fn, tasks)
        for name, _ in tools:
            scenario.series(name, per=tasks)
        for order in _rotations(tools, repeat):
            for name, call in order:
                t0 = time.perf_counter()
                result = call()
                scenario.series(name, per=tasks).samples.append(time.perf_counter() - t0)
                assert len(result) == tasks, name


CHUNK = 100  # the explicit chunk size both sides get in the chunked scenarios


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[list[int]]:
    """``processes`` busy Python processes (an endless loop each), stopped by PID at the
    end: the load a shared or oversubscribed machine puts on every peer alike."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(processes)
    ]
    try:
        time.sleep(0.5)  # let them reach the run queue
        yield [p.pid for p in spinners]
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(timeout=10)


def _chunk_tools(peers: Peers, tasks: int) -> list[Tool]:
    """Ours with the automatic chunk size, one item per call and ``CHUNK`` per call, beside
    ``ProcessPoolExecutor.map`` with one and ``CHUNK`` items per call."""
    pool = peers.pool
    tools: list[Tool] = [
        ("skyward pool.map (auto chunks)", lambda: pool.map(noop, range(tasks))),
        ("skyward pool.map chunksize=1", lambda: pool.map(noop, range(tasks), chunksize=1)),
        (
            f"skyward pool.map chunksize={CHUNK}",
            lambda: pool.map(noop, range(tasks), chunksize=CHUNK),
        ),
    ]
    if peers.executor is not None:
        ex = peers.executor
        tools.append(
            ("ProcessPoolExecutor.map chunksize=1", lambda: list(ex.map(noop, range(tasks))))
        )
        tools.append(
            (
                f"ProcessPoolExecutor.map chunksize={CHUNK}",
                lambda: list(ex.map(noop, range(tasks), chunksize=CHUNK)),
            )
        )
    return tools


def chunked(report: Report, peers: Peers, tasks: int, repeat: int, load: int) -> None:
    """No-op maps with and without chunks, on a quiet machine and under ``load`` busy
    processes, in the same run: the ratios are ours over ProcessPoolExecutor's."""
    for key, busy in (("map_chunks", 0), ("map_chunks_loaded", load)):
        where = f"under {busy} busy processes" if busy else "quiet"
        scenario = report.scenario(
            key,
            f"{tasks:,} no-op tasks, {NODES} workers, chunked, {where}",
            f"Each sample maps over {tasks:,} items and waits for every result; "
            f"{repeat} samples per tool, interleaved"
            + (f"; {busy} other processes spin meanwhile ({os.cpu_count()} CPUs)" if busy else "")
            + ".",
        )
        tools = _chunk_tools(peers, tasks)
        with cpu_load(busy) if busy else contextlib.nullcontext():
            for order in _rotations(tools, repeat):
                for name, call in order:
                    t0 = time.perf_counter()
                    result = call()
                    scenario.series(name, per=tasks).samples.append(time.perf_counter() - t0)
                    assert len(result) == tasks, name


def broadcast(report: Report, peers: Peers, megabytes: int, repeat: int) -> None:
    data = np.random.default_rng(0).random(megabytes * 10**6 // 8)
    scenario = report.scenario(
        "broadcast",
        f"{megabytes} MB numpy array to each of {NODES} nodes",
        "Each tool's best way to give every worker the same array, and a task there that "
        "reads it; the floor writes the bytes down two raw pipes at once, from two threads.",
    )
    pool = peers.pool

    def pipes() -> list[int]:
        view = memoryview(data).cast("B")
        threads = [threading.Thread(target=p.bulk, args=(view,)) for p in peers.pipes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [data.nbytes] * len(threads)

    tools: list[tuple[str, Callable[[], list[int]]]] = [
        ("skyward @", lambda: sky_nbytes(data) @ pool),
        ("2 raw pipes in parallel (floor)", pipes),
    ]
    if peers.ray is not None:
        ray, fn = peers.ray, peers.ray_fns["nbytes"]

        def ray_bcast() -> list[int]:
            ref = ray.put(data)  # once into the shared-memory object store
            out = ray.get([fn.remote(ref) for _ in range(NODES)])
            del ref
            return list(out)

        tools.append(("ray put + a task per worker", ray_bcast))
    if peers.dask is not None:
        client, workers = peers.dask, peers.dask_workers

        def dask_bcast() -> list[int]:
            [future] = client.scatter([data], broadcast=True)
            out = client.gather(
                [client.submit(nbytes, future, workers=[w], pure=False) for w in workers]
            )
            client.cancel([future])
            return list(out)

        tools.append(("dask scatter(broadcast) + a task per worker", dask_bcast))
    if peers.executor is not None:
        ex = peers.executor
        tools.append(
            (
                "ProcessPoolExecutor submit per worker",
                lambda: [f.result() for f in [ex.submit(nbytes, data) for _ in range(NODES)]],
            )
        )
    for name, call in tools:
        scenario.series(name)
        assert call() == [data.nbytes] * NODES, name  # warm, and check
    for order in _rotations(tools, repeat):
        for name, call in order:
            t0 = time.perf_counter()
            call()
            scenario.series(name).samples.append(time.perf_counter() - t0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_BARE_JAX = (
    "import sys, jax; jax.distributed.initialize(coordinator_address=sys.argv[1], "
    "num_processes=int(sys.argv[2]), process_id=int(sys.argv[3])); "
    "print('ready', flush=True); sys.stdin.read()"
)
_BARE_PYTHON = "import sys; print('ready', flush=True); sys.stdin.read()"


def _bare(nodes: int, jax: bool) -> float:
    """Start ``nodes`` bare processes; seconds until every one printed ``ready``."""
    port = _free_port()
    t0 = time.perf_counter()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _BARE_JAX if jax else _BARE_PYTHON,
                f"127.0.0.1:{port}",
                str(nodes),
                str(i),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for i in range(nodes)
    ]
    try:
        for p in processes:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError(f"bare process failed to start: {line!r}")
        return time.perf_counter() - t0
    finally:
        for p in processes:  # JAX processes ignore SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _pool_start(nodes: int, jax: bool) -> float:
    plugins = [sky.plugins.jax()] if jax else []
    t0 = time.perf_counter()
    pool = sky.ComputePool(nodes=nodes, plugins=plugins, quiet=True)
    pool.start()
    elapsed = time.perf_counter() - t0
    pool.close()
    return elapsed


def start(report: Report, sizes: list[int], repeat: int, with_jax: bool) -> None:
    for nodes in sizes:
        scenario = report.scenario(
            f"start{nodes}",
            f"Start {nodes} local nodes (until every one is ready)",
            "Skyward: from `ComputePool(...)` to ready. Bare: spawn the processes, until "
            "each printed a line after its imports (and `jax.distributed.initialize`).",
        )
        tools: list[tuple[str, Callable[[], float]]] = [
            ("skyward + jax plugin", lambda n=nodes: _pool_start(n, True)),  # type: ignore[misc]
            ("bare jax processes", lambda n=nodes: _bare(n, True)),  # type: ignore[misc]
            ("skyward, no plugin", lambda n=nodes: _pool_start(n, False)),  # type: ignore[misc]
            ("bare python processes", lambda n=nodes: _bare(n, False)),  # type: ignore[misc]
        ]
        if not with_jax:
            tools = [t for t in tools if "jax" not in t[0]]
        for name, _ in tools:
            scenario.series(name)
        for order in _rotations(tools, repeat):
            for name, call in order:
                scenario.series(name).samples.append(call())


# ── SSH ──────────────────────────────────────────────────────────────────────────────────


class OpenSSH:
    """The OpenSSH client on the same link: one ``ssh`` process per measurement session.

    ``echo`` times a small message through ``cat`` on the host and back (the floor for a
    round trip over SSH); ``push`` times bytes written into ``cat > /dev/null`` there, from
    the first byte to the host's acknowledgement, with the connection already up.
    """

    def __init__(self, hosts: Any, host: Any, cipher: str | None) -> None:
        self.base = [
            "ssh",
            "-q",
            "-T",
            "-i",
            str(hosts.client_key),
            "-o",
            f"UserKnownHostsFile={hosts.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            *(["-c", cipher] if cipher else []),
            host.target,
        ]

    def _open(self, command: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*self.base, command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            process.kill()
            process.wait()
            raise RuntimeError(f"ssh did not start: {self.base}")
        return process

    @contextlib.contextmanager
    def echo_session(self) -> Iterator[Callable[[], None]]:
        process = self._open("echo ready; exec cat")
        assert process.stdin and process.stdout
        w, r = process.stdin.fileno(), process.stdout.fileno()
        message = pickle.dumps(("noop", (), {}), protocol=5)

        def echo() -> None:
            os.write(w, message)
            got = 0
            while got < len(message):
                got += len(os.read(r, len(message) - got))

        try:
            yield echo
        finally:
            process.kill()
            process.wait()

    def push(self, view: memoryview) -> float:
        """Seconds to move ``view`` into ``cat > /dev/null`` on the host."""
        process = self._open("echo ready; cat > /dev/null; echo done")
        assert process.stdin and process.stdout
        try:
            t0 = time.perf_counter()
            fd = process.stdin.fileno()
            rest = view.cast("B")
            while rest.nbytes:
                rest = rest[os.write(fd, rest[: 1 << 20]) :]
            process.stdin.close()
            if process.stdout.readline().strip() != b"done":
                raise RuntimeError("ssh cat ended early")
            return time.perf_counter() - t0
        finally:
            process.kill()
            process.wait()


def _ssh_fixtures(stack: ExitStack, count: int = 1) -> tuple[Any, Any]:
    """OpenSSH hosts in network namespaces, and the package index their workers use.

    The test suite's own fixtures (``tests/support/sshhosts.py``): sshd as user ``skytest`` in a
    namespace on a bridge, keys made for the run, everything stopped by PID and removed.
    """
    sys.path.insert(0, str(ROOT / "tests"))
    from importlib import metadata

    from support.sshhosts import Hosts, PackageIndex

    hosts = Hosts.start(count)  # on a subnet no other run holds (it takes a lock)
    stack.callback(hosts.close)
    index = PackageIndex(hosts.root / "index", hosts.bridge_address)
    stack.callback(index.close)
    pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic", "numpy")]
    index.download([*pins, "uv"], Path.home() / ".cache" / "skyward-tests" / "wheels")
    return hosts, index


def ssh_scenarios(report: Report, args: argparse.Namespace) -> None:
    """Over SSH to a local sshd (a network namespace, a veth pair, a bridge).

    A 1-node SSH pool against the OpenSSH client, interleaved: the no-op round trip (target
    ≤ 1 ms) next to a small message echoed through ``cat`` by ``ssh``, and the MB/s of a
    large argument next to ``ssh host 'cat > /dev/null'`` fed the same bytes, with OpenSSH's
    default cipher and with AES-128-GCM (the cipher skyward prefers).
    """
    rt = report.scenario(
        "ssh_roundtrip",
        "Over SSH: no-op round trip, sequential, warm (per call)",
        "A 1-node SSH pool to an OpenSSH server in a network namespace on this machine; "
        "the floor echoes a small message through `cat` on the host with the `ssh` client.",
    )
    bulk = report.scenario(
        "ssh_bulk",
        f"Over SSH: a {args.ssh_megabytes} MB argument to one node",
        "`f(a) >> pool` with a numpy array, against `ssh host 'cat > /dev/null'` fed the same "
        "bytes (timed from the first byte, the connection already up).",
    )
    bulk.rate_unit = "MB/s"
    if sys.platform != "linux" or os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        reason = "needs Linux, root (network namespaces) and openssh-server"
        rt.skipped = bulk.skipped = reason
        print(f"ssh: skipped: {reason}")
        return
    data = np.random.default_rng(1).random(args.ssh_megabytes * 10**6 // 8)
    with ExitStack() as stack:
        t0 = time.perf_counter()
        hosts, index = _ssh_fixtures(stack)
        host = hosts.hosts[0]
        provider = sky.SSH(hosts=[host.target], key=hosts.client_key, known_hosts=hosts.known_hosts)
        pool = stack.enter_context(
            sky.ComputePool(
                provider=provider,
                image=sky.Image(pip=[f"numpy=={np.__version__}"], index_url=index.url),
                quiet=True,
            )
        )
        print(f"ssh pool open in {time.perf_counter() - t0:.1f} s", flush=True)
        default, gcm = OpenSSH(hosts, host, None), OpenSSH(hosts, host, "aes128-gcm@openssh.com")
        echo = stack.enter_context(default.echo_session())
        tools: list[Tool] = [
            ("skyward >> (SSH pool)", lambda: sky_noop() >> pool),
            ("ssh + cat echo (floor)", echo),
        ]
        for name, call in tools:
            rt.series(name)
            for _ in range(20):
                call()
        for order in _rotations(tools, args.rounds):
            for name, call in order:
                samples = rt.series(name).samples
                for _ in range(args.calls):
                    t = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - t)
        view = memoryview(data).cast("B")

        def ours() -> float:
            t = time.perf_counter()
            assert (sky_nbytes(data) >> pool) == data.nbytes
            return time.perf_counter() - t

        transfers: list[tuple[str, Callable[[], float]]] = [
            ("skyward >> (SSH pool)", ours),
            ("ssh 'cat > /dev/null', default cipher", lambda: default.push(view)),
            ("ssh -c aes128-gcm 'cat > /dev/null'", lambda: gcm.push(view)),
        ]
        for name, call in transfers:
            bulk.series(name, per=data.nbytes / 1e6)
            call()  # warm
        for order in _rotations(transfers, args.repeat + 2):
            for name, call in order:
                bulk.series(name, per=data.nbytes / 1e6).samples.append(call())


# ── a slow uplink ────────────────────────────────────────────────────────────────────────


@contextlib.contextmanager
def shaped(device: str, mbit: int) -> Iterator[None]:
    """What the root namespace sends out of ``device`` (the test bridge: the client's side
    of every host's link) is held to ``mbit`` Mbit/s; traffic between the hosts, which the
    bridge forwards without it, is not. Removed on every path."""
    subprocess.run(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            device,
            "root",
            "tbf",
            "rate",
            f"{mbit}mbit",
            "burst",
            "256kb",
            "latency",
            "50ms",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], capture_output=True)


def uplink_scenarios(report: Report, args: argparse.Namespace) -> None:
    """A large broadcast from a client behind a slow uplink (issue 15).

    SSH pools of 2 and 4 hosts in network namespaces; the bridge's root-namespace side is
    shaped to ``--uplink-mbit`` (a laptop's or an office's uplink), the hosts talk to each
    other at full speed, as a cloud's machines do. ``f(a) @ pool`` with an ``a`` of
    ``--uplink-megabytes`` MB, against the physical floor (the payload crossing the shaped
    link once: its size over the rate) and the ``ssh`` client pushing the same bytes to one
    host over the same link (one crossing, measured).
    """
    mbit = args.uplink_mbit
    data = np.random.default_rng(2).random(args.uplink_megabytes * 10**6 // 8)
    floor = data.nbytes * 8 / (mbit * 1e6)
    scenarios = {
        n: report.scenario(
            f"uplink{n}",
            f"Slow uplink: a {args.uplink_megabytes} MB broadcast to {n} SSH hosts",
            f"The client's side of the test bridge shaped to {mbit} Mbit/s (`tc ... tbf rate "
            f"{mbit}mbit burst 256kb latency 50ms`), the hosts unshaped between them. Floor: "
            f"the payload crossing the shaped link once, {data.nbytes / 1e6:.0f} MB ÷ "
            f"{mbit} Mbit/s; the `ssh` row pushes the same bytes to one host over the same "
            f"link (`cat > /dev/null`, AES-128-GCM).",
        )
        for n in (2, 4)
    }
    if (
        sys.platform != "linux"
        or os.geteuid() != 0
        or not Path("/usr/sbin/sshd").exists()
        or not Path("/usr/sbin/tc").exists()
    ):
        reason = "needs Linux, root (network namespaces, tc) and openssh-server"
        for scenario in scenarios.values():
            scenario.skipped = reason
        print(f"uplink: skipped: {reason}")
        return
    with ExitStack() as stack:
        t0 = time.perf_counter()
        hosts, index = _ssh_fixtures(stack, 4)
        image = sky.Image(pip=[f"numpy=={np.__version__}"], index_url=index.url)
        pools = {}
        for n in (4, 2):  # the 4-host pool bootstraps every host; the 2-host one reuses two
            targets = [h.target for h in hosts.hosts[:n]]
            provider = sky.SSH(hosts=targets, key=hosts.client_key, known_hosts=hosts.known_hosts)
            pools[n] = stack.enter_context(
                sky.ComputePool(provider=provider, nodes=n, image=image, quiet=True)
            )
        for n, pool in pools.items():  # warm, unshaped: the function, numpy, connections
            assert (sky_nbytes(data[:1000]) @ pool) == [8000] * n
        print(f"uplink pools open in {time.perf_counter() - t0:.1f} s", flush=True)
        one = OpenSSH(hosts, hosts.hosts[0], "aes128-gcm@openssh.com")
        view = memoryview(data).cast("B")

        def ours(pool: Any, n: int) -> float:
            t = time.perf_counter()
            assert (sky_nbytes(data) @ pool) == [data.nbytes] * n
            return time.perf_counter() - t

        stack.enter_context(shaped(hosts.bridge, mbit))
        tools: list[tuple[int, str, Callable[[], float]]] = []
        for n, pool in pools.items():
            scenario = scenarios[n]
            scenario.series(f"skyward @ ({n} hosts)", per=data.nbytes / 1e6)
            floor_row = scenario.series(
                f"physical floor ({mbit} Mbit/s, once)", per=data.nbytes / 1e6
            )
            floor_row.samples.append(floor)
            scenario.series("ssh to one host (one crossing)", per=data.nbytes / 1e6)
            tools.append((n, f"skyward @ ({n} hosts)", lambda p=pool, k=n: ours(p, k)))  # type: ignore[misc]
            tools.append((n, "ssh to one host (one crossing)", lambda: one.push(view)))
        for scenario in scenarios.values():
            scenario.rate_unit = "MB/s"
        for order in _rotations(tools, args.repeat):
            for n, name, call in order:
                scenarios[n].series(name).samples.append(call())
                print(
                    f"uplink {n} hosts, {name}: {scenarios[n].series(name).samples[-1]:.2f} s",
                    flush=True,
                )


# ── main ─────────────────────────────────────────────────────────────────────────────────


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {"skyward": sky.__version__, "numpy": np.__version__}
    for name in ("ray", "distributed", "jax", "cloudpickle"):
        with contextlib.suppress(Exception):
            from importlib import metadata

            versions[name] = metadata.version(name)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller, under a minute")
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        choices=["roundtrip", "map", "broadcast", "start", "ssh", "uplink"],
        help="run only these scenarios",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["ray", "dask", "jax"],
        help="leave these peers out",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "results",
        help="directory for the JSON and Markdown files",
    )
    parser.add_argument(
        "--uplink-mbit", type=int, default=200, help="the slow uplink's rate, Mbit/s"
    )
    parser.add_argument(
        "--load", type=int, default=8, help="busy processes in the loaded map scenario"
    )
    args = parser.parse_args(argv)
    q = args.quick
    args.calls = 60 if q else 300
    args.rounds = 3 if q else 5
    args.tasks = 1_000 if q else 10_000
    args.repeat = 2 if q else 3
    args.megabytes = 100
    args.ssh_megabytes = 20 if q else 100
    args.uplink_megabytes = 20 if q else 100
    args.sizes = [2] if q else [2, 4]
    return args


def main(argv: list[str] | None = None) -> Report:
    args = parse_args(argv)
    only = set(args.only) or {"roundtrip", "map", "broadcast", "start", "ssh", "uplink"}
    report = Report()
    began = time.perf_counter()
    if only & {"roundtrip", "map", "broadcast"}:
        with open_peers(args) as peers:
            print(f"peers open in {time.perf_counter() - began:.1f} s", flush=True)
            if "roundtrip" in only:
                roundtrip(report, peers, args.calls, args.rounds)
                placed_roundtrip(report, args.calls, args.rounds)
                print("round trip done", flush=True)
            if "map" in only:
                throughput(report, peers, args.tasks, args.repeat)
                chunked(report, peers, args.tasks, args.repeat, args.load)
                print("map done", flush=True)
            if "broadcast" in only:
                broadcast(report, peers, args.megabytes, args.repeat + 2)
                print("broadcast done", flush=True)
    if "start" in only:
        start(report, args.sizes, args.repeat, with_jax="jax" not in args.skip)
        print("start done", flush=True)
    if "ssh" in only:
        ssh_scenarios(report, args)
    if "uplink" in only:
        uplink_scenarios(report, args)
    info = machine()
    targets = evaluate_targets(report)
    table = markdown(report, info, targets)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + ("-quick" if args.quick else "")
    payload = {
        "machine": info,
        "argv": sys.argv[1:] if argv is None else argv,
        "seconds": time.perf_counter() - began,
        "scenarios": {
            key: {
                "title": s.title,
                "skipped": s.skipped,
                "tools": {t: {**v.summary(), "samples": v.samples} for t, v in s.tools.items()},
            }
            for key, s in report.scenarios.items()
        },
        "targets": targets,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    (args.out / f"{stem}.md").write_text(table)
    print()
    print(table)
    print(f"wrote {args.out / stem}.json and .md in {time.perf_counter() - began:.0f} s")
    return report


if __name__ == "__main__":
    main()
