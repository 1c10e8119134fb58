"""``skyward ls`` and ``skyward down``: what Skyward made and is still there, found by the tags
every pool puts on its resources, and its removal.

They work without the client that made the pool: a pool whose client was killed (SIGKILL, a
laptop that died) is found by its ``skyward-pool`` tag, whoever made it. Each provider that
creates things offers an inventory (``Provider.inventory()``); today that is AWS, in every
region the account has enabled, or in those named with ``--region``. Credentials and the
endpoint come from the usual places (``AWS_PROFILE`` or ``--profile``, ``AWS_ENDPOINT_URL``).

A killed client also leaves its pool's private key in ``/tmp/skyward-key-*``: ``ls`` lists
those whose key pair is gone from the cloud (stale), ``down`` removes them once it has
removed, or found gone, the pool's key pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import click

from skyward._errors import SkywardError
from skyward.providers.base import Inventory, Leftover
from skyward.providers.cloud import LocalKey, local_keys, remove_local_key


class _Echo:
    """A ``Reporter`` that prints what ``delete`` is doing."""

    def phase(self, node: int, phase: str, detail: str = "") -> None:
        pass

    def log(self, node: int, line: str) -> None:
        pass

    def status(self, line: str) -> None:
        click.echo(line)


def _inventories(regions: Sequence[str], profile: str | None) -> list[tuple[str, Inventory]]:
    """(where, inventory) for every place asked about; an SDK that is not installed is said."""
    import importlib.util

    if importlib.util.find_spec("boto3") is None:
        click.echo("aws: not checked; install it with: pip install 'skyward[aws]'", err=True)
        return []
    from skyward.providers.aws import AWS

    found: list[tuple[str, Inventory]] = []
    asked: list[str | None] = list(regions) or [None]  # None: every enabled region
    for region in asked:
        inventory = AWS(region=region, profile=profile).inventory()
        if inventory is not None:
            found.append((f"aws {region or '(every enabled region)'}", inventory))
    return found


def _collect(
    regions: Sequence[str], profile: str | None, pool: str | None
) -> list[tuple[Inventory, list[Leftover]]]:
    collected = []
    for where, inventory in _inventories(regions, profile):
        try:
            leftovers = inventory.leftovers(pool=pool)
        except SkywardError as exc:
            raise click.ClickException(f"{where}: {exc}") from exc
        for problem in getattr(inventory, "problems", []):
            click.echo(f"{where}: not searched: {problem}", err=True)
        collected.append((inventory, leftovers))
    return collected


def _stale_keys(
    leftovers: Sequence[Leftover], regions: Sequence[str], pool: str | None
) -> list[LocalKey]:
    """Pool keys on this machine whose key pair the search did not find (in a region it
    searched): their pool is gone, or going."""
    import os

    pairs = {(x.provider, x.region, x.id) for x in leftovers if x.kind == "key pair"}
    # Only keys made through the endpoint searched here (another account's or a test
    # server's keys are not judged by this search), and never one whose client still runs.
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    return [
        key
        for key in local_keys()
        if (pool is None or key.pool == pool)
        and (not regions or key.region in regions)
        and key.endpoint == endpoint
        and not key.client_alive
        and (key.provider, key.region, key.key_pair) not in pairs
    ]


def _key_rows(keys: Sequence[LocalKey]) -> list[Leftover]:
    return [
        Leftover(
            provider="local",
            kind="key file",
            id=str(key.directory),
            pool=key.pool,
            owner="",
            created=None,
            state=f"stale: {key.provider} key pair gone",
            region=key.region,
        )
        for key in keys
    ]


def _age(created: datetime | None) -> str:
    if created is None:
        return "?"
    seconds = max(0, int((datetime.now(UTC) - created).total_seconds()))
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def _table(leftovers: Sequence[Leftover]) -> None:
    header = ("PROVIDER", "REGION", "POOL", "KIND", "ID", "STATE", "AGE", "OWNER", "$/H")
    rows = [
        (
            x.provider,
            x.region,
            x.pool,
            x.kind,
            x.id,
            x.state,
            _age(x.created),
            x.owner,
            "" if x.hourly_cost is None else f"{x.hourly_cost:.2f}",
        )
        for x in sorted(leftovers, key=lambda x: (x.region, x.pool, x.kind, x.id))
    ]
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    known = [x.hourly_cost for x in leftovers if x.hourly_cost]
    if known:
        prices = "list prices; spot at its current price"
        click.echo(f"about ${sum(known):.2f}/h while these run ({prices})")


_regions = click.option(
    "--region", "regions", multiple=True, help="A region to look in (repeatable)."
)
_profile = click.option("--profile", default=None, help="The AWS profile to use.")


@click.command("ls")
@click.option("--pool", default=None, help="Only this pool's resources.")
@_regions
@_profile
def ls(pool: str | None, regions: tuple[str, ...], profile: str | None) -> None:
    """List what Skyward created and is still there (instances, groups, keys), in every
    enabled region unless --region is given, and pool keys left on this machine."""
    everything = [x for _, found in _collect(regions, profile, pool) for x in found]
    everything += _key_rows(_stale_keys(everything, regions, pool))
    if not everything:
        click.echo("Nothing left by Skyward" + (f" for pool {pool}." if pool else "."))
        return
    _table(everything)


@click.command("down")
@click.option("--pool", default=None, help="Remove this pool's resources.")
@click.option("--all", "everything", is_flag=True, help="Remove every pool's resources.")
@click.option("--yes", is_flag=True, help="Do not ask first.")
@_regions
@_profile
def down(
    pool: str | None,
    everything: bool,
    yes: bool,
    regions: tuple[str, ...],
    profile: str | None,
) -> None:
    """Remove what Skyward created: one pool's resources, or every pool's, in every enabled
    region unless --region is given; then the pool keys on this machine whose key pair is
    gone."""
    if (pool is None) == (not everything):
        raise click.UsageError("give --pool NAME or --all (one of them)")
    collected = _collect(regions, profile, pool)
    total = [x for _, found in collected for x in found]
    if not total:
        stale = _stale_keys(total, regions, pool)
        for key in stale:
            remove_local_key(key)
            click.echo(f"Removed the stale pool key {key.directory}")
        click.echo("Nothing left by Skyward" + (f" for pool {pool}." if pool else "."))
        return
    _table(total + _key_rows(_stale_keys(total, regions, pool)))
    if not yes:
        click.confirm(f"Delete these {len(total)} resource(s)?", abort=True)
    failed = []
    deleted: list[Leftover] = []
    for inventory, found in collected:
        if not found:
            continue
        try:
            inventory.delete(found, _Echo())
            deleted += found
        except SkywardError as exc:
            failed.append(str(exc))
    # The keys of pools whose key pair is now gone (deleted here, or gone before).
    remaining = [x for x in total if x not in deleted]
    for key in _stale_keys(remaining, regions, pool):
        remove_local_key(key)
        click.echo(f"Removed the pool key {key.directory}")
    if failed:
        raise click.ClickException("; ".join(failed))
    click.echo(f"Deleted {len(total)} resource(s).")
