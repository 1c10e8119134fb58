"""Every provider by name: the one table the rest of Skyward reads to know which exist.

``skyward/__init__`` exports each entry's class under its public name, ``pool/named.py``
takes its ``type`` in ``skyward.toml``, ``_extras.py`` names its extra when one of its
imports is missing, ``cli/doctor.py`` lists its extra and runs its credentials check
(``providers/credentials.py``), and ``cli/leftovers.py`` adds its scope to ``skyward ls`` /
``down`` (``providers/scope.py``). None of them names a provider; a new one is its folder
and one line here (and, for type checkers, which cannot read this table, one import line in
``providers/public.py``).

Nothing of a provider is imported here: an entry names modules, loaded on first use
(``load``, ``credentials_check``, ``scope``), so importing this table costs nothing and
``import skyward`` loads no provider.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyward.providers.credentials import CredentialsCheck
    from skyward.providers.scope import Scope


@dataclass(frozen=True)
class Entry:
    """One provider: ``type`` in ``skyward.toml`` and on the command line, the class
    ``skyward.<public>`` defined in ``module``, the extra that installs what it imports
    (``distributions`` for ``skyward doctor``, ``imports`` the modules they provide), and
    where its credentials check, its ``ls``/``down`` scope and its current spot prices
    (``catalog.SpotPrices``) are (``"module:name"``)."""

    type: str
    public: str
    module: str
    extra: str | None = None
    distributions: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    credentials: str | None = None
    leftovers: str | None = None
    spot_prices: str | None = None
    # Its machine types and prices are in the catalog: its folder has ``machines.json``
    # and ``prices.json`` (``cloud/catalog.py``).
    catalog: bool = False

    def load(self) -> builtins.type:  # (``type`` is this class's field)
        """The provider's class (its module imported now)."""
        found = getattr(importlib.import_module(self.module), self.public)
        if not isinstance(found, builtins.type):
            raise TypeError(f"{self.module}.{self.public} is not a class")
        return found

    def credentials_check(self) -> CredentialsCheck | None:
        """The check ``skyward doctor`` runs for this provider, if it has credentials."""
        if self.credentials is None:
            return None
        from skyward.providers.credentials import CredentialsCheck

        found = _named(self.credentials)
        if not isinstance(found, CredentialsCheck):
            raise TypeError(f"{self.credentials} is not a credentials check")
        return found

    def scope(self) -> Scope | None:
        """What it adds to ``skyward ls`` / ``down``, if it leaves anything behind."""
        if self.leftovers is None:
            return None
        from skyward.providers.scope import Scope

        found = _named(self.leftovers)
        if not isinstance(found, Scope):
            raise TypeError(f"{self.leftovers} is not a providers.scope.Scope")
        return found


# A cloud's current spot prices: (region, machine types) -> USD per hour, per (type, zone).
SpotPrices = Callable[[str, list[str]], Mapping[tuple[str, str], float]]


def catalog_clouds() -> tuple[str, ...]:
    """The providers whose machine types the catalog lists, in the registry's order."""
    return tuple(e.type for e in PROVIDERS if e.catalog)


def spot_lookups() -> dict[str, SpotPrices]:
    """Each provider that can say its current spot prices, by ``type``: how to ask it
    (a network call, with its extra and credentials; loaded now)."""
    found: dict[str, SpotPrices] = {}
    for entry in PROVIDERS:
        if entry.spot_prices is not None:
            lookup = _named(entry.spot_prices)
            if not callable(lookup):
                raise TypeError(f"{entry.spot_prices} is not callable")
            found[entry.type] = lookup
    return found


_SSH = ("paramiko",)  # what reaches machines over SSH: each cloud's extra installs it too

# In this order: `skyward doctor`'s lines, `--cloud`'s choices, the types messages list.
PROVIDERS: tuple[Entry, ...] = (
    Entry(type="local", public="Local", module="skyward.providers.local"),
    Entry(
        type="ssh",
        public="SSH",
        module="skyward.providers.ssh",
        extra="ssh",
        distributions=_SSH,
        imports=_SSH,
    ),
    Entry(
        type="aws",
        public="AWS",
        module="skyward.providers.aws",
        extra="aws",
        distributions=("boto3", *_SSH),
        imports=("boto3", "botocore"),
        credentials="skyward.providers.aws.credentials:check",
        leftovers="skyward.providers.aws.scope:SCOPE",
        catalog=True,
        spot_prices="skyward.providers.aws.api:spot_prices_in",
    ),
    Entry(
        type="gcp",
        public="GCP",
        module="skyward.providers.gcp",
        extra="gcp",
        distributions=("google-cloud-compute", *_SSH),
        imports=("google.cloud.compute_v1", "google.auth"),
        credentials="skyward.providers.gcp.credentials:check",
        leftovers="skyward.providers.gcp.scope:SCOPE",
        catalog=True,
    ),
    Entry(
        type="azure",
        public="Azure",
        module="skyward.providers.azure",
        extra="azure",
        distributions=(
            "azure-identity",
            "azure-mgmt-compute",
            "azure-mgmt-network",
            "azure-mgmt-resource",
            *_SSH,
        ),
        imports=(
            "azure.identity",
            "azure.mgmt.compute",
            "azure.mgmt.network",
            "azure.mgmt.resource",
        ),
        credentials="skyward.providers.azure.credentials:check",
        leftovers="skyward.providers.azure.scope:SCOPE",
        catalog=True,
    ),
    Entry(
        type="runpod",
        public="RunPod",
        module="skyward.providers.runpod",
        extra="runpod",
        distributions=_SSH,
        credentials="skyward.providers.runpod.credentials:check",
        leftovers="skyward.providers.runpod.scope:SCOPE",
    ),
    Entry(
        type="vastai",
        public="VastAI",
        module="skyward.providers.vastai",
        extra="vastai",
        distributions=_SSH,
        credentials="skyward.providers.vastai.credentials:check",
        leftovers="skyward.providers.vastai.scope:SCOPE",
    ),
    Entry(
        type="slurm",
        public="Slurm",
        module="skyward.providers.slurm",
        leftovers="skyward.providers.slurm.scope:SCOPE",
    ),
)


def by_type(kind: str) -> Entry | None:
    return next((e for e in PROVIDERS if e.type == kind), None)


def by_public(name: str) -> Entry | None:
    return next((e for e in PROVIDERS if e.public == name), None)


def types() -> list[str]:
    return [e.type for e in PROVIDERS]


def extras_of_imports() -> dict[str, str]:
    """import name -> the extra that installs it (``_extras``' messages)."""
    return {module: e.extra for e in PROVIDERS if e.extra for module in e.imports}


def _named(reference: str) -> object:
    module, _, name = reference.partition(":")
    found: object = getattr(importlib.import_module(module), name)
    return found
