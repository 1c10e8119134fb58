"""Built-in plugins, ``sky.plugins.jax(...)`` and ``sky.plugins.keras(...)``, and what
plugin code imports from here: ``Plugin`` (``from skyward.plugins import Plugin``, as in
skyward 0.5) and ``jax_gather``, the all-gather for multi-controller jax programs.

Each plugin is a function that returns a ``sky.Plugin``. The modules are ``_jax`` and
``_keras`` so that the functions never collide with submodules of the same name; they load
on first use, and only the plugins' hooks import jax or keras, on the workers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Plugin",
    "cuml",
    "huggingface",
    "jax",
    "jax_gather",
    "joblib",
    "keras",
    "mps",
    "sklearn",
    "torch",
]

# name -> the module that defines it
_MODULES = {
    "Plugin": "skyward._plugin",
    "jax": "skyward.plugins._jax",
    "jax_gather": "skyward.worker.multihost",
    "keras": "skyward.plugins._keras",
    "mps": "skyward.plugins._nvidia",
    "torch": "skyward.plugins._torch",
    "cuml": "skyward.plugins._nvidia",
    "huggingface": "skyward.plugins._huggingface",
    "joblib": "skyward.plugins._joblib",
    "sklearn": "skyward.plugins._joblib",
}

if TYPE_CHECKING:
    from skyward._plugin import Plugin
    from skyward.plugins._huggingface import huggingface
    from skyward.plugins._jax import jax
    from skyward.plugins._joblib import joblib, sklearn
    from skyward.plugins._keras import keras
    from skyward.plugins._nvidia import cuml, mps
    from skyward.plugins._torch import torch
    from skyward.worker.multihost import jax_gather


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'skyward.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
