"""What Vast.ai adds to ``skyward ls`` / ``down`` (``providers/scope.py``): no flags (the
account is the key's); asked when a key is found (``api.find_key``). The calls go to
``SKYWARD_VASTAI_ENDPOINT`` when it is set (a proxy or a test server).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from skyward.providers.scope import Flag, Given, Places, Scope

if TYPE_CHECKING:
    from skyward.providers.base import Leftover
    from skyward.providers.cloud.keys import LocalKey


class VastScope(Scope):
    flags: tuple[Flag, ...] = ()
    cloud = True

    def given(self, options: Given) -> bool:
        return False

    def configured(self) -> bool:
        from skyward.providers.vastai.api import find_key

        found = find_key(os.environ, Path.home()) is not None
        return found or bool(os.environ.get("SKYWARD_VASTAI_ENDPOINT"))

    def places(self, options: Given) -> Places:
        from skyward.providers.vastai import VastAI
        from skyward.providers.vastai.api import find_key

        found = find_key(os.environ, Path.home())
        if found is None:
            return Places(unchecked=["vastai: not checked: no API key (set VAST_API_KEY)"])
        endpoint = os.environ.get("SKYWARD_VASTAI_ENDPOINT") or None
        inventory = VastAI(api_key=found[0], endpoint_url=endpoint).inventory()
        return Places([("vastai", inventory)] if inventory is not None else [])

    def judges(self, key: LocalKey, options: Given, searched: Sequence[object]) -> bool:
        return key.endpoint == os.environ.get("SKYWARD_VASTAI_ENDPOINT", "")

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        from skyward.providers.vastai.inventory import slug

        return any(x.provider == "vastai" and x.pool == slug(key.pool) for x in leftovers)


SCOPE = VastScope()
