"""A function's pickle, made once and reused while it would come out the same.

cloudpickle pickles a function defined in a script or a notebook by value: its code, the
globals it uses, its defaults and closure. That costs ten to thirty microseconds even for a
no-op, which is most of a warm round trip, and ``f(x) >> pool`` in a loop pays it every
time. So the bytes are kept, per function object, with the objects the pickle was made from
(every global it reads, closure cell, default, attribute, recursively through the helper
functions it calls that travel by value too), and reused while each of those is still the
*same object*, the modules registered for pickling by value are the same, and no module was
imported since.

Only functions whose pickle cannot change without one of those identities changing are
kept: everything they reach must be immutable (numbers, strings, bytes, tuples and
frozensets of those), importable by name (modules, classes and functions of installed or
imported modules), or such a function itself. A function that reads a list, a dict, an
object or a class defined in ``__main__`` (which can be changed in place, unseen by any
identity) is pickled afresh for every call, as before. So what a worker sees never differs
from what pickling at that moment would have sent.

The pickle keeps each code object's real file name and carries the function's source lines
(``skyward.link.sources``), so a traceback on a worker shows them; they are looked up when
the pickle is made, so a cached pickle costs nothing more.
"""

from __future__ import annotations

import functools
import io
import itertools
import operator
import site
import sys
import sysconfig
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from skyward.link import sources

# Pickles larger than this are not kept: they hold big constants, and pickling them
# dominates less (the worker's cache of unpickled functions has the same bound). The source
# lines a pickle carries count on top, so they never make a function pickle each call.
_MAX_BYTES = (1 << 16) + sources.BUDGET
# How deep the check follows tuples and helper functions before it gives up (no caching).
_MAX_DEPTH = 8
_ATOMS = frozenset({int, float, complex, str, bytes, bool, type(None), type(...), range})
_ABSENT = object()  # what a read found where there was nothing (a name not defined yet)


class _Reads:
    """Every read a function's pickle depends on, recorded while the function is first
    looked at, so that later calls only repeat the reads and compare what they find with
    ``is``: the same objects mean the same pickle (see the module docstring). The reads of
    one object are repeated by one ``attrgetter`` (or ``itemgetter``) and compared in one
    ``map(operator.is_, ...)``: a fraction of walking the function again."""

    __slots__ = (
        "_absent",
        "_attributes",
        "_checks",
        "_expected",
        "_getters",
        "_items",
        "_lengths",
        "_missing",
        "_rare",
        "_sized",
        "_sizes",
        "_sources",
    )

    def __init__(self) -> None:
        # by id of the object read: (the object, [names], [what they were])
        self._attributes: dict[int, tuple[object, list[str], list[object]]] = {}
        self._items: dict[int, tuple[dict[Any, Any], list[object], list[object]]] = {}
        self._absent: dict[int, tuple[dict[Any, Any], set[object]]] = {}  # keys not there
        self._missing: list[tuple[object, str]] = []  # attributes not there
        self._sizes: list[tuple[dict[Any, Any], int]] = []  # len(mapping) == size
        self._checks: list[tuple[Callable[[Any], Any], object, tuple[object, ...]]] = []
        self._getters: tuple[Callable[[Any], tuple[object, ...]], ...] = ()  # set by seal
        self._sources: tuple[object, ...] = ()
        self._expected: tuple[object, ...] = ()
        self._sized: tuple[dict[Any, Any], ...] = ()  # set by seal, from _sizes
        self._lengths: tuple[int, ...] = ()
        self._rare = False  # keys or attributes found absent: checked too

    def attribute(self, obj: object, name: str) -> Any:
        value = getattr(obj, name, _ABSENT)
        if value is _ABSENT:  # rare: a builtin without __module__, a name a module lacks
            self._missing.append((obj, name))
            return None
        _, names, values = self._attributes.setdefault(id(obj), (obj, [], []))
        names.append(name)
        values.append(value)
        return value

    def item(self, mapping: dict[Any, Any], key: object) -> Any:
        value = mapping.get(key, _ABSENT)
        if value is _ABSENT:
            self._absent.setdefault(id(mapping), (mapping, set()))[1].add(key)
        else:
            _, keys, values = self._items.setdefault(id(mapping), (mapping, [], []))
            keys.append(key)
            values.append(value)
        return value

    def size(self, mapping: dict[Any, Any]) -> None:
        self._sizes.append((mapping, len(mapping)))  # a key added later is a change

    def seal(self, root: object) -> _Reads:
        """Done recording: build the getters ``unchanged`` repeats. ``root`` (the function
        the reads are for) is read through a weak proxy: the cache's entry must not keep
        its function alive, or the function, its closure and the entry would never go.
        Once it is gone, a read raises ``ReferenceError``: changed."""
        for obj, names, values in self._attributes.values():
            self._checks.append((operator.attrgetter(*names, *_once(names)), obj, _tuple(values)))
        for mapping, keys, values in self._items.values():
            self._checks.append((operator.itemgetter(*keys, *_once(keys)), mapping, _tuple(values)))
        self._attributes.clear()
        self._items.clear()
        # Every getter called on its object, and what they return compared with what
        # they returned then, in one pass of C code (no Python frame per object).
        self._getters = tuple(getter for getter, _, _ in self._checks)
        self._sources = tuple(
            weakref.proxy(source) if source is root else source for _, source, _ in self._checks
        )
        self._expected = tuple(itertools.chain.from_iterable(e for _, _, e in self._checks))
        self._checks.clear()
        # The sizes, compared in one step: the mappings, and their lengths then.
        self._sized = tuple(mapping for mapping, _ in self._sizes)
        self._lengths = tuple(size for _, size in self._sizes)
        self._rare = bool(self._absent or self._missing)
        return self

    def unchanged(self) -> bool:
        """Whether every read finds what it found when recorded."""
        try:
            found = itertools.chain.from_iterable(map(_call, self._getters, self._sources))
            if not all(map(operator.is_, found, self._expected)):
                return False
            if tuple(map(len, self._sized)) != self._lengths:
                return False
            if self._rare:
                for mapping, absent in self._absent.values():
                    if not mapping.keys().isdisjoint(absent):
                        return False
                for obj, name in self._missing:
                    if hasattr(obj, name):
                        return False
        except Exception:  # a read that now fails (a name deleted, an empty cell): changed
            return False
        return True


