"""Output control per function: ``@sky.stdout(only=...)``, ``@sky.stderr(only=...)``,
``@sky.silent``, and ``sky.is_head()``.

::

    @sky.compute
    @sky.stdout(only="head")        # node 0 prints, the others' prints go nowhere
    def train(): ...

The decorators decide on the worker, at every call, from ``instance_info()``; the pool's
``output=`` then decides, on the client, which nodes' lines are shown. A line must pass both.

Muting is per thread, not process-wide like ``contextlib.redirect_stdout``: a worker with
``concurrency > 1`` runs several calls at once, and muting one must not swallow another's
prints. ``sys.stdout`` and ``sys.stderr`` become a ``_Gate`` the first time a muted call
runs; a gate drops writes from muted threads and passes the rest through. Only Python-level
writes are muted (``print``, ``sys.stdout.write``, logging to them); a C extension writing to
file descriptor 1 or 2 itself is not.

The node's side: a muted function's wrapper calls this module by reference on the worker, so
it imports only the shared ``_info``, never the client's ``@sky.compute`` (``client.compute``).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

from skyward._info import InstanceInfo, instance_info

F = TypeVar("F", bound=Callable[..., Any])
Only = Literal["head"] | Callable[[InstanceInfo], bool]
Stream = Literal["stdout", "stderr"]


@runtime_checkable
class _TakesDecorators(Protocol):
    """A decorated function that takes further decorators inside itself: ``@sky.compute``'s
    ``ComputeFunction``. Named by what it does, not imported: it lives on the client's side
    (``client.compute``), which a worker running a muted function must not load."""

    def decorate_inside(
        self, decorator: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> object: ...


_state = threading.local()  # per thread: how many calls muted "stdout" / "stderr"
_install_lock = threading.Lock()  # guards: replacing sys.stdout / sys.stderr with a gate


def is_head(info: InstanceInfo | None = None) -> bool:
    """Whether this is the pool's head: node 0's first worker (node 0 itself, with one
    worker per node). Outside a worker: True (the client is the only node of a one-node
    pool). skyward 0.5 spelled it ``is_head(info)``; both work."""
    return (info or instance_info()).is_head


def stdout(only: Only) -> Callable[[F], F]:
    """Let only some nodes' calls of the decorated function write to stdout.

    ``only="head"``: node 0; or a predicate of the node's ``InstanceInfo``
    (``only=lambda info: info.node < 2``). stderr is left alone, so errors still show.
    Goes below ``@sky.compute`` (above works too).
    """
    return _muting(("stdout",), _predicate(only))


def stderr(only: Only) -> Callable[[F], F]:
    """Like ``stdout``, for stderr: nodes that ``only`` rejects write nothing to stderr."""
    return _muting(("stderr",), _predicate(only))


def silent(fn: F) -> F:
    """Mute the decorated function's stdout and stderr on every node."""
    return _muting(("stdout", "stderr"), lambda _: False)(fn)


def _predicate(only: Only) -> Callable[[InstanceInfo], bool]:
    if only == "head":
        return is_head
    if callable(only):
        return only
    raise ValueError(f"only must be 'head' or a function of InstanceInfo, not {only!r}")


def _muting(
    streams: tuple[Stream, ...], allowed: Callable[[InstanceInfo], bool]
) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        if isinstance(fn, _TakesDecorators):  # above @sky.compute: wrap the function inside it
            return cast(F, fn.decorate_inside(decorate))
        if inspect.isgeneratorfunction(fn):
            # Still a generator function, so a pool streams its values (see _stream).
            @functools.wraps(fn)
            def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
                yield from _iterate_muted(streams, allowed, fn(*args, **kwargs))

            return cast(F, generator)

        # The wrapper only calls module-level functions: cloudpickle sends those by
        # reference, and a worker imports them, so nothing unpicklable travels.
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return _call_muted(streams, allowed, fn, args, kwargs)

        return cast(F, wrapper)

    return decorate


def _call_muted(
    streams: tuple[Stream, ...],
    allowed: Callable[[InstanceInfo], bool],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    mute = () if allowed(instance_info()) else streams
    _enter(mute)
    try:
        return fn(*args, **kwargs)
    finally:
        _leave(mute)


def _iterate_muted(
    streams: tuple[Stream, ...], allowed: Callable[[InstanceInfo], bool], values: Iterator[Any]
) -> Iterator[Any]:
    """Muted while the generator runs, not while its consumer handles a value."""
    mute = () if allowed(instance_info()) else streams
    while True:
        _enter(mute)
        try:
            value = next(values)
        except StopIteration:
            return
        finally:
            _leave(mute)
        yield value


def _enter(streams: tuple[Stream, ...]) -> None:
    for name in streams:
        _install(name)
        setattr(_state, name, getattr(_state, name, 0) + 1)


def _leave(streams: tuple[Stream, ...]) -> None:
    for name in streams:
        setattr(_state, name, getattr(_state, name) - 1)


def _install(name: Stream) -> None:
    with _install_lock:
        current = getattr(sys, name)
        if not isinstance(current, _Gate):
            setattr(sys, name, _Gate(current, name))


class _Gate:
    """A stream that drops writes from threads that muted it, and otherwise is ``inner``."""

    def __init__(self, inner: Any, name: Stream) -> None:
        self._inner = inner
        self._name = name

    def _muted(self) -> bool:
        return bool(getattr(_state, self._name, 0))

    def write(self, text: str) -> int:
        return len(text) if self._muted() else int(self._inner.write(text))

    def writelines(self, lines: Any) -> None:
        if not self._muted():
            self._inner.writelines(lines)

    def __getattr__(self, attribute: str) -> Any:  # flush, fileno, encoding, isatty, ...
        return getattr(self._inner, attribute)
