"""What Azure adds to ``skyward ls`` / ``down`` (``providers/scope.py``): ``--subscription``
(by default ``AZURE_SUBSCRIPTION_ID``) and ``--azure-base-url`` (a sovereign cloud's
Resource Manager). Credentials are ``DefaultAzureCredential``'s: the environment, a managed
identity, ``az login``. A pool is one resource group, which plays its key pair's part for
the pool keys left on this machine.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward.providers.scope import Flag, Given, Places, Scope, any_present

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


class AzureScope(Scope):
    flags = (
        Flag(
            "--subscription",
            "subscriptions",
            "An Azure subscription to look in (repeatable; default: AZURE_SUBSCRIPTION_ID).",
            multiple=True,
        ),
        Flag(
            "--azure-base-url",
            "azure_base_url",
            "The Azure Resource Manager endpoint, for a sovereign cloud (default: public Azure).",
        ),
    )
    cloud = True

    def given(self, options: Given) -> bool:
        return bool(options.many("subscriptions") or options.one("azure_base_url"))

    def configured(self) -> bool:
        # A subscription or a service principal named, or the Azure CLI's sign-in.
        return any_present(
            ("AZURE_SUBSCRIPTION_ID", "AZURE_CLIENT_ID", "AZURE_TENANT_ID"),
            (os.environ.get("AZURE_CONFIG_DIR", "~/.azure") + "/azureProfile.json",),
        )

    def places(self, options: Given) -> Places:
        """Each subscription named, else ``AZURE_SUBSCRIPTION_ID``'s."""
        named = options.many("subscriptions")
        asked = list(named) or [s for s in [os.environ.get("AZURE_SUBSCRIPTION_ID")] if s]
        if importlib.util.find_spec("azure.mgmt.compute") is None:
            return Places(
                unchecked=["azure: not checked; install it with: pip install 'skyward[azure]'"]
            )
        if not asked:
            return Places(
                unchecked=["azure: not checked; set AZURE_SUBSCRIPTION_ID or pass --subscription"]
            )
        from skyward.providers.azure.inventory import AzureInventory

        found: list[tuple[str, Inventory]] = [
            (
                f"azure {subscription}",
                AzureInventory(
                    subscription=subscription,
                    credential=None,
                    base_url=options.one("azure_base_url"),
                    connection_verify=None,
                    release_timeout=1200.0,
                ),
            )
            for subscription in asked
        ]
        return Places(found)

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        # Only when a subscription answered, and for keys made through the endpoint searched.
        from skyward.providers.azure.inventory import AzureInventory

        if not any(isinstance(inventory, AzureInventory) for inventory in searched):
            return False
        return key.endpoint == (options.one("azure_base_url") or "")

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        return any(
            (x.provider, x.region, x.id) == ("azure", key.region, key.key_pair)
            for x in leftovers
            if x.kind == "resource group"
        )


SCOPE = AzureScope()
