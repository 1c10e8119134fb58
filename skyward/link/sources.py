"""Where a function sent by value was written, so that a worker's traceback can show it.

cloudpickle sends a function from a script, a notebook or a test file by value, and names
the file of every code object it pickles ``"<dynamic-code>"``, so that the pickle does not
depend on where the function was defined. A traceback on the worker then reads
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
warm call pays nothing for them.

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

# cloudpickle's name for the file of every code object it pickles.
DYNAMIC = "<dynamic-code>"
# The most source text one function's pickle carries (about 400 lines); a code object past
# it travels with its file name only. Both ends' caches of function pickles allow for it.
BUDGET = 16 * 1024

_lock = threading.Lock()  # guards: _spans, and (on a worker) linecache's entries we merge
# A code object's first line and its lines as the client has them (None: no source), by id
# (hashing a code object hashes its bytecode), with the code itself, which keeps its id from
# being reused.
_spans: dict[int, tuple[types.CodeType, int, tuple[str, ...] | None]] = {}


class Shipment:
    """The lines one pickle carries so far; one per pickling, so not thread-safe."""

    def __init__(self) -> None:
        self._shipped: dict[str, list[tuple[int, int]]] = {}  # file -> (first, last) lines
        self._left = BUDGET

    def reduce(self, code: types.CodeType) -> tuple[object, ...] | None:
        """``code``'s reduction to ``restored(...)``; None for cloudpickle's own copy."""
        filename = code.co_filename
        if filename == DYNAMIC:
            return None  # the copy made below (or code that came by value itself)
        first, lines = _span(code)
        last = first + len(lines) - 1 if lines else first
        stretches = self._shipped.setdefault(filename, [])
        size = sum(map(len, lines or ()))
        inside = any(a <= first and last <= b for a, b in stretches)
        if lines is None or inside or size > self._left:
            lines = ()  # no source here, inside a stretch already carried, or past the budget
        else:
            stretches.append((first, last))
            self._left -= size
        return restored, (code.replace(co_filename=DYNAMIC), filename, first, lines)


def _span(code: types.CodeType) -> tuple[int, tuple[str, ...] | None]:
    """``code``'s first line and the lines from there to the last one it (or code nested in
    it) points at, as linecache has them here."""
    entry = _spans.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1], entry[2]
    first = last = code.co_firstlineno
    stack = [code]
    while stack:
        current = stack.pop()
        for _, end, _, _ in current.co_positions():
            if end is not None and end > last:
                last = end
        stack += [c for c in current.co_consts if isinstance(c, types.CodeType)]
    linecache.checkcache(code.co_filename)  # a file edited since it was read here
    lines: tuple[str, ...] | None = tuple(linecache.getlines(code.co_filename)[first - 1 : last])
    if not lines or not any(line.strip() for line in lines):
        lines = None
    with _lock:
        if len(_spans) > 4096:  # code objects of functions long redefined
            _spans.clear()
        _spans[id(code)] = (code, first, lines)
    return first, lines


def restored(
    code: types.CodeType, filename: str, first: int, lines: tuple[str, ...]
) -> types.CodeType:
    """On the worker, as the function is unpickled: ``code`` under its real file name, and
    its lines where linecache (and so traceback) finds them."""
    if lines:
        _remember(filename, first, lines)
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
