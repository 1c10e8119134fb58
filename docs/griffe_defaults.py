"""A Griffe extension for the API reference: the real defaults of options given as
``**options: Unpack[SomeOptions]``.

Griffe's ``unpack_typeddict`` extension lists each key of the TypedDict as a keyword
parameter, with ``...`` for its default: the defaults live in a pydantic model, not in the
TypedDict. Skyward builds the runtime signature of such a callable from the two
(``skyward/client/options.py``); this reads the defaults back from it, so the reference shows the
one source's values.
"""

from __future__ import annotations

import inspect
from typing import Any

import griffe


class GeneratedSignatureDefaults(griffe.Extension):
    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        defaults = _generated_defaults(func)
        if not defaults:
            return
        for parameter in func.parameters:
            if parameter.default == "..." and parameter.name in defaults:
                parameter.default = defaults[parameter.name]
        for section in func.docstring.parsed if func.docstring else []:
            if section.kind is griffe.DocstringSectionKind.parameters:
                for item in section.value:
                    if item.value == "..." and item.name in defaults:
                        item.value = defaults[item.name]


def _generated_defaults(func: griffe.Function) -> dict[str, str]:
    """Defaults from the ``__signature__`` set on the runtime object (the class, for an
    ``__init__``); nothing for a callable whose signature is its own."""
    owner = func.parent if func.name == "__init__" and func.parent is not None else func
    try:
        runtime = griffe.dynamic_import(owner.path)
    except ImportError:
        return {}
    signature = getattr(runtime, "__dict__", {}).get("__signature__")
    if not isinstance(signature, inspect.Signature):
        return {}
    return {
        name: repr(parameter.default)
        for name, parameter in signature.parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
