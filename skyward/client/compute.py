"""``@sky.compute`` and the operators that send a call to a pool.

::

    f(x)                 -> PendingCall        nothing runs yet
    f(x) >> pool         -> value              one node, the least busy
    f(x) @ pool          -> [value, ...]       every node, by rank
    f(x) > pool          -> Future             one node, don't wait
    (f(x) & g(y)) >> pool -> (fx, gy)          several calls in parallel
    gather(*calls) >> pool -> (fx, ...)        the same, for any number of calls
    gather(*calls, stream=True) >> pool        an iterator of their values as they finish
    f(x) >> sky          -> value              the innermost pool this thread has open

The operators only hand the call to the pool's public methods: ``>>`` is ``pool.run(call)``,
``@`` is ``pool.broadcast(call)``, ``>`` is ``pool.submit(call)``, and a group is
``pool.submit_all(calls)``; pickling and scheduling live there. On the module itself
(``f(x) >> sky``, skyward 0.5's spelling) they go to the innermost pool this thread has
open (``skyward.client.current``). ``f.local(x)`` runs ``f`` in this process, unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import queue
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward._errors import SerializationError
from skyward.client.current import innermost
from skyward.client.futures import gather as gather_futures
from skyward.link import protocol as proto
from skyward.link.pickling import dumps_function

# The longest timeout accepted: a week. Longer ones overflow the standard library's waits
# (threading.TIMEOUT_MAX), and a call that may run for more than a week needs none.
MAX_TIMEOUT = 7 * 24 * 3600.0

P = ParamSpec("P")
R = TypeVar("R")


class _Options(BaseModel):
    """``sky.compute``'s options, validated like every public constructor's."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, title="sky.compute")

    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT, strict=True)

    @field_validator("timeout", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # strict: no "5", no True, but 5 is 5.0
        return value


class CallTarget(ABC):
    """What the operators send calls to: ``skyward.pool.ComputePool`` is the one. Its public
    methods, declared here so that this module does not import the pool (which imports it).
    """

    @abstractmethod
    def run(self, call: PendingCall[R], /) -> R:
        """Run ``call`` on one node and return its value."""

    @abstractmethod
    def submit(self, call: PendingCall[R], /) -> Future[R]:
        """Send ``call`` to one node; its future at once."""

    @abstractmethod
    def broadcast(self, call: PendingCall[R], /) -> list[R]:
        """Run ``call`` on every node; the values by node rank."""

    @abstractmethod
    def submit_all(self, calls: Iterable[PendingCall[Any]], /) -> list[Future[Any]]:
        """Send every call, each to one node; their futures, in order."""


_new = object.__new__


class ComputeFunction(Generic[P, R]):
    """A function marked to run on a pool. Calling it returns a ``PendingCall``."""

    def __init__(self, fn: Callable[P, R], *, timeout: float | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"sky.compute needs a callable, not {type(fn).__name__}")
        timeout = _Options(timeout=timeout).timeout
        self.fn = fn
        self.timeout = timeout
        functools.update_wrapper(self, fn)
        self._call_name = _name(fn)  # once: f(x) in a loop of >> is on every call's path

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> PendingCall[R]:
        # PendingCall(self.fn, args, kwargs, timeout=..., name=...) with its fields stored
        # directly: the frozen dataclass's __init__ sets each through object.__setattr__,
        # and ``f(x) >> pool`` in a loop pays it on every call.
        call: PendingCall[R] = _new(PendingCall)
        fields = call.__dict__
        fields["fn"] = self.fn
        fields["args"] = args
        fields["kwargs"] = kwargs
        fields["timeout"] = self.timeout
        fields["name"] = self._call_name
        return call

    def local(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run in this process, as a plain call."""
        return self.fn(*args, **kwargs)

    def decorate_inside(
        self, decorator: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> ComputeFunction[P, R]:
        """The same compute function, options kept, around ``decorator(fn)``: how a decorator
        written above ``@sky.compute`` (``@sky.stdout``) reaches the function inside."""
        return ComputeFunction(decorator(self.fn), timeout=self.timeout)

    def __repr__(self) -> str:
        return f"<sky.compute {_name(self.fn)}>"


@overload
def compute(fn: Callable[P, R], /) -> ComputeFunction[P, R]: ...
@overload
def compute(
    *, timeout: float | None = None
) -> Callable[[Callable[P, R]], ComputeFunction[P, R]]: ...
def compute(
    fn: Callable[P, R] | None = None, /, *, timeout: float | None = None
) -> ComputeFunction[P, R] | Callable[[Callable[P, R]], ComputeFunction[P, R]]:
    """Mark ``fn`` to run on a pool: ``@sky.compute`` or ``@sky.compute(timeout=60)``.

    ``timeout``: seconds from when the call is sent to a node until it must have returned;
    past it the call raises ``TimeoutError`` and that node's worker is replaced.
    """
    if fn is None:
        return lambda f: ComputeFunction(_unwrap(f), timeout=timeout)
    return ComputeFunction(_unwrap(fn), timeout=timeout)


# The public skyward project's later name for the decorator (``@sky.function``).
function = compute


def _unwrap(fn: Callable[P, R]) -> Callable[P, R]:
    # sky.compute(timeout=5)(already_decorated) gives new options to the same function.
    return fn.fn if isinstance(fn, ComputeFunction) else fn


@dataclass(frozen=True, eq=False)
class PendingCall(Generic[R]):
    """A function and its arguments, waiting for an operator to send them to a pool."""

    fn: Callable[..., R]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timeout: float | None = None
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", _name(self.fn))

    def with_timeout(self, timeout: float) -> PendingCall[R]:
        """This call with its own ``timeout`` (see ``compute``), as skyward 0.5 spelled it."""
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        return dataclasses.replace(self, timeout=timeout)

    def __rshift__(self, pool: CallTarget) -> R:
        return _target(pool, ">>").run(self)

    def __matmul__(self, pool: CallTarget) -> list[R]:
        return _target(pool, "@").broadcast(self)

    def __gt__(self, pool: CallTarget) -> Future[R]:
        return _target(pool, ">").submit(self)

    def __and__(self, other: PendingCall[Any] | CallGroup) -> CallGroup:
        return CallGroup((self,)) & other

    def serialize(self, function: bytes | None = None) -> proto.Parts:
        """Pickle the call, or say exactly which part cannot be pickled.

        The payload is ``(function, args, kwargs)`` with the function pickled on its own, so
        ``map`` can pickle it once (``function=``) for any number of calls.
        """
        if function is None:
            function = self.serialize_function()
        try:
            return proto.dumps_call(function, self.args, self.kwargs)
        except Exception as exc:
            raise SerializationError(
                f"{self._culprit()} cannot be pickled ({type(exc).__name__}: {exc}). "
                f"Pass something picklable instead, or create the object inside the function."
            ) from exc

    def serialize_function(self) -> bytes:
        try:
            # Made once and reused while it would come out the same (see skyward.link.pickling).
            return dumps_function(self.fn)
        except Exception as exc:
            raise self._unpicklable(exc) from exc

    def _unpicklable(self, exc: Exception) -> SerializationError:
        return SerializationError(
            f"the function {self.name} cannot be pickled ({type(exc).__name__}: {exc}). "
            f"Objects it refers to from outside travel with it: create them inside it."
        )

    def _culprit(self) -> str:
        names = _parameter_names(self.fn, len(self.args))
        for i, value in enumerate(self.args):
            try:
                proto.dumps(value)
            except Exception:
                return (
                    f"argument {names[i]!r} (position {i}) of {self.name}, "
                    f"{_a(type(value).__name__)},"
                )
        for key, value in self.kwargs.items():
            try:
                proto.dumps(value)
            except Exception:
                return f"argument {key!r} of {self.name}, a {type(value).__name__},"
        return f"the call {self.name}"


def _not_a_value(operator: str) -> Callable[..., Any]:
    """A PendingCall used as if it were its value (``f(x) + 1``, ``a, b = f(x)``, a decorated
    function called inside another): a TypeError that says how to get the value."""

    def misused(self: PendingCall[Any], *args: Any) -> Any:
        raise TypeError(
            f"{self.name}(...) is a call waiting to be sent to a pool, not its value, so "
            f"`{operator}` cannot use it. Send it (`{self.name}(...) >> pool`) and use what "
            f"comes back; inside another @sky.compute function, where it already runs on a "
            f"node, call `{self.name}.local(...)` instead"
        )

    misused.__name__ = f"not_a_value_{operator}"
    return misused


# Everything a value would support that a PendingCall does not; `>`, `>>`, `@` and `&` are
# the operators that send it.
for _dunder, _operator in {
    "__add__": "+",
    "__radd__": "+",
    "__sub__": "-",
    "__rsub__": "-",
    "__mul__": "*",
    "__rmul__": "*",
    "__truediv__": "/",
    "__rtruediv__": "/",
    "__floordiv__": "//",
    "__rfloordiv__": "//",
    "__mod__": "%",
    "__rmod__": "%",
    "__pow__": "**",
    "__rpow__": "**",
    "__neg__": "-",
    "__pos__": "+",
    "__abs__": "abs()",
    "__lt__": "<",
    "__le__": "<=",
    "__ge__": ">=",
    "__iter__": "iteration",
    "__getitem__": "[...]",
    "__float__": "float()",
    "__int__": "int()",
    "__index__": "an index",
    "__round__": "round()",
}.items():
    setattr(PendingCall, _dunder, _not_a_value(_operator))


@dataclass(frozen=True, eq=False)
class CallGroup:
    """Calls to run in parallel: ``(a() & b()) >> pool`` returns ``(a_value, b_value)``.

    ``stream`` (from ``gather``): ``group >> pool`` returns an iterator that yields each
    value as soon as it and, when ``ordered``, every call before it, has finished.
    """

    calls: tuple[PendingCall[Any], ...]
    stream: bool = False
    ordered: bool = True
    timeout: float | None = None  # with_timeout: the whole group's bound, in seconds

    def __and__(self, other: PendingCall[Any] | CallGroup) -> CallGroup:
        if isinstance(other, CallGroup):
            return dataclasses.replace(self, calls=self.calls + other.calls)
        if isinstance(other, PendingCall):
            return dataclasses.replace(self, calls=(*self.calls, other))
        return NotImplemented

    def with_timeout(self, timeout: float) -> CallGroup:
        """This group, bounded: ``group >> pool`` raises ``TimeoutError`` unless every call
        has finished ``timeout`` seconds after the group was sent, and the calls not yet
        started are cancelled then. Each call without a ``timeout`` of its own gets this
        one too (counted from when it starts on a node, which then replaces its worker if it
        runs over), so none runs on unbounded after the group gave up on it."""
        return dataclasses.replace(self, timeout=_Options(timeout=timeout).timeout)

    def __rshift__(self, pool: CallTarget) -> Any:
        futures = _target(pool, ">>").submit_all(self._bounded())
        if self.stream:
            # Every call is queued now; the iterator only waits for them.
            return _as_they_finish(futures, ordered=self.ordered)
        together = gather_futures(futures, tuple)
        if self.timeout is None:
            return together.result()
        try:
            return together.result(timeout=self.timeout)
        except TimeoutError:
            if not together.done():
                late = [c.name for c, f in zip(self.calls, futures, strict=True) if not f.done()]
                for future in futures:
                    future.cancel()  # the ones still queued; running ones have their bound
                raise TimeoutError(
                    f"{len(late)} of the group's {len(futures)} calls did not finish within "
                    f"the group's timeout of {self.timeout:g} s: {', '.join(late)}"
                ) from None
            raise  # a call's own TimeoutError

    def __gt__(self, pool: CallTarget) -> Future[tuple[Any, ...]]:
        target = _target(pool, ">")
        if self.stream:
            raise TypeError("gather(..., stream=True) yields values: iterate `group >> pool`")
        return gather_futures(target.submit_all(self._bounded()), tuple)

    def _bounded(self) -> tuple[PendingCall[Any], ...]:
        """The calls, each with the group's timeout unless it has its own."""
        if self.timeout is None:
            return self.calls
        return tuple(
            c if c.timeout is not None else dataclasses.replace(c, timeout=self.timeout)
            for c in self.calls
        )

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self) -> Iterator[PendingCall[Any]]:
        return iter(self.calls)


# skyward 0.5's names for the two values: the same classes.
PendingCompute = PendingCall
PendingComputeGroup = CallGroup


def gather(*calls: PendingCall[Any], stream: bool = False, ordered: bool = True) -> CallGroup:
    """Group pending calls to run in parallel, like ``&`` for any number of them.

    ``gather(*calls) >> pool`` returns their values as a tuple, in the order given.
    ``stream=True``: ``>> pool`` returns an iterator of the values as the calls finish, in
    the order given (``ordered=True``: a value waits for the ones before it) or in the order
    they finish (``ordered=False``). A failed call raises where its value would have been
    yielded; leaving the loop early cancels the calls that have not started.
    """
    for call in calls:
        if not isinstance(call, PendingCall):
            raise TypeError(
                f"sky.gather groups pending calls such as f(x), not a {type(call).__name__}; "
                f"the jax all-gather that sky.gather(tree) used to be is "
                f"sky.plugins.jax_gather(tree)"
            )
    return CallGroup(tuple(calls), stream=stream, ordered=ordered)


def _as_they_finish(futures: list[Future[Any]], *, ordered: bool) -> Iterator[Any]:
    try:
        if ordered:
            for future in futures:
                yield future.result()
            return
        # Not concurrent.futures.as_completed: it takes every future's lock in Python code,
        # where a Ctrl-C can leave one held. A queue's get holds nothing while it waits.
        finished: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()
        for future in futures:
            future.add_done_callback(finished.put)
        for _ in futures:
            yield finished.get().result()
    finally:
        # The loop ended early (break, an error): calls still queued need not run.
        for future in futures:
            future.cancel()


def pending_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` as a pending call, for the pool's methods (``pool.run(fn)``);
    a pending call given alone is itself (``pool.run(f(x))``, what ``>>`` does)."""
    if isinstance(fn, PendingCall):
        if args or kwargs:
            raise TypeError(
                f"{fn.name}(...) is a call with its arguments already: pass it alone, as in "
                f"pool.run(f(x)), or pass the function, as in pool.run(f, x)"
            )
        return fn
    if isinstance(fn, ComputeFunction):
        return PendingCall(fn.fn, args, kwargs, timeout=fn.timeout)
    if not callable(fn):
        raise TypeError(f"expected a function, not {type(fn).__name__}")
    return PendingCall(fn, args, kwargs)


def _target(target: object, operator: str) -> CallTarget:
    """``target`` if it is a pool; the innermost open pool of this thread if it is the
    ``skyward`` module (``f(x) >> sky``); else a TypeError that says what the right side
    must be.

    Without it, ``f(x) >> None`` fails with an AttributeError about ``run``.
    """
    if isinstance(target, CallTarget):
        return target
    if inspect.ismodule(target):
        if target.__name__ == "skyward" or target.__name__.startswith("skyward."):
            pool = innermost(operator)
            assert isinstance(pool, CallTarget)  # only pools say they are open
            return pool
        what = f"the module {target.__name__!r}"
    else:
        what = "None" if target is None else _a(type(target).__name__)
    raise TypeError(
        f"the right side of `{operator}` must be a sky.ComputePool, as in "
        f"`with sky.ComputePool() as pool: f(x) {operator} pool`; got {what}"
    )


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _parameter_names(fn: Callable[..., Any], count: int) -> list[str]:
    names: list[str] = []
    try:
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                names.append(param.name)
            elif param.kind is param.VAR_POSITIONAL:
                names.extend(f"{param.name}[{j}]" for j in range(count - len(names)))
    except (TypeError, ValueError):
        pass
    return (names + [f"#{i}" for i in range(len(names), count)])[:count]


def _a(noun: str) -> str:
    """``noun`` with its article: "an int", "a list"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
