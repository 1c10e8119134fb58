"""What Lambda Cloud adds to ``skyward ls`` / ``down`` (``providers/scope.py``): the account
the API key opens (``LAMBDA_API_KEY``, ``~/.lambda_cloud/lambda_keys``), through
``SKYWARD_LAMBDA_ENDPOINT`` when it is set (a proxy or a test server). It adds no flags: a
key opens one account. A pool key is in use while its SSH key is registered there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward.providers.scope import Given, Places, Scope

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


class LambdaScope(Scope):
    flags = ()
    cloud = True

    def given(self, options: Given) -> bool:
        return False

    def places(self, options: Given) -> Places:
        from skyward.providers.lambdacloud import Lambda
        from skyward.providers.lambdacloud.api import find_key

        try:
            find_key(None)
        except Exception as exc:  # no key: said, not searched
            return Places(unchecked=[f"lambdacloud: not checked: {exc}"])
        inventory = Lambda().inventory()
        return Places([("lambdacloud", inventory)] if inventory is not None else [])

    def advice(self, text: str) -> str:
        return text.replace("pass sky.Lambda(api_key=...)", "put it in LAMBDA_API_KEY")

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        from skyward.providers.lambdacloud import Lambda

        return key.provider == "lambdacloud" and key.endpoint == Lambda().endpoint

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        return any(x.provider == "lambdacloud" and x.pool == key.pool for x in leftovers)


SCOPE = LambdaScope()
