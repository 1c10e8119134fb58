"""What Lambda Cloud adds to ``skyward ls`` / ``down`` (``providers/scope.py``): the account
the API key opens (``LAMBDA_API_KEY``, ``~/.lambda_cloud/lambda_keys``), through
``--lambda-endpoint`` or ``SKYWARD_LAMBDA_ENDPOINT`` when given (a proxy or a test server).
A key opens one account: there is no region to name. A pool key is in use while its pool
has anything left there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward.providers.scope import Flag, Given, Places, Scope, any_present

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey
    from skyward.providers.lambdacloud import Lambda


class LambdaScope(Scope):
    flags = (
        Flag(
            "--lambda-endpoint",
            "lambda_endpoint",
            "The Lambda Cloud API to ask (default: SKYWARD_LAMBDA_ENDPOINT, else Lambda's).",
            metavar="URL",
        ),
    )
    cloud = True

    def given(self, options: Given) -> bool:
        return options.one("lambda_endpoint") is not None

    def configured(self) -> bool:
        return any_present(
            ("LAMBDA_API_KEY", "SKYWARD_LAMBDA_ENDPOINT"), ("~/.lambda_cloud/lambda_keys",)
        )

    def places(self, options: Given) -> Places:
        from skyward._errors import ProvisionError
        from skyward.providers.lambdacloud.api import find_key

        try:
            find_key(None)
        except ProvisionError as exc:  # no key: said, not searched
            return Places(unchecked=[f"lambdacloud: not checked: {exc}"])
        inventory = _lambda(options).inventory()
        return Places([("lambdacloud", inventory)] if inventory is not None else [])

    def advice(self, text: str) -> str:
        return text.replace("pass sky.Lambda(api_key=...)", "put it in LAMBDA_API_KEY")

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        return key.provider == "lambdacloud" and key.endpoint == _lambda(options).endpoint

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        return any(x.provider == "lambdacloud" and x.pool == key.pool for x in leftovers)


def _lambda(options: Given) -> Lambda:
    from skyward.providers.lambdacloud import Lambda

    return Lambda(endpoint_url=options.one("lambda_endpoint"))


SCOPE = LambdaScope()