# ``getter(source)``, as C code: operator.call (Python 3.11+).
_call = operator.call


def _once(names: list[Any]) -> list[Any]:
    # A getter of one name returns the value, not a tuple: such a getter asks twice.
    return names if len(names) == 1 else []


def _tuple(values: list[object]) -> tuple[object, ...]:
    return (*values, *_once(values))


_lock = threading.Lock()  # guards: _names
# id(function) -> (a weak reference to it, by-value registry, len(sys.modules), the reads it
# was made from, the bytes). By id, not a WeakKeyDictionary: its ``get`` is Python code that
# makes a weak reference on every call. An entry goes when its function does (_forget).
_Entry = tuple["weakref.ref[Callable[..., Any]]", frozenset[str], int, "_Reads", bytes]
_cache: dict[int, _Entry] = {}
# The global names each code object reads, by id (hashing a code object hashes its whole
# bytecode), with the code object itself, which also keeps its id from being reused.
_names: dict[int, tuple[types.CodeType, tuple[str, ...]]] = {}
# cloudpickle's registry of modules pickled by value, read in place once found (its public
# ``list_registry_pickle_by_value`` copies it on every call). None before the first pickle
# (`import skyward` does not import cloudpickle), or where cloudpickle keeps it elsewhere.
_live_registry: set[str] | None = None


def dumps_function(fn: Callable[..., Any]) -> bytes:
    """``cloudpickle.dumps(fn, protocol=5)`` with the source lines its tracebacks need
    (``skyward.link.sources``), from the cache when it would be the same."""
    registry = _live_registry if _live_registry is not None else _registry_copy()
    modules = len(sys.modules)
    entry = _cache.get(id(fn))
    if (
        entry is not None
        and entry[0]() is fn
        and entry[2] == modules
        and entry[1] == registry
        and entry[3].unchanged()
    ):
        return entry[4]
    frozen = frozenset(registry)
    reads = _reads(fn, frozen) if isinstance(fn, types.FunctionType) else None
    data = pickle_function(fn)
    if reads is not None and len(data) <= _MAX_BYTES:
        key = id(fn)
        ref = weakref.ref(fn, functools.partial(_forget, _cache, key))
        _cache[key] = (ref, frozen, modules, reads, data)  # one store: atomic
    return data


def _forget(cache: dict[int, _Entry], key: int, ref: weakref.ref[Callable[..., Any]]) -> None:
    """A cached function is gone: its entry too, unless a new function took its id. No
    lock: a collection may call this while any thread holds any lock. (``cache`` is bound
    in: at interpreter exit, module globals may be gone before the last functions.)"""
    entry = cache.get(key)
    if entry is not None and entry[0] is ref:
        cache.pop(key, None)


