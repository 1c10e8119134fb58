"""A remote exception's traceback names the user's file and shows their lines.

Functions sent by value (every ``@sky.compute`` function, the helpers they call, a notebook's
cells) carry their file names and source lines to the worker, which has neither: an SSH
host or a VM may not have the file at all, and a cell's lines only ever lived in the
client's ``linecache``.
"""

from __future__ import annotations

import inspect
import linecache
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.pools import PoolFactory
from support.processes import shared_pool

import skyward as sky
from skyward.link import sources
from skyward.link.pickling import dumps_function

HERE = str(Path(__file__).resolve())


def line_of(fn: Any, text: str) -> int:
    """The number of the one line of ``fn``'s source that holds ``text``."""
    lines, first = inspect.getsourcelines(getattr(fn, "fn", fn))
    found = [first + i for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def frame(traceback: str, path: str, line: int, function: str, text: str) -> bool:
    """Whether ``traceback`` shows that frame, with its source line under it."""
    return f'  File "{path}", line {line}, in {function}\n    {text}\n' in traceback


def raise_in_helper(value: int) -> None:
    doubled = value * 2
    raise ValueError(f"helper got {doubled}")


@sky.compute
def fail_here() -> None:
    raise LookupError("raised in the decorated function")


@sky.compute
def fail_in_helpers(value: int) -> None:
    def inner(x: int) -> None:
        raise_in_helper(x + 1)

    [inner(v) for v in (value,)]


@pytest.fixture(scope="module")
def pool(make_module_pool: PoolFactory) -> Iterator[sky.ComputePool]:
    with shared_pool(make_module_pool, nodes=1) as pool:
        yield pool


def remote_traceback(call: sky.PendingCall[Any], pool: sky.ComputePool) -> str:
    with pytest.raises(Exception) as caught:
        call >> pool
    cause = caught.value.__cause__
    assert isinstance(cause, sky.RemoteTraceback)
    return cause.traceback


def test_the_traceback_names_the_file_and_shows_the_raising_line(pool: sky.ComputePool) -> None:
    text = 'raise LookupError("raised in the decorated function")'
    traceback = remote_traceback(fail_here(), pool)
    assert frame(traceback, HERE, line_of(fail_here, text), "fail_here", text), traceback
    assert sources.DYNAMIC not in traceback


def test_helpers_and_nested_functions_show_their_lines(pool: sky.ComputePool) -> None:
    traceback = remote_traceback(fail_in_helpers(3), pool)
    # Python 3.12 runs a list comprehension inline (PEP 709): no frame of its own.
    comprehension = [] if sys.version_info >= (3, 12) else ["<listcomp>"]
    for defined_in, function, text in [
        (fail_in_helpers, "fail_in_helpers", "[inner(v) for v in (value,)]"),
        *[(fail_in_helpers, name, "[inner(v) for v in (value,)]") for name in comprehension],
        (fail_in_helpers, "inner", "raise_in_helper(x + 1)"),
        (raise_in_helper, "raise_in_helper", 'raise ValueError(f"helper got {doubled}")'),
    ]:
        line = line_of(defined_in, text)
        assert frame(traceback, HERE, line, function, text), (function, traceback)
    assert "helper got 8" in traceback


@sky.compute
def apply(fn: Any, value: int) -> Any:
    return fn(value)


def test_a_function_passed_as_an_argument_shows_its_lines(pool: sky.ComputePool) -> None:
    def check(x: int) -> None:  # raises rather than asserts: pytest rewrites asserts
        if x >= 0:
            raise ValueError(f"{x} is not negative")

    traceback = remote_traceback(apply(check, 5), pool)
    text = "raise ValueError(" + 'f"{x} is not negative")'  # this line must not match
    assert frame(traceback, HERE, line_of(check, text), "check", text), traceback
    assert frame(traceback, HERE, line_of(apply, "return fn(value)"), "apply", "return fn(value)")
    assert sources.DYNAMIC not in traceback


CELL = "<ipython-input-7-1f2e3d4c5b6a>"
CELL_SOURCE = """\
import math

def first_in_cell(x):
    return math.sqrt(x) + broken_one(x)

def broken_one(x):
    raise KeyError(f"no key {x} in this cell")

def second_in_cell():
    values = {"a": 1}
    return values["missing from the second"]
"""


@pytest.fixture
def cell() -> Iterator[dict[str, Any]]:
    """Functions defined the way a notebook defines them: compiled from a cell whose lines
    only the client's linecache holds (IPython registers them there)."""
    linecache.cache[CELL] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(True), CELL)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CELL_SOURCE, CELL, "exec"), namespace)
    try:
        yield namespace
    finally:
        linecache.cache.pop(CELL, None)


