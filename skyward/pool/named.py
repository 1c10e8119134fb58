"""``ComputePool.Named("training")``: a pool described in ``skyward.toml``.

::

    ./skyward.toml                            this project's pools (the working directory)
    $XDG_CONFIG_HOME/skyward/skyward.toml     the user's (default ~/.config/skyward/)
    ~/.skyward/defaults.toml                  the same, where skyward 0.5 kept it

Read in that order, the first file wins key by key (tables merge, so a project pool may
name a provider the user's file defines)::

    [providers.lab]
    type = "ssh"                  # a provider's type (providers/registry.py)
    hosts = ["gpu1", "gpu2"]

    [pools.training]
    provider = "lab"              # a [providers] entry, a type ("local"), or an inline table
    nodes = [1, 2]                # a count, or [min, max]
    accelerator = "A100"
    [pools.training.image]
    pip = ["torch"]

Every other key of a pool is a ``ComputePool`` option; each value is validated as the
keyword would be, and a wrong one is a ``ValueError`` naming the file, the table and the
field, before anything is created. ``ComputePool.Named`` builds the pool from what
``read_pool`` finds here, and says where a value the pool refuses came from (``wrong``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pydantic

from skyward.client.options import did_you_mean
from skyward.providers import registry

FILE_NAME = "skyward.toml"


def config_files(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> list[Path]:
    """Where pools are looked for, first wins: the project's file, then the user's."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    user = Path(env.get("XDG_CONFIG_HOME") or home / ".config").expanduser()
    return [
        (cwd or Path.cwd()) / FILE_NAME,
        user / "skyward" / FILE_NAME,
        home / ".skyward" / "defaults.toml",
    ]


class Found(NamedTuple):
    """A pool's description: its provider, built, and its other options, as keywords."""

    where: str  # the file and table, for messages
    provider: Any
    options: dict[str, Any]


def read_pool(
    name: str,
    overrides: Mapping[str, Any],
    *,
    known: set[str],
    files: list[Path] | None = None,
) -> Found:
    """What ``[pools.<name>]`` describes, with ``overrides`` over it; ``known``: the
    pool's option names."""
    files = config_files() if files is None else files
    found = [path for path in files if path.is_file()]
    config: dict[str, Any] = {}
    for path in reversed(found):  # the first file is merged last, so it wins
        config = _merge(config, _read(path))
    pools = config.get("pools", {})
    if not isinstance(pools, dict) or name not in pools:
        there = ", ".join(sorted(pools)) if isinstance(pools, dict) and pools else "none"
        looked = ", ".join(str(p) for p in files)
        raise ValueError(
            f"no pool named {name!r} in skyward.toml (looked in {looked}); the pools "
            f"there: {there}. Add a [pools.{name}] table to one of them"
        )
    where = f"{_source(found, name)} [pools.{name}]"
    table = pools[name]
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table of pool options, not {table!r}")
    options = {**table, **overrides}
    provider = _provider(options.pop("provider", "local"), config, where)
    if "image" in options and isinstance(options["image"], dict):
        options["image"] = _build("Image", options["image"], f"{where} image")
    if isinstance(options.get("nodes"), list):
        options["nodes"] = tuple(options["nodes"])
    for key in options:
        if key not in known:
            near = did_you_mean(key, known)
            raise ValueError(
                f"{where}: {key!r} is not a pool option{'; ' + near if near else ''} (the "
                f"options are {', '.join(sorted(known))})"
            )
    return Found(where, provider, options)


def wrong(where: str, exc: Exception) -> ValueError:
    """What the pool refused in a described pool, said with where it came from."""
    if isinstance(exc, pydantic.ValidationError):
        return ValueError(_fields(where, exc))
    return ValueError(f"{where}: {exc}")


def _provider(value: Any, config: Mapping[str, Any], where: str) -> Any:
    """A provider from a ``[providers]`` name, a bare type, or an inline table."""
    providers = config.get("providers", {})
    if isinstance(value, str) and isinstance(providers, dict) and value in providers:
        table, where = providers[value], f"[providers.{value}]"
    elif isinstance(value, str) and registry.by_type(value) is not None:
        table = {"type": value}
    elif isinstance(value, dict):
        table, where = value, f"{where} provider"
    else:
        names = sorted(providers) if isinstance(providers, dict) else []
        raise ValueError(
            f"{where}: provider {value!r} is neither a [providers] entry "
            f"({', '.join(names) or 'none defined'}) nor a provider type "
            f"({', '.join(registry.types())})"
        )
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table with a type, not {table!r}")
    fields = dict(table)
    kind = fields.pop("type", None)
    entry = registry.by_type(kind) if isinstance(kind, str) else None
    if entry is None:
        types = ", ".join(registry.types())
        raise ValueError(f"{where}: type must be one of {types}, not {kind!r}")
    return _build(entry.public, fields, where)


def _build(public: str, fields: Mapping[str, Any], where: str) -> Any:
    import skyward

    cls = getattr(skyward, public)
    try:
        return cls(**fields)
    except pydantic.ValidationError as exc:
        raise ValueError(_fields(where, exc)) from exc


def _fields(where: str, exc: pydantic.ValidationError) -> str:
    """One line per wrong field: where, which field, what is wrong with it."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(the table)"
        lines.append(f"{where}: {field}: {error['msg']}")
    return "\n".join(lines)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from exc


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _source(found: list[Path], name: str) -> Path:
    """The first file that has ``[pools.<name>]``: the one whose values win."""
    for path in found:
        pools = _read(path).get("pools", {})
        if isinstance(pools, dict) and name in pools:
            return path
    return found[0]
