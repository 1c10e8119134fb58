"""Optional dependencies: each is imported through ``require``, which names the extra to
install when it is missing. Providers and plugins call it when a pool is *built* (``check``),
so a missing SDK is a clear error before anything starts, not a ``ModuleNotFoundError`` from
deep inside a thread."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from skyward._errors import MissingDependency
from skyward.providers.registry import extras_of_imports

# module -> the extra that installs it: the plugins' here, the providers' in their registry
EXTRAS: dict[str, str] = {
    **extras_of_imports(),
    "jax": "jax",
    "keras": "keras",
}


def require(module: str, *, feature: str) -> ModuleType:
    """Import ``module`` or raise ``MissingDependency`` naming ``feature`` and the extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingDependency(_message(module, feature)) from exc


def check(module: str, *, feature: str) -> None:
    """Like ``require`` without importing the module (finding it is enough, and cheap)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        raise MissingDependency(_message(module, feature))


def _message(module: str, feature: str) -> str:
    extra = EXTRAS.get(module, module.split(".")[0])
    return (
        f"{feature} needs the Python package {module.split('.')[0]!r}, which is not "
        f"installed here. Install it with: pip install 'skyward[{extra}]'"
    )