def _registry_copy() -> set[str]:
    """cloudpickle's registry of modules pickled by value, copied; imports cloudpickle and
    finds the registry itself, for the next calls, where it can."""
    global _live_registry
    import cloudpickle

    by_value = getattr(getattr(cloudpickle, "cloudpickle", None), "_PICKLE_BY_VALUE_MODULES", None)
    if isinstance(by_value, set):
        _live_registry = by_value
    return set(cloudpickle.list_registry_pickle_by_value())


def pickle_function(fn: Callable[..., Any]) -> bytes:
    """``fn`` pickled afresh, its code objects with their file names and source lines."""
    with io.BytesIO() as file:
        _pickler()(file).dump(fn)
        return file.getvalue()


def pickle_value(obj: object, buffer_callback: Callable[[Any], object]) -> bytes:
    """``cloudpickle.dumps(obj, protocol=5, buffer_callback=...)``, where a function inside
    ``obj`` (a call's argument, a returned closure) keeps its file name and source lines as
    a function sent to run does, so that a traceback through it shows them too."""
    with io.BytesIO() as file:
        _pickler()(file, buffer_callback).dump(obj)
        return file.getvalue()


@functools.cache
def _pickler() -> Callable[..., Any]:
    """cloudpickle's pickler, but code objects keep their file and carry their lines.

    Made on first use: importing skyward does not import cloudpickle.
    """
    import cloudpickle

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        def __init__(
            self, file: io.BytesIO, buffer_callback: Callable[[Any], object] | None = None
        ) -> None:
            super().__init__(file, protocol=5, buffer_callback=buffer_callback)
            self._sources = sources.Shipment()

        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is types.CodeType:
                reduced = self._sources.reduce(obj)
                if reduced is not None:
                    return reduced
            return super().reducer_override(obj)

    return Pickler


def _reads(fn: types.FunctionType, registry: frozenset[str]) -> _Reads | None:
    """The reads ``fn``'s pickle is made from, or None if it could change without one of
    them changing (something mutable is reachable)."""
    reads = _Reads()
    if not _function(fn, registry, reads, set(), 0):
        return None
    reads.seal(fn)
    if "<locals>" in fn.__qualname__ and any(value is fn for value in reads._expected):
        # A closure that reaches itself (a recursive helper made inside a function): its
        # entry would hold it, so it would never go, nor would its entry. Functions made at
        # a module's top level are held by the module anyway.
        return None
    return reads


def _function(
    fn: types.FunctionType, registry: frozenset[str], reads: _Reads, seen: set[int], depth: int
) -> bool:
    if id(fn) in seen:
        return True  # recursion, or a helper reached twice: recorded already
    seen.add(id(fn))
    if _by_reference(fn, registry, reads):
        return True  # pickled as "module.name": nothing of it travels
    if depth > _MAX_DEPTH:
        return False
    # What cloudpickle's _function_getstate puts in the pickle, besides the code.
    code = reads.attribute(fn, "__code__")
    for name in ("__name__", "__qualname__", "__doc__"):
        reads.attribute(fn, name)  # (__module__ was read by _by_reference)
    values: list[object] = [reads.attribute(fn, "__defaults__")]
    for cell in reads.attribute(fn, "__closure__") or ():
        try:
            values.append(reads.attribute(cell, "cell_contents"))
        except ValueError:
            return False  # an empty cell (a name assigned later): not worth caching
    namespace = fn.__globals__  # read-only: always the same dict
    for name in _global_names(code):
        value = reads.item(namespace, name)
        if value is not _ABSENT:
            values.append(value)
    for attribute in ("__kwdefaults__", "__dict__", "__annotations__"):
        mapping = reads.attribute(fn, attribute)
        if mapping is None:
            continue
        if type(mapping) is not dict:
            return False
        reads.size(mapping)
        for key in mapping:
            values.append(key)
            values.append(reads.item(mapping, key))
    return all(_frozen(value, registry, reads, seen, depth + 1) for value in values)


