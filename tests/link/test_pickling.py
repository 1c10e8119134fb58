"""A function is pickled once and reused while pickling it again would give the same bytes.

Functions here are made the way a script or a notebook makes them: in a namespace called
``__main__``, so cloudpickle sends them by value, globals and all.
"""

from __future__ import annotations

import pickle
from typing import Any

import skyward as sky
from skyward.link.pickling import dumps_function, pickle_function


def script(source: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", **names}
    exec(source, namespace)
    return namespace


def test_a_function_that_reads_only_constants_and_modules_is_pickled_once() -> None:
    ns = script(
        "import math\nSCALE = 2.0\ndef helper(x): return x * SCALE\n"
        "def f(x): return helper(math.sqrt(x))\n"
    )
    first = dumps_function(ns["f"])
    assert dumps_function(ns["f"]) is first
    assert first == pickle_function(ns["f"])
    assert pickle.loads(first)(16.0) == 8.0


def test_rebinding_a_global_or_redefining_a_helper_is_seen() -> None:
    ns = script("SCALE = 2\ndef helper(x): return x * SCALE\ndef f(x): return helper(x)\n")
    assert pickle.loads(dumps_function(ns["f"]))(3) == 6
    ns["SCALE"] = 10
    assert pickle.loads(dumps_function(ns["f"]))(3) == 30
    exec("def helper(x): return -x", ns)
    assert pickle.loads(dumps_function(ns["f"]))(3) == -3


def test_a_function_that_reads_something_mutable_is_pickled_every_time() -> None:
    ns = script("CONFIG = {'lr': 0.1}\ndef f(): return CONFIG['lr']\n")
    first = dumps_function(ns["f"])
    ns["CONFIG"]["lr"] = 0.5  # changed in place: no identity changes
    second = dumps_function(ns["f"])
    assert second is not first
    assert pickle.loads(second)() == 0.5
    # Made afresh, but the same bytes while nothing changed: the worker's cache, keyed by
    # them, still finds the function unpickled (source lines and file names included).
    assert dumps_function(ns["f"]) == second


def test_a_mutable_default_or_closure_is_never_cached() -> None:
    ns = script("def f(x=[]): return x\ndef outer():\n    seen = []\n    return lambda: seen\n")
    assert dumps_function(ns["f"]) is not dumps_function(ns["f"])
    g = ns["outer"]()
    assert dumps_function(g) is not dumps_function(g)


def test_workers_see_a_rebound_global_on_the_next_call() -> None:
    ns = script("LIMIT = 1\ndef f(): return LIMIT\n")
    work = sky.compute(ns["f"])
    with sky.ComputePool(nodes=2, quiet=True) as pool:
        assert (work() @ pool) == [1, 1]
        ns["LIMIT"] = 2
        assert (work() @ pool) == [2, 2]
        assert work() >> pool == 2
