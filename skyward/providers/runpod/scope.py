"""What RunPod adds to ``skyward ls`` / ``down`` (``providers/scope.py``): the account of the
API key (``RUNPOD_API_KEY``, ``~/.runpod/config.toml``); no flags, one account per key. The
calls go to ``SKYWARD_RUNPOD_ENDPOINT`` when it is set (a proxy or a test server). A pool's key
left on this machine is stale once no pod named after it remains."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward._errors import SkywardError
from skyward.providers.scope import Given, Places, Scope, any_present

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


class RunPodScope(Scope):
    flags = ()
    cloud = True

    def given(self, options: Given) -> bool:
        return False

    def configured(self) -> bool:
        return any_present(
            ("RUNPOD_API_KEY", "SKYWARD_RUNPOD_ENDPOINT"), ("~/.runpod/config.toml",)
        )

    def places(self, options: Given) -> Places:
        from skyward.providers.runpod import RunPod
        from skyward.providers.runpod.api import api_key

        try:
            key = api_key(None)
        except SkywardError as exc:
            return Places(unchecked=[f"runpod: not checked: {exc}"])
        endpoint = os.environ.get("SKYWARD_RUNPOD_ENDPOINT") or None
        inventory = RunPod(api_key=key, endpoint_url=endpoint).inventory()
        return Places(found=[("runpod account", inventory)] if inventory else [])

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        return bool(searched) and key.endpoint == os.environ.get("SKYWARD_RUNPOD_ENDPOINT", "")

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        """A pool's key is in use while a pod named after it remains (its name is the
        leftover's ``region``)."""
        return any(x.provider == "runpod" and x.region.startswith(key.key_pair) for x in leftovers)


SCOPE = RunPodScope()
