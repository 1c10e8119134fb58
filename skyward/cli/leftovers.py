"""``skyward ls`` and ``skyward down``: what Skyward made and is still there, found by the tags
every pool puts on its resources, and its removal.

They work without the client that made the pool: a pool whose client was killed (SIGKILL, a
laptop that died) is found by its ``skyward-pool`` tag, whoever made it. Each provider that
creates things offers an inventory (``Provider.inventory()``): AWS, in every region the
account has enabled or in those named with ``--region``, and Azure, in the subscriptions named
with ``--subscription`` (default: ``AZURE_SUBSCRIPTION_ID``). Credentials and endpoints come
from the usual places (``AWS_PROFILE`` or ``--profile``, ``AWS_ENDPOINT_URL``; Azure's
``DefaultAzureCredential``: the environment, a managed identity, ``az login``); GCP, in the
projects named with ``--project`` (default: the application-default credentials'; the
Compute calls go to ``SKYWARD_GCP_ENDPOINT`` when it is set); and the
Slurm clusters named with ``--slurm LOGIN`` (``local`` for this machine's Slurm commands),
where Skyward's jobs are this user's jobs named ``skyward-<pool>``. Given only ``--slurm``,
AWS is not asked.

A killed client also leaves its pool's private key in ``/tmp/skyward-key-*``: ``ls`` lists
those whose key pair is gone from the cloud (stale), ``down`` removes them once it has
removed, or found gone, the pool's key pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click

from skyward._errors import SkywardError
from skyward.providers.base import Inventory, Leftover
from skyward.providers.cloud.keys import LocalKey, local_keys, remove_local_key


@dataclass(frozen=True)
class _SlurmLogins:
    """The clusters ``--slurm`` names, and how to reach their login hosts."""

    logins: tuple[str, ...] = ()
    key: Path | None = None
    known_hosts: Path | None = None


def _clouds_asked(
    slurm: _SlurmLogins,
    regions: Sequence[str],
    subscriptions: Sequence[str],
    projects: Sequence[str] = (),
) -> bool:
    """Whether the clouds were searched (not only --slurm clusters): local pool keys are
    judged stale only against a search of the clouds that made them."""
    return not (slurm.logins and not regions and not subscriptions and not projects)


class _Echo:
    """A ``Reporter`` that prints what ``delete`` is doing."""

    def phase(self, node: int, phase: str, detail: str = "") -> None:
        pass

    def log(self, node: int, line: str) -> None:
        pass

    def status(self, line: str) -> None:
        click.echo(line)


def _inventories(
    regions: Sequence[str],
    profile: str | None,
    subscriptions: Sequence[str] = (),
    azure_base_url: str | None = None,
    slurm: _SlurmLogins = _SlurmLogins(),
    projects: Sequence[str] = (),
) -> list[tuple[str, Inventory]]:
    """(where, inventory) for every place asked about; an SDK that is not installed is said."""
    from skyward.providers.azure.inventory import inventories as azure

    found = _slurm_inventories(slurm)
    if not _clouds_asked(slurm, regions, subscriptions, projects):
        return found  # only the clusters were asked about
    found += _aws_inventories(regions, profile)
    on_azure, note = azure(subscriptions, azure_base_url)
    if note:
        click.echo(note, err=True)
    return found + list(on_azure) + _gcp_inventories(projects)


def _slurm_inventories(slurm: _SlurmLogins) -> list[tuple[str, Inventory]]:
    from skyward.providers.slurm import Slurm

    found: list[tuple[str, Inventory]] = []
    for login in slurm.logins:
        where = None if login == "local" else login
        inventory = Slurm(login=where, key=slurm.key, known_hosts=slurm.known_hosts).inventory()
        if inventory is not None:
            found.append((f"slurm {login}", inventory))
    return found


def _aws_inventories(regions: Sequence[str], profile: str | None) -> list[tuple[str, Inventory]]:
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


def _gcp_inventories(projects: Sequence[str]) -> list[tuple[str, Inventory]]:
    """(where, inventory) for each GCP project asked about, by default the credentials'
    (``SKYWARD_GCP_ENDPOINT``: where the Compute calls go, a proxy or a test server)."""
    import importlib.util
    import os

    if importlib.util.find_spec("google.cloud.compute_v1") is None:
        if projects:
            click.echo("gcp: not checked; install it with: pip install 'skyward[gcp]'", err=True)
        return []
    from skyward.providers.gcp import GCP
    from skyward.providers.gcp.api import credentials_and_project

    endpoint = os.environ.get("SKYWARD_GCP_ENDPOINT") or None
    found: list[tuple[str, Inventory]] = []
    asked_for: list[str | None] = list(projects) or [None]
    for asked in asked_for:
        try:
            credentials, project = credentials_and_project(asked, None)
        except SkywardError as exc:
            if projects:
                raise click.ClickException(f"gcp: {exc}") from exc
            click.echo("gcp: not checked (no credentials or project; see skyward doctor)", err=True)
            continue
        config = GCP(project=project, credentials=credentials, endpoint=endpoint)
        inventory = config.inventory()
        if inventory is not None:
            found.append((f"gcp {project}", inventory))
    return found


def _collect(
    regions: Sequence[str],
    profile: str | None,
    pool: str | None,
    subscriptions: Sequence[str] = (),
    azure_base_url: str | None = None,
    slurm: _SlurmLogins = _SlurmLogins(),
    projects: Sequence[str] = (),
) -> list[tuple[Inventory, list[Leftover]]]:
    collected = []
    asked = _inventories(regions, profile, subscriptions, azure_base_url, slurm, projects)
    for where, inventory in asked:
        try:
            leftovers = inventory.leftovers(pool=pool)
        except SkywardError as exc:
            raise click.ClickException(f"{where}: {exc}") from exc
        for problem in getattr(inventory, "problems", []):
            click.echo(f"{where}: not searched: {problem}", err=True)
        collected.append((inventory, leftovers))
    return collected


def _stale_keys(
    leftovers: Sequence[Leftover],
    regions: Sequence[str],
    pool: str | None,
    azure_endpoint: str | None = None,
) -> list[LocalKey]:
    """Pool keys on this machine whose key pair the search did not find (in a region it
    searched): their pool is gone, or going. On Azure the pool's resource group plays the
    key pair's part; ``azure_endpoint`` is the endpoint searched (None: Azure was not)."""
    import os

    kinds = ("key pair", "resource group")
    pairs = {(x.provider, x.region, x.id) for x in leftovers if x.kind in kinds}
    # Only keys made through the endpoint searched here (another account's or a test
    # server's keys are not judged by this search), and never one whose client still runs.
    endpoints = {
        "aws": os.environ.get("AWS_ENDPOINT_URL", ""),
        "gcp": os.environ.get("SKYWARD_GCP_ENDPOINT", ""),
    }
    # A GCP pool has no key pair: its key is in use while resources named after it remain.
    gcp = [x.id for x in leftovers if x.provider == "gcp"]

    def searched(key: LocalKey) -> bool:
        if key.provider == "azure":
            return azure_endpoint is not None and key.endpoint == azure_endpoint
        if key.provider == "gcp":
            return key.endpoint == endpoints["gcp"]
        return (not regions or key.region in regions) and key.endpoint == endpoints["aws"]

    return [
        key
        for key in local_keys()
        if (pool is None or key.pool == pool)
        and searched(key)
        and not key.client_alive
        and (key.provider, key.region, key.key_pair) not in pairs
        and not (key.provider == "gcp" and any(i.startswith(key.key_pair) for i in gcp))
    ]


