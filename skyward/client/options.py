"""Keyword options spelled once: a ``TypedDict`` names them and their types for callers and
type checkers, a pydantic model holds their defaults and limits, and the signature that
``help()``, notebooks and ``inspect`` show is made from the two.

``ComputePool(**options)`` and every built-in plugin (``sky.plugins.jax(**options)``, ...)
take ``Unpack[...]`` of their ``TypedDict`` and hand the model only what the caller gave
(``validated``), so a default lives in the model and nowhere else. Tests check each
``TypedDict`` against its model (names, types) and against the docs
(``tests/pool/test_pool_options.py``, ``tests/plugins/test_plugin_options.py``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


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
            hint = (instead or {}).get(name) or did_you_mean(name, known.__annotations__)
            said = f"; {hint}" if hint else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{said}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"did you mean 'nodes'?"`` for the known names closest to a misspelled one (none
    close: "")."""
    near = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.7)
    return f"did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


def validated(
    model: type[M], options: Mapping[str, object], known: type, caller: str, **given: object
) -> M:
    """``model`` made from what the caller gave: ``options`` (their names checked against
    ``known``'s first, see ``refuse_unknown``) and ``given``, the options a signature takes
    by name before them (``keras(backend="jax", **options)``)."""
    refuse_unknown(options, known, caller)
    for name in given:
        if name in options:
            raise TypeError(f"{caller}() got {name} both by position and by keyword; give it once")
    return model.model_validate({**given, **options})


def leading(name: str, model: type[BaseModel]) -> inspect.Parameter:
    """The parameter of an option that may also be given by position (``keras("torch")``),
    for ``keyword_signature``'s ``before``: its type and default are ``model``'s field's."""
    field = model.model_fields[name]
    return inspect.Parameter(
        name,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=field.default,
        annotation=field.annotation,
    )


def pinned(package: str, version: str | None) -> str:
    """The pip requirement for ``package`` at ``version``: ``"1.6.0"`` pins it
    (``package==1.6.0``); a specifier (``">=1.4,<2"``) is kept as written; None is any."""
    if not version:
        return package
    return f"{package}{version}" if version.lstrip()[:1] in "<>=!~" else f"{package}=={version}"


def check_version(value: str | None) -> str | None:
    """For a ``version`` option's validator: a version (``"1.6.0"``) or a specifier
    (``">=1.4,<2"``), else ``ValueError`` saying what to write."""
    if value is None:
        return None
    # Here, not at the top: plugins' modules travel to workers, which need not have packaging.
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        if value.lstrip()[:1] in "<>=!~":
            SpecifierSet(value)
        else:
            Version(value)
    except (InvalidSpecifier, InvalidVersion):
        raise ValueError(
            f'{value!r} is neither a version ("1.6.0") nor a version specifier (">=1.4,<2")'
        ) from None
    return value
