"""What Verda adds to ``skyward ls`` / ``down`` (``providers/scope.py``): the account of
``VERDA_CLIENT_ID`` / ``VERDA_CLIENT_SECRET``, through ``--verda-endpoint`` or
``SKYWARD_VERDA_ENDPOINT`` when one is set (a proxy or a test server). A pool's key is in
use while things named after it remain.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward.providers.scope import Flag, Given, Places, Scope, any_present

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


class VerdaScope(Scope):
    flags = (
        Flag(
            "--verda-endpoint",
            "verda_endpoint",
            "Verda's API endpoint to look through (default: SKYWARD_VERDA_ENDPOINT, or Verda's).",
            metavar="URL",
        ),
    )
    cloud = True

    def given(self, options: Given) -> bool:
        return options.one("verda_endpoint") is not None

    def configured(self) -> bool:
        names = ("VERDA_CLIENT_ID", "VERDA_CLIENT_SECRET", "SKYWARD_VERDA_ENDPOINT")
        return any_present(names, ())

    def _endpoint(self, options: Given | None = None) -> str:
        given = options.one("verda_endpoint") if options is not None else None
        return given or os.environ.get("SKYWARD_VERDA_ENDPOINT", "")

    def places(self, options: Given) -> Places:
        if not (os.environ.get("VERDA_CLIENT_ID") and os.environ.get("VERDA_CLIENT_SECRET")):
            return Places(
                unchecked=["verda: not checked; set VERDA_CLIENT_ID and VERDA_CLIENT_SECRET"]
            )
        from skyward.providers.verda import Verda

        inventory = Verda(endpoint_url=self._endpoint(options) or None).inventory()
        return Places(found=[("verda account", inventory)] if inventory is not None else [])

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        return key.endpoint == self._endpoint(options)

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        return any(x.provider == "verda" and x.id.startswith(key.key_pair) for x in leftovers)


SCOPE = VerdaScope()
