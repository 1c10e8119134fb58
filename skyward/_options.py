"""Keyword options spelled once: a ``TypedDict`` names them and their types for callers and
type checkers, a pydantic model holds their defaults and limits, and the signature that
``help()``, notebooks and ``inspect`` show is made from the two.

``ComputePool(**options)`` and ``sky.plugins.jax(**options)`` take ``Unpack[...]`` of their
``TypedDict`` and hand the model only what the caller gave, so a default lives in the model
and nowhere else. Tests check each ``TypedDict`` against its model (names, types) and
against the docs (``tests/test_pool_options.py``, ``tests/test_plugin_jax.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, get_type_hints

from pydantic import BaseModel


def keyword_signature(
    options: type,
    model: type[BaseModel],
    *,
    before: Sequence[inspect.Parameter] = (),
    returns: Any = inspect.Signature.empty,
) -> inspect.Signature:
    """``before`` then one keyword-only parameter per key of the ``options`` TypedDict, in
    its order, with its type and the default of ``model``'s field of that name.

    A field whose default is made afresh each time (``default_factory``: a pool's random
    name) shows ``None``, which the model must then take as "the default"; so does a key
    that is no field of the model (an alias its validators unfold). A key that ``before``
    names is shown there only (an option that may also be given by position).
    """
    parameters = list(before)
    shown = {p.name for p in parameters}
    for name, annotation in get_type_hints(options).items():
        if name in shown:
            continue
        field = model.model_fields.get(name)
        default = None  # an alias, or a default made afresh
        if field is not None and field.default_factory is None:
            default = field.default
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return inspect.Signature(parameters, return_annotation=returns)


def refuse_unknown(
    options: Mapping[str, object],
    known: type,
    caller: str,
    instead: Mapping[str, str] | None = None,
) -> None:
    """A misspelled keyword is a ``TypeError``, as Python says it for any other call (the
    model would call it an extra input, which reads as a wrong value). ``instead``: for
    keywords another API took (skyward 0.5's), what to write here."""
    for name in options:
        if name not in known.__annotations__:
            hint = (instead or {}).get(name)
            said = f"; {hint}" if hint else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{said}")
