"""Where a function sent by value was written, so that a worker's traceback can show it.

cloudpickle sends a function from a script, a notebook or a test file by value, and (since
3.1.3) names the file of every code object it pickles ``"<dynamic-code>"``, so that the
pickle does not depend on where the function was defined. A traceback on the worker then reads
``File "<dynamic-code>", line 4, in f`` and shows no source line: the worker cannot know
the file, and often has no such file (an SSH host, a cloud VM, a notebook's cell)::

    client (skyward.link.pickling)                    worker (unpickling the function)
    code object of f, file "/home/me/train.py"
      -> restored(copy named "<dynamic-code>",  ─────>  code.replace(co_filename=
                  "/home/me/train.py", 12,               "/home/me/train.py")
                  ("@sky.compute\\n", ...))              lines 12.. of that file into
                                                         linecache, where traceback looks

So each code object the function pickle holds keeps its real file name, and the first one
of each stretch of a file carries that stretch's lines as the client has them (from
linecache: the file on disk, or what IPython registered for a cell). Nested functions and
comprehensions lie inside their parent's stretch and carry only the name. The lines are
looked up once per code object; the pickle they go into is made once per function
(``skyward.link.pickling``) and unpickled once per worker (``skyward.worker.calls``), so a
warm call pays nothing for them. A function inside a call's arguments or a result (a
callback, a returned closure) travels the same way, in that value's pickle.

The worker merges the lines into what linecache already holds for that file, and leaves a
file it has with the very same lines alone (a local pool reads the user's own files, and
linecache keeps checking those for changes). Where its file differs (an older copy on a
host, a path that means another file there), the lines of the shipped functions win over
it, since they are what that code was compiled from; the rest of its lines stay, for code
the worker imported from there itself.

Standard library only: the worker unpickles ``restored`` before it has anything else.
"""

from __future__ import annotations

import linecache
import threading
import types
from dataclasses import dataclass

# cloudpickle's name for the file of every code object it pickles.
DYNAMIC = "<dynamic-code>"
# The most source text one function's pickle carries (about 400 lines); a code object past
# it travels with its file name only. Both ends' caches of function pickles allow for it.
BUDGET = 16 * 1024

_lock = threading.Lock()  # guards: _spans, and (on a worker) linecache's entries we merge


@dataclass(frozen=True, slots=True)
class _Span:
    """One code object as the client sends it: where its lines are, and its two reductions,
    made once (so a function pickled for every call pays a lookup, and pickles the same)."""

    code: types.CodeType  # kept, so that its id (the key) is not reused
    first: int
    last: int
    size: int  # characters of its lines; 0: no source here
    carried: tuple[object, ...]  # restored(copy, file, first, lines)
    bare: tuple[object, ...]  # restored(copy, file, first, ()): inside a stretch carried


# By id: hashing a code object hashes its whole bytecode.
_spans: dict[int, _Span] = {}


class Shipment:
    """The lines one pickle carries so far; one per pickling, so not thread-safe."""

    def __init__(self) -> None:
        self._shipped: dict[str, list[tuple[int, int]]] = {}  # file -> (first, last) lines
        self._left = BUDGET

    def reduce(self, code: types.CodeType) -> tuple[object, ...] | None:
        """``code``'s reduction to ``restored(...)``; None for cloudpickle's own copy."""
        if code.co_filename == DYNAMIC:
            return None  # the copy made in _span (or code that came by value itself)
        span = _spans.get(id(code))
        if span is None or span.code is not code:
            span = _span(code)
        if not span.size or span.size > self._left:
            return span.bare  # no source here, or past the budget
        stretches = self._shipped.setdefault(code.co_filename, [])
        if any(a <= span.first and span.last <= b for a, b in stretches):
            return span.bare  # nested in a function whose lines this pickle carries
        stretches.append((span.first, span.last))
        self._left -= span.size
        return span.carried


def _span(code: types.CodeType) -> _Span:
    first = last = code.co_firstlineno
    try:
        last, lines = _lines(code)
    except Exception:  # a nicety for tracebacks never stops a function from being sent
        lines = ()
    copy = code.replace(co_filename=DYNAMIC)
    span = _Span(
        code,
        first,
        last,
        sum(map(len, lines)),
        (restored, (copy, code.co_filename, first, lines)),
        (restored, (copy, code.co_filename, first, ())),
    )
    with _lock:
        if len(_spans) > 4096:  # code objects of functions long redefined
            _spans.clear()
        _spans[id(code)] = span
    return span


def _lines(code: types.CodeType) -> tuple[int, tuple[str, ...]]:
    """The last line ``code`` (or code nested in it) points at, and its lines from its first
    to there, as linecache has them here (none if they are blank or missing)."""
    first = last = code.co_firstlineno
    if first < 1:
        return last, ()  # code compiled without line numbers
    stack = [code]
    while stack:
        current = stack.pop()
        for _, end, _, _ in current.co_positions():
            if end is not None and end > last:
                last = end
        stack += [c for c in current.co_consts if isinstance(c, types.CodeType)]
    linecache.checkcache(code.co_filename)  # a file edited since it was read here
    lines = tuple(linecache.getlines(code.co_filename)[first - 1 : last])
    return last, lines if any(line.strip() for line in lines) else ()


def restored(
    code: types.CodeType, filename: str, first: int, lines: tuple[str, ...]
) -> types.CodeType:
    """On the worker, as the function is unpickled: ``code`` under its real file name, and
    its lines where linecache (and so traceback) finds them."""
    if lines:
        try:
            _remember(filename, first, lines)
        except Exception:  # never a reason for the function not to arrive
            pass
    return code.replace(co_filename=filename)


def _remember(filename: str, first: int, lines: tuple[str, ...]) -> None:
    with _lock:
        # What linecache has: the worker's own file, or lines remembered for earlier functions.
        known = linecache.getlines(filename)
        end = first - 1 + len(lines)
        if known[first - 1 : end] == list(lines):
            return  # the same lines: nothing to add, and a real file stays checked for changes
        merged = [*known, *["\n"] * (end - len(known))]
        merged[first - 1 : end] = lines
        # No modification time: linecache.checkcache keeps such entries (as it does
        # IPython's cells) instead of looking for a file that may not exist here.
        linecache.cache[filename] = (sum(map(len, merged)), None, merged, filename)
