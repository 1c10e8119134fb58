"""Skyward: run ordinary Python functions on a pool of machines.

::

    import skyward as sky

    @sky.compute
    def hello(name: str) -> str:
        return f"hello {name} from node {sky.instance_info().node}"

    with sky.ComputePool(nodes=4) as pool:
        print(hello("you") >> pool)     # one node
        print(hello("all") @ pool)      # every node, by rank

Names are imported on first use, so ``import skyward`` stays fast and a worker can report its
Python version before anything heavier is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the private module that defines it (and the providers, by the registry's
# table: providers/registry.py)
_EXPORTS: dict[str, str] = {
    "Allocation": "skyward.providers.base",
    "App": "skyward.client.app",
    "BootstrapError": "skyward._errors",
    "CallGroup": "skyward.client.compute",
    "CallbackWriter": "skyward.worker.redirect",
    "CatalogEntry": "skyward.providers.cloud.catalog",
    "ChannelError": "skyward._errors",
    "CollectiveHang": "skyward._errors",
    "Compute": "skyward.pool",
    "DEFAULT_IMAGE": "skyward._image",
    "ComputeFunction": "skyward.client.compute",
    "ComputePool": "skyward.pool",
    "HostKeyError": "skyward._errors",
    "Image": "skyward._image",
    "InstanceInfo": "skyward._info",
    "LogConfig": "skyward.console.handlers",
    "MissingDependency": "skyward._errors",
    "NoSpecStarted": "skyward._errors",
    "PendingCall": "skyward.client.compute",
    "PendingCompute": "skyward.client.compute",
    "PendingComputeGroup": "skyward.client.compute",
    "PipIndex": "skyward._image",
    "Plugin": "skyward._plugin",
    "PluginError": "skyward._errors",
    "PoolClosed": "skyward._errors",
    "PoolSpec": "skyward.pool.spec",
    "PoolStatistics": "skyward.pool.scheduler",
    "Provider": "skyward.providers.base",
    "ProvisionCancelled": "skyward._errors",
    "ProvisionError": "skyward._errors",
    "ProvisionRequest": "skyward.providers.base",
    "RemoteError": "skyward._errors",
    "RemoteTraceback": "skyward._errors",
    "SerializationError": "skyward._errors",
    "SkywardError": "skyward._errors",
    "Spec": "skyward.pool.fallback",
    "Stacks": "skyward.pool.stacks",
    "StartError": "skyward._errors",
    "Terminated": "skyward._errors",
    "VersionMismatch": "skyward._errors",
    "Volume": "skyward.client.volume",
    "Worker": "skyward.pool.spec",
    "WorkerLost": "skyward._errors",
    "barrier": "skyward.collections.proxies",
    "catalog": "skyward.providers.cloud.catalog",
    "compute": "skyward.client.compute",
    "counter": "skyward.collections.proxies",
    "dict": "skyward.collections.proxies",
    "function": "skyward.client.compute",
    "gather": "skyward.client.compute",
    "instance_info": "skyward._info",
    "is_head": "skyward.worker.output",
    "lock": "skyward.collections.proxies",
    "queue": "skyward.collections.proxies",
    "redirect_output": "skyward.worker.redirect",
    "set": "skyward.collections.proxies",
    "shard": "skyward.worker.multihost",
    "silent": "skyward.worker.output",
    "stderr": "skyward.worker.output",
    "stdout": "skyward.worker.output",
}

# Public modules, loaded on first use too.
_MODULES = ("accelerators", "metrics", "plugins")


if TYPE_CHECKING:
    from skyward import accelerators, metrics, plugins
    from skyward._errors import (
        BootstrapError,
        ChannelError,
        CollectiveHang,
        HostKeyError,
        MissingDependency,
        NoSpecStarted,
        PluginError,
        PoolClosed,
        ProvisionCancelled,
        ProvisionError,
        RemoteError,
        RemoteTraceback,
        SerializationError,
        SkywardError,
        StartError,
        Terminated,
        VersionMismatch,
        WorkerLost,
    )
    from skyward._image import DEFAULT_IMAGE, Image, PipIndex
    from skyward._info import InstanceInfo, instance_info
    from skyward._plugin import Plugin
    from skyward.client.app import App
    from skyward.client.compute import (
        CallGroup,
        ComputeFunction,
        PendingCall,
        PendingCompute,
        PendingComputeGroup,
        compute,
        function,
        gather,
    )
    from skyward.client.volume import Volume
    from skyward.collections.proxies import barrier, counter, dict, lock, queue, set
    from skyward.console.handlers import LogConfig
    from skyward.pool import Compute, ComputePool
    from skyward.pool.fallback import Spec
    from skyward.pool.scheduler import PoolStatistics
    from skyward.pool.spec import PoolSpec, Worker
    from skyward.pool.stacks import Stacks
    from skyward.providers.base import Allocation, Provider, ProvisionRequest
    from skyward.providers.cloud.catalog import CatalogEntry, catalog
    from skyward.providers.public import *  # noqa: F403 - each provider's class, by its name
    from skyward.worker.multihost import shard
    from skyward.worker.output import is_head, silent, stderr, stdout
    from skyward.worker.redirect import CallbackWriter, redirect_output


def __getattr__(name: str) -> Any:
    if name == "__all__":  # read the registry only when asked: a worker never is
        from skyward.providers.registry import PROVIDERS

        value: Any = sorted([*_EXPORTS, "__version__", *_MODULES, *(e.public for e in PROVIDERS)])
    elif name in _MODULES:
        return importlib.import_module(f"skyward.{name}")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        value = _provider(name)
    globals()[name] = value  # later lookups skip this function
    return value


def _provider(name: str) -> type:
    from skyward.providers.registry import by_public

    entry = None if name.startswith("_") else by_public(name)
    if entry is None:
        raise AttributeError(f"module 'skyward' has no attribute {name!r}")
    return entry.load()


def __dir__() -> list[str]:
    return list(__getattr__("__all__"))
