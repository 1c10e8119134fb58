"""Built-in plugins: ``sky.plugins.jax(...)`` and ``sky.plugins.keras(...)``.

Each is a function that returns a ``sky.Plugin``. The modules are ``_jax`` and ``_keras`` so
that the functions never collide with submodules of the same name; they load on first use,
and only the plugins' hooks import jax or keras, on the workers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["jax", "keras"]

if TYPE_CHECKING:
    from skyward.plugins._jax import jax
    from skyward.plugins._keras import keras


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'skyward.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"skyward.plugins._{name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
