"""``skyward.api``: the public names that code written for the public skyward project imports
from ``skyward.api`` (``from skyward.api import Worker, InstanceInfo``).

Each is the very object ``skyward.<name>`` is, loaded on first use as there; nothing is
defined here. A name that project had and Skyward does not is an ``AttributeError`` saying
what to write instead (``docs/coming-from-0.5.md`` lists them all).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = (
    "App",
    "CallbackWriter",
    "Compute",
    "ComputePool",
    "DEFAULT_IMAGE",
    "Image",
    "InstanceInfo",
    "LogConfig",
    "PendingCompute",
    "PendingComputeGroup",
    "PipIndex",
    "Plugin",
    "PoolSpec",
    "Spec",
    "Volume",
    "Worker",
    "compute",
    "function",
    "gather",
    "instance_info",
    "is_head",
    "redirect_output",
    "shard",
    "silent",
    "stderr",
    "stdout",
)

# What to write instead of a skyward 0.5 name that is not here.
_INSTEAD = {
    "sky": "name the pool: `with sky.ComputePool(...) as pool: f(x) >> pool`",
    "Offer": "sky.accelerators.machines(...) for the catalog's machine types and prices",
    "InstanceType": "sky.accelerators.machines(...) for the catalog's machine types and prices",
    "PendingFunction": "skyward.api.PendingCompute (sky.PendingCall)",
    "PendingFunctionGroup": "skyward.api.PendingComputeGroup (sky.CallGroup)",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module("skyward"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    instead = _INSTEAD.get(name)
    hint = f"; write {instead}" if instead else "; see docs/coming-from-0.5.md"
    raise AttributeError(f"module 'skyward.api' has no attribute {name!r}{hint}")


def __dir__() -> list[str]:
    return __all__