def test_a_notebook_cell_shows_its_lines_on_the_worker(
    pool: sky.ComputePool, cell: dict[str, Any]
) -> None:
    first, second = sky.compute(cell["first_in_cell"]), sky.compute(cell["second_in_cell"])
    traceback = remote_traceback(first(4.0), pool)
    assert frame(traceback, CELL, 4, "first_in_cell", "return math.sqrt(x) + broken_one(x)")
    assert frame(traceback, CELL, 7, "broken_one", 'raise KeyError(f"no key {x} in this cell")')
    # A second function of the same cell adds its lines; the first's stay.
    traceback = remote_traceback(second(), pool)
    assert frame(traceback, CELL, 11, "second_in_cell", 'return values["missing from the second"]')
    traceback = remote_traceback(first(9.0), pool)
    assert frame(traceback, CELL, 7, "broken_one", 'raise KeyError(f"no key {x} in this cell")')


# ── the worker's end, in this process ───────────────────────────────────────────────────


def compiled(path: Path, source: str, name: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[name]


SOURCE = "def f(x):\n    y = x + 1\n    raise ValueError(y)\n"


def test_a_file_the_worker_has_with_the_same_lines_is_left_to_linecache(tmp_path: Path) -> None:
    path = tmp_path / "same.py"
    path.write_text(SOURCE)
    code = compiled(path, SOURCE, "f").__code__
    try:
        restored = sources.restored(code, str(path), 1, tuple(SOURCE.splitlines(True)))
        assert restored.co_filename == str(path)
        entry = linecache.cache.get(str(path))
        # Read from the file, with its modification time: still checked for changes.
        assert entry is not None and entry[1] is not None
    finally:
        linecache.cache.pop(str(path), None)


def test_a_file_that_differs_on_the_worker_takes_the_shipped_lines_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "older.py"
    path.write_text("# an older copy on the host\ndef f(x):\n    return x\n\nOTHER = 1\n")
    shipped = ("def f(x):\n", "    y = x + 1\n", "    raise ValueError(y)\n")
    code = compiled(path, "\n" + "".join(shipped), "f").__code__
    try:
        sources.restored(code, str(path), 2, shipped)
        assert linecache.getline(str(path), 4) == "    raise ValueError(y)\n"
        assert linecache.getline(str(path), 1) == "# an older copy on the host\n"
        assert linecache.getline(str(path), 5) == "OTHER = 1\n"
    finally:
        linecache.cache.pop(str(path), None)


def test_lines_of_a_file_the_worker_lacks_land_at_their_line_numbers(tmp_path: Path) -> None:
    path = str(tmp_path / "gone" / "ipykernel_42" / "3141592.py")  # not on this machine
    try:
        sources.restored(compile("pass", path, "exec"), path, 10, ("a = 1\n", "b = 2\n"))
        sources.restored(compile("pass", path, "exec"), path, 3, ("c = 3\n",))
        found = [linecache.getline(path, n) for n in (3, 10, 11)]
        assert found == ["c = 3\n", "a = 1\n", "b = 2\n"]
        assert linecache.getline(path, 5).strip() == ""
        linecache.checkcache(path)  # what traceback calls: the lines stay
        assert linecache.getline(path, 10) == "a = 1\n"
    finally:
        linecache.cache.pop(path, None)


def test_the_source_a_pickle_carries_is_bounded(tmp_path: Path) -> None:
    comment = "    # " + "x" * 70 + "\n"
    source = "def big():\n" + comment * 400 + "    raise ValueError('end')\n"
    path = tmp_path / "big.py"
    path.write_text(source)
    fn = compiled(path, source, "big")
    data = dumps_function(fn)
    assert len(data) < 4096  # the name and the line numbers travel, not the 30 kB of lines
    assert pickle.loads(data).__code__.co_filename == str(path)
