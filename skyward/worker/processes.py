"""``executor="process"``: a worker runs each call in one of ``concurrency`` child processes,
so CPU-bound Python calls on one node do not share one GIL.

::

    worker: executor thread ── (Call, its pickled parts) ──> ProcessPoolExecutor (spawn)
                            <── (ok, result parts) ────────  child: run_call, as a thread would

Children are started with ``spawn`` (the worker has threads; ``fork`` would copy their
locks mid-use), once, and kept. Each child knows its node (``instance_info()``), the
client's path, and the plugins' ``decorate`` hooks; the plugins' ``around_app`` contexts are
entered in the worker process only. A child's fd 1 and 2 are the worker's, so its prints are
forwarded like any (line-buffered, so they arrive before the call's result). Streaming calls
run on the worker's own threads. A child that dies fails the calls running in children
(``BrokenProcessPool``) and a fresh set of children takes the next ones; children that lose
their worker exit on their own within a second.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from skyward.collections.proxies import use_link
from skyward.link import protocol as proto
from skyward.worker.calls import decorating, run_call


class Processes:
    """The child processes of one worker. ``run`` is called from its executor threads."""

    def __init__(self, count: int, info: Any, sys_path: list[str], plugins: proto.Parts) -> None:
        self._count = count
        self._setup = (info, sys_path, [bytes(p) for p in plugins], os.getpid())
        self._lock = threading.Lock()  # guards: _pool
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        import multiprocessing

        return ProcessPoolExecutor(
            self._count,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_child_start,
            initargs=self._setup,
        )

    def run(self, message: proto.Call, parts: proto.Parts) -> tuple[bool, proto.Parts]:
        with self._lock:
            pool = self._pool
        try:
            ok, payload = pool.submit(_child_run, message, parts).result()
            return ok, list(payload)
        except BrokenProcessPool as exc:
            with self._lock:
                if self._pool is pool:  # the first to see it starts the next set
                    self._pool = self._start()
            pool.shutdown(wait=False, cancel_futures=True)
            error = RuntimeError(
                f"the process running {message.name} died ({exc}); with executor='process' "
                f"a call that crashes its process fails the calls running beside it too"
            )
            return False, proto.encode_error(error)

    def close(self, *, kill: bool) -> None:
        """Stop the children: the worker is leaving. ``kill``: at once, calls running or not
        (a cancelling shutdown); else let them exit in order, which they do at once when no
        call runs, and which lets multiprocessing release what it made for them."""
        with self._lock:
            pool = self._pool
        if kill:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=not kill, cancel_futures=True)


def _child_start(info: Any, sys_path: list[str], plugins: list[bytes], parent: int) -> None:
    from skyward import _info

    for path in sys_path:
        if path not in sys.path:
            sys.path.append(path)
    _info._set_current(info)
    decorating.extend(p for p in proto.loads(plugins) if p.decorate is not None)
    use_link(_no_collections)
    # A pipe is block-buffered; line by line, prints reach the worker's forwarder in time.
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _no_collections(kind: str, name: str, op: str, args: tuple[Any, ...]) -> Any:
    raise RuntimeError(
        f"sky.{kind}({name!r}) is not available in executor='process' calls yet; use the "
        f"thread executor for calls that share collections"
    )


def _exit_with(parent: int) -> None:
    """Exit once the worker is gone (killed, it cannot take its children along)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _child_run(message: proto.Call, parts: proto.Parts) -> tuple[bool, list[bytes]]:
    ok, payload = run_call(message, parts, None, _flush)
    _flush()
    # Out-of-band buffers are views into this process's memory: bytes cross to the worker.
    return ok, [bytes(part) for part in payload]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
