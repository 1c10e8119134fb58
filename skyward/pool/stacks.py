"""Where every node is right now: Python stacks from every worker, labelled by node.

The worker answers a ``StacksRequest`` from its reader thread, so a node that is busy, or
stuck in a collective, still answers. ``Stacks`` is what ``pool.stacks()`` returns; the
hang watch (``recovery``) uses the same reports, trimmed to the user's frames down to the
call into jax.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Literal

from skyward._errors import SkywardError
from skyward.link import protocol as proto
from skyward.link.channel import Channel

# Frames of Skyward's worker (its loop, its call runners, its end of the link) and of the
# machinery that runs threads are not the user's.
_WORKER = ("/skyward/worker/", "/skyward/link/")
_THREADING = ("/threading.py", "/queue.py")
_FRAMEWORKS = ("/jax/", "/jaxlib/")


class Stacks(Mapping[int, str]):
    """Every worker's stacks, by rank: ``print(pool.stacks())``, or ``stacks[1]``; printed,
    each is headed as the pool names the worker everywhere (``node 1``, ``node 0 worker
    1``: ``labels``)."""

    def __init__(self, by_node: Mapping[int, str], labels: Mapping[int, str] | None = None) -> None:
        self._by_node = dict(by_node)
        self._labels = {rank: (labels or {}).get(rank, f"node {rank}") for rank in by_node}

    def __getitem__(self, node: int) -> str:
        return self._by_node[node]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._by_node))

    def __len__(self) -> int:
        return len(self._by_node)

    def __str__(self) -> str:
        return "\n".join(f"── {self._labels[rank]} ──\n{self._by_node[rank]}" for rank in self)

    def __repr__(self) -> str:  # a notebook cell shows this
        return str(self)


def collect(
    channels: Mapping[int, Channel | None], timeout: float, label: Callable[[int], str]
) -> Stacks:
    """Ask every channel at once, wait ``timeout`` at most for all of them; ``label``
    names a worker by its rank."""
    requests = {rank: c.request_stacks() for rank, c in channels.items() if c is not None}
    end = time.monotonic() + timeout
    texts = {}
    for rank in channels:
        request = requests.get(rank)
        if request is None:
            texts[rank] = "no worker (a new one is starting)"
            continue
        try:
            texts[rank] = describe(request.result(max(0.0, end - time.monotonic())))
        except FutureTimeout:
            texts[rank] = f"did not answer within {timeout:g} s"
        except SkywardError as error:
            texts[rank] = f"no answer: {error}"
    return Stacks(texts, {rank: label(rank) for rank in texts})


def describe(report: proto.StacksReport, *, to_framework: bool = False) -> str:
    """The report's threads that run user code, as tracebacks read (outermost first).

    ``to_framework`` cuts each stack after its first frame inside jax: where the user's code
    called in, not jax's internals.
    """
    blocks = []
    for name, frames in report.threads:
        mine = user_frames(frames, to_framework=to_framework)
        if mine:
            lines = [
                f"  File {file!r}, line {line}, in {func}" + (f"\n    {text}" if text else "")
                for file, line, func, text in mine
            ]
            blocks.append(f"Thread {name}:\n" + "\n".join(lines))
    return "\n".join(blocks) if blocks else "idle (no call running)"


def user_frames(frames: Sequence[proto.Frame], *, to_framework: bool = False) -> list[proto.Frame]:
    """The user's part of a stack: from the first frame past the worker's own (and a
    thread's start-up) down, where the worker called the user's function; none for a thread
    that runs no user code (one waiting for work, or the worker sending a call's result)."""
    entry = next((i for i, frame in enumerate(frames) if _worker(frame)), 0)
    user = (i for i in range(entry, len(frames)) if not _worker(frames[i]))
    first = next((i for i in user if not frames[i][0].endswith(_THREADING)), None)
    if first is None:
        return []
    kept = list(frames[first:])
    if to_framework:
        inside = next((i for i, f in enumerate(kept) if in_framework(f)), None)
        if inside is not None:
            kept = kept[: inside + 1]
    return kept


def _worker(frame: proto.Frame) -> bool:
    return any(part in frame[0] for part in _WORKER)


def in_framework(frame: proto.Frame) -> bool:
    return any(part in frame[0] for part in _FRAMEWORKS)


# What a rank inside jax is doing, read from where its Python stack ends.
Wait = Literal["collective", "callback", "compile", "transfer"]
# jax turns a Python function into a program here; a first call, or a new shape, waits here.
_COMPILING = frozenset(
    {"compile_or_get_cached", "backend_compile", "_cached_compilation", "from_hlo", "compile"}
)
_TRANSFERRING = frozenset({"device_put", "_device_put_impl", "make_array_from_callback"})


def framework_wait(report: proto.StacksReport) -> tuple[Wait, str] | None:
    """What the rank's thread inside jax waits in, and the frame that says so; None when no
    thread is inside jax, or its stack does not tell (the hang watch then gives no verdict).

    - ``callback``: jax called back into Python (``jax.debug.callback``, ``io_callback``,
      ``pure_callback``): the stack leaves jax again into code that is not jax's. The user's
      own function runs (data loading, I/O, a sleep); that is no collective.
    - ``compile``: jax is compiling a program.
    - ``transfer``: jax is moving data to devices.
    - ``collective``: the stack ends inside jax, in C++ below it: jax runs a compiled
      program or waits for its result, with nothing of the user's running; where a rank
      waits for ranks that left. (A long computation there burns CPU, which the hang watch
      checks apart.)
    """
    verdicts: list[tuple[Wait, str]] = []
    for _, frames in report.threads:
        mine = user_frames(frames)
        entered = next((i for i, f in enumerate(mine) if in_framework(f)), None)
        if entered is None:
            continue
        inside = mine[entered:]
        back_out = next(
            (f for f in inside if not in_framework(f) and not f[0].endswith(_THREADING)), None
        )
        names = [f[2] for f in inside if in_framework(f)]
        if back_out is not None:
            verdicts.append(("callback", f"{back_out[2]} ({back_out[0]}:{back_out[1]})"))
        elif any(n in _COMPILING for n in names) or any("compiler.py" in f[0] for f in inside):
            verdicts.append(("compile", names[-1]))
        elif any(n in _TRANSFERRING for n in names):
            verdicts.append(("transfer", names[-1]))
        else:
            # The Python stack ends inside jax: the rest is C++ (jit's fast path, XLA running
            # the program, a wait for its result), where a collective waits for the others.
            last = inside[-1]
            verdicts.append(("collective", f"{last[2]} ({last[0]}:{last[1]})"))
    # One thread in the user's callback, compile or transfer says the rank is not stuck in
    # a collective, whatever another thread waits on.
    for kind in ("callback", "compile", "transfer", "collective"):
        for verdict in verdicts:
            if verdict[0] == kind:
                return verdict
    return None