def _azure_searched(
    collected: Sequence[tuple[Inventory, list[Leftover]]], base_url: str | None
) -> str | None:
    """The Azure endpoint this search looked through, or None if it looked at no Azure."""
    from skyward.providers.azure.inventory import AzureInventory

    searched = any(isinstance(inventory, AzureInventory) for inventory, _ in collected)
    return (base_url or "") if searched else None


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
_subscriptions = click.option(
    "--subscription",
    "subscriptions",
    multiple=True,
    help="An Azure subscription to look in (repeatable; default: AZURE_SUBSCRIPTION_ID).",
)
_projects = click.option(
    "--project", "projects", multiple=True, help="A GCP project to look in (repeatable)."
)
_slurm = click.option(
    "--slurm",
    "slurm_logins",
    multiple=True,
    metavar="LOGIN",
    help="A Slurm cluster to look in: its login host ([user@]host[:port]), or 'local' for "
    "this machine's Slurm commands (repeatable). Alone, AWS is not asked.",
)
_ssh_key = click.option(
    "--ssh-key", type=click.Path(dir_okay=False, path_type=Path), help="Key for --slurm logins."
)
_known_hosts = click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    help="known_hosts file for --slurm logins (default ~/.ssh/known_hosts).",
)
_azure_base_url = click.option(
    "--azure-base-url",
    default=None,
    help="The Azure Resource Manager endpoint, for a sovereign cloud (default: public Azure).",
)


