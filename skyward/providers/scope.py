"""What a provider adds to ``skyward ls`` and ``skyward down``: its scope.

``cli/leftovers.py`` names no provider. For each registry entry with a scope it adds the
scope's flags to both commands, asks the scope which places to search, reads what each
place searched, turns the provider's advice into the commands' flags, and lets the scope
judge the pool keys its pools left on this machine (``cloud/keys.py``)::

    flags given ─> given? ─> places ─> inventory.leftovers ─> searched     "Checked: ..."
                               └─ "<type>: not checked: why; what to install or set" ─> advice
    leftovers ─> key judged? and its pool holds nothing of it ─> a stale pool key

A cloud's scope (``cloud = True``) is one of ``--cloud``'s choices and is asked when no
provider's flags are given: an account is always there to look at. Any other scope (a
cluster) is asked only for what its own flags name. A cloud that nothing on this machine
points at (no credentials, no configuration: ``configured``) is left out of a search that
names no cloud, so a machine that runs only local pools gets an answer, not a failure. A
scope is a stateless value: what one search found is passed to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


@dataclass(frozen=True)
class Flag:
    """One option a provider adds to both commands: ``--region R``."""

    option: str  # "--region"
    dest: str  # the name its value is read by (``Given``): "regions"
    help: str
    multiple: bool = False  # repeatable: its values are a tuple, () when not given
    metavar: str | None = None
    path: bool = False  # a file's path (not a directory)


class Given:
    """The values of the providers' flags in one command line, by ``Flag.dest``."""

    def __init__(self, values: Mapping[str, object]) -> None:
        self._values = dict(values)

    def many(self, dest: str) -> tuple[str, ...]:
        """A repeatable flag's values."""
        value = self._values.get(dest, ())
        if not isinstance(value, tuple):
            raise TypeError(f"{dest} is not a repeatable flag's value: {value!r}")
        return tuple(str(v) for v in value)

    def one(self, dest: str) -> str | None:
        value = self._values.get(dest)
        return None if value is None else str(value)

    def path(self, dest: str) -> Path | None:
        value = self._values.get(dest)
        return None if value is None else Path(str(value))


@dataclass(frozen=True)
class Places:
    """The places a scope will search, each as ``(where, inventory)`` (``where``: "<type>
    <place>", as messages name it), and one line per place it cannot search:
    ``"<type>: not checked: why"`` with what to install or set."""

    found: list[tuple[str, Inventory]] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Searched:
    """What one place's ``leftovers`` looked through: its ``Checked:`` entry (None: nothing
    it could say it searched), and the parts it could not search."""

    checked: str | None
    problems: Sequence[str] = ()


def any_present(names: Sequence[str], paths: Sequence[str]) -> bool:
    """Whether any environment variable in ``names`` is set, or any file or directory in
    ``paths`` (``~`` expanded) exists: a scope's ``configured``."""
    if any(os.environ.get(name) for name in names):
        return True
    return any(Path(path).expanduser().exists() for path in paths)


@runtime_checkable
class Scope(Protocol):
    """A provider's part of ``skyward ls`` and ``skyward down``. The methods with a body
    here are what a scope that does not define them does (subclass this to inherit them)."""

    flags: tuple[Flag, ...]
    cloud: bool  # one of --cloud's choices, asked by default (see the module docstring)

    def given(self, options: Given) -> bool:
        """Whether this provider's flags were given (then it is asked)."""
        ...

    def places(self, options: Given) -> Places:
        """Where to search, from the flags (and the usual environment: credentials)."""
        ...

    def configured(self) -> bool:
        """Whether this machine holds anything that points at this provider: credentials or
        its configuration in the usual places, read without asking the network. A cloud
        not configured is left out of a search that names no cloud (``--cloud`` asks it
        anyway). A scope that cannot tell says it is."""
        return True

    def searched(self, where: str, inventory: Inventory) -> Searched:
        """After ``inventory.leftovers``: what it searched."""
        return Searched(where)

    def advice(self, text: str) -> str:
        """The provider's advice as the commands take it: its Python options become their
        flags (``sky.X(region='r')`` -> ``--region r``)."""
        return text

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        """Whether this search can tell if ``key``'s pool is gone: the key was made through
        the endpoint searched, in a place searched (``searched``: the inventories that
        answered). A key not judged is left alone."""
        return False

    def searched_kept(self, record: Mapping[str, object], options: Given) -> bool:
        """Whether this search covered the place of a kept warm set whose cloud record is
        ``record`` (then ``down`` ended it, and its record may go). A cloud's search covers
        its kept sets; a scope whose flags name places (clusters) says whether it was one of
        them."""
        return True

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        """Whether ``leftovers`` still hold what ``key`` opens (its key pair, or what plays
        its part): then its pool is there and the key stays."""
        return False
