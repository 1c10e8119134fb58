"""What AWS adds to ``skyward ls`` / ``down`` (``providers/scope.py``): ``--region`` (every
region the account has enabled when none is named) and ``--profile``; its pool keys are
judged by their key pairs, in the regions searched, through ``AWS_ENDPOINT_URL``.

Credentials and endpoints come from boto3's usual places (``AWS_PROFILE`` or ``--profile``,
``AWS_ENDPOINT_URL``). The provider's package is imported when a search is made, not when
the commands are built.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyward.providers.scope import Flag, Given, Places, Scope, Searched, any_present

if TYPE_CHECKING:
    from skyward.providers.base import Inventory, Leftover
    from skyward.providers.cloud.keys import LocalKey


class AWSScope(Scope):
    flags = (
        Flag("--region", "regions", "A region to look in (repeatable).", multiple=True),
        Flag("--profile", "profile", "The AWS profile to use."),
    )
    cloud = True

    def given(self, options: Given) -> bool:
        return bool(options.many("regions") or options.one("profile"))

    def configured(self) -> bool:
        # boto3's places for credentials and configuration, all but the instance's own
        # identity (asking for it is a network call: on EC2 with nothing else, name the cloud).
        return any_present(
            (
                "AWS_ACCESS_KEY_ID",
                "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE",
                "AWS_ENDPOINT_URL",
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            ),
            (
                os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
                os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"),
            ),
        )

    def places(self, options: Given) -> Places:
        if importlib.util.find_spec("boto3") is None:
            return Places(
                unchecked=["aws: not checked; install it with: pip install 'skyward[aws]'"]
            )
        from skyward.providers.aws import AWS

        found: list[tuple[str, Inventory]] = []
        asked: list[str | None] = list(options.many("regions")) or [None]  # None: every enabled
        for region in asked:
            inventory = AWS(region=region, profile=options.one("profile")).inventory()
            if inventory is not None:
                found.append((f"aws {region or '(every enabled region)'}", inventory))
        return Places(found)

    def searched(self, where: str, inventory: Inventory) -> Searched:
        from skyward.providers.aws.inventory import AWSInventory

        if not isinstance(inventory, AWSInventory):
            return Searched(where)
        regions = inventory.searched
        if len(regions) > 1:
            names = ", ".join(regions[:3]) + (", ..." if len(regions) > 3 else "")
            checked: str | None = f"aws: {len(regions)} regions ({names})"
        else:
            checked = f"aws: {regions[0]}" if regions else None
        return Searched(checked, inventory.problems)

    def advice(self, text: str) -> str:
        text = re.sub(r"sky\.AWS\(region='([^']*)'\)", r"--region \1", text)
        text = text.replace("sky.AWS(endpoint_url=...) or AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL")
        return re.sub(r"sky\.AWS\(profile=(?:'\.\.\.'|\.\.\.)\)", "--profile NAME", text)

    def judges(self, key: LocalKey, options: Given, searched: Sequence[Inventory]) -> bool:
        # Only keys made through the endpoint searched here (another account's or a test
        # server's keys are not judged by this search), in a region it searched.
        regions = options.many("regions")
        in_region = not regions or key.region in regions
        return in_region and key.endpoint == os.environ.get("AWS_ENDPOINT_URL", "")

    def holds(self, key: LocalKey, leftovers: Sequence[Leftover]) -> bool:
        return any(
            (x.provider, x.region, x.id) == ("aws", key.region, key.key_pair)
            for x in leftovers
            if x.kind == "key pair"
        )


SCOPE = AWSScope()