def _frozen(
    value: object, registry: frozenset[str], reads: _Reads, seen: set[int], depth: int
) -> bool:
    """Whether ``value`` pickles the same as long as it is the same object (the read that
    found it checks that); records the reads below it."""
    kind = type(value)
    if kind in _ATOMS:
        return True
    if depth > _MAX_DEPTH:
        return False
    if kind is tuple or kind is frozenset:  # immutable: their items cannot change
        return all(_frozen(item, registry, reads, seen, depth + 1) for item in value)  # type: ignore[attr-defined]
    if kind is types.FunctionType:
        return _function(value, registry, reads, seen, depth + 1)  # type: ignore[arg-type]
    if kind is types.ModuleType:
        name = reads.attribute(value, "__name__")
        return reads.item(sys.modules, name) is value and not _registered(name, registry)
    if isinstance(value, type) or kind is types.BuiltinFunctionType:
        return _by_reference(value, registry, reads)
    return False


def _by_reference(obj: Any, registry: frozenset[str], reads: _Reads) -> bool:
    """cloudpickle's rule: a function or class its module holds under its name, in a module
    that is imported here and not registered for pickling by value, travels as a name."""
    module_name = reads.attribute(obj, "__module__")
    if not module_name or module_name == "__main__" or _registered(module_name, registry):
        return False
    target: Any = reads.item(sys.modules, module_name)
    for part in (reads.attribute(obj, "__qualname__") or "<locals>").split("."):
        if target is _ABSENT or target is None or part == "<locals>":
            return False
        target = reads.attribute(target, part)
    return target is obj


def _registered(module_name: str, registry: frozenset[str]) -> bool:
    if not registry:
        return False
    parts = module_name.split(".")
    return any(".".join(parts[:i]) in registry for i in range(1, len(parts) + 1))


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names ``code`` (and code nested in it) may read as globals: a superset (attribute
    names are in ``co_names`` too), which only makes the check stricter."""
    entry = _names.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    found: dict[str, None] = {}
    stack = [code]
    while stack:
        current = stack.pop()
        found.update(dict.fromkeys(current.co_names))
        stack += [c for c in current.co_consts if isinstance(c, types.CodeType)]
    names = tuple(found)
    with _lock:
        if len(_names) > 4096:  # code objects of functions long redefined
            _names.clear()
        _names[id(code)] = (code, names)
    return names


# ----------------------------------------------------------------------------------------------
# Which of the client's modules a remote worker cannot import, and so gets by value.
#
# cloudpickle pickles a function by reference (module and name) when its module is
# importable, so a function from the user's own ``helpers.py`` arrives on a remote worker as
# "import helpers", which fails there. Workers can import the standard library, what the image
# installs, and skyward; any other module the client has imported, from a file outside the
# interpreter's own directories (the script's neighbours, a notebook's helpers, a package
# installed in editable mode), is registered with ``cloudpickle.register_pickle_by_value``
# before a call to a remote pool is pickled. Local workers see the client's files, so local
# pools never need this.

_lock = threading.Lock()  # guards: _seen, _looked_at
_seen = 0  # len(sys.modules) at the last scan: new imports are what needs a look
_looked_at: set[str] = set()  # names already classified; a module's file does not move


@functools.cache
def _system_roots() -> tuple[str, ...]:
    roots: set[str] = set()
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = sysconfig.get_path(key, vars={"base": prefix, "platbase": prefix})
            if path:
                roots.add(str(Path(path).resolve()))
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.add(str(Path(path).resolve()))
    return tuple(sorted(roots))


def client_only_modules(names: Iterable[str] | None = None) -> list[str]:
    """Top-level modules imported here (of ``names``, default all) whose files are not
    where installed code lives."""
    roots = _system_roots()
    found = []
    for name in list(sys.modules) if names is None else names:
        module = sys.modules.get(name)
        if "." in name or name in ("__main__", "skyward") or module is None:
            continue
        file = getattr(module, "__file__", None)
        if not file:
            continue  # built in, frozen, or a namespace package
        path = str(Path(file).resolve())
        if not path.startswith(roots):
            found.append(name)
    return found


def ship_client_modules() -> None:
    """Register every client-only module for pickling by value; cheap when none is new.

    Runs before every call to a remote pool is pickled: a glance at ``len(sys.modules)``
    when nothing was imported, and only the new names when something was.
    """
    global _seen
    with _lock:
        if len(sys.modules) == _seen:
            return
        _seen = len(sys.modules)
        new = [name for name in list(sys.modules) if name not in _looked_at]
        _looked_at.update(new)
        import cloudpickle

        for name in client_only_modules(new):
            cloudpickle.register_pickle_by_value(sys.modules[name])