@click.command("ls")
@click.option("--pool", default=None, help="Only this pool's resources.")
@_regions
@_profile
@_subscriptions
@_azure_base_url
@_projects
@_slurm
@_ssh_key
@_known_hosts
def ls(
    pool: str | None,
    regions: tuple[str, ...],
    profile: str | None,
    subscriptions: tuple[str, ...],
    azure_base_url: str | None,
    projects: tuple[str, ...],
    slurm_logins: tuple[str, ...],
    ssh_key: Path | None,
    known_hosts: Path | None,
) -> None:
    """List what Skyward created and is still there (instances, groups, keys, Slurm jobs), in
    every enabled region unless --region is given, and pool keys left on this machine."""
    slurm = _SlurmLogins(slurm_logins, ssh_key, known_hosts)
    collected = _collect(regions, profile, pool, subscriptions, azure_base_url, slurm, projects)
    everything = [x for _, found in collected for x in found]
    azure = _azure_searched(collected, azure_base_url)
    if _clouds_asked(slurm, regions, subscriptions, projects):
        everything += _key_rows(_stale_keys(everything, regions, pool, azure))
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
@_subscriptions
@_azure_base_url
@_projects
@_slurm
@_ssh_key
@_known_hosts
def down(
    pool: str | None,
    everything: bool,
    yes: bool,
    regions: tuple[str, ...],
    profile: str | None,
    subscriptions: tuple[str, ...],
    azure_base_url: str | None,
    projects: tuple[str, ...],
    slurm_logins: tuple[str, ...],
    ssh_key: Path | None,
    known_hosts: Path | None,
) -> None:
    """Remove what Skyward created: one pool's resources, or every pool's, in every enabled
    region unless --region is given (and Slurm jobs with --slurm); then the pool keys on this
    machine whose key pair is gone."""
    if (pool is None) == (not everything):
        raise click.UsageError("give --pool NAME or --all (one of them)")
    slurm = _SlurmLogins(slurm_logins, ssh_key, known_hosts)
    collected = _collect(regions, profile, pool, subscriptions, azure_base_url, slurm, projects)
    total = [x for _, found in collected for x in found]
    azure = _azure_searched(collected, azure_base_url)
    clouds = _clouds_asked(slurm, regions, subscriptions, projects)
    if not total:
        stale = _stale_keys(total, regions, pool, azure) if clouds else []
        for key in stale:
            remove_local_key(key)
            click.echo(f"Removed the stale pool key {key.directory}")
        click.echo("Nothing left by Skyward" + (f" for pool {pool}." if pool else "."))
        return
    _table(total + (_key_rows(_stale_keys(total, regions, pool, azure)) if clouds else []))
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
    for key in _stale_keys(remaining, regions, pool, azure) if clouds else []:
        remove_local_key(key)
        click.echo(f"Removed the pool key {key.directory}")
    if failed:
        raise click.ClickException("; ".join(failed))
    click.echo(f"Deleted {len(total)} resource(s).")
