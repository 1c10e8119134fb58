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

Which clouds are asked: those named with ``--cloud``; else those whose options are given
(``--region``/``--profile``: AWS, ``--project``: GCP, ``--subscription``/``--azure-base-url``:
Azure); else, unless only ``--slurm`` is, every cloud. A cloud asked about that cannot be
searched (its extra is not installed, no credentials, no subscription or project, a region
that did not answer) is named with what to install or set, and the command fails after
saying what it did search: an empty list from a cloud nobody looked at is not an all-clear.
Advice coming from a provider names this command's flags, not the Python options.

A killed client also leaves its pool's private key in ``/tmp/skyward-key-*``: ``ls`` lists
those whose key pair is gone from the cloud (stale), ``down`` removes them once it has
removed, or found gone, the pool's key pair. ``ls`` also lists the newest pools that ran on
this machine (``skyward.console.logs``): their state and their log directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import click

from skyward._errors import SkywardError
from skyward.client.phases import Choice
from skyward.providers.base import Inventory, Leftover
from skyward.providers.cloud.keys import LocalKey, local_keys, remove_local_key


@dataclass(frozen=True)
class _SlurmLogins:
    """The clusters ``--slurm`` names, and how to reach their login hosts."""

    logins: tuple[str, ...] = ()
    key: Path | None = None
    known_hosts: Path | None = None


class _Echo:
    """A ``Reporter`` that prints what ``delete`` is doing."""

    def phase(self, node: int, phase: str, detail: str = "") -> None:
        pass

    def log(self, node: int, line: str) -> None:
        pass

    def status(self, line: str) -> None:
        click.echo(line)

    def chosen(self, choice: Choice) -> None:
        pass


CLOUDS = ("aws", "gcp", "azure")


@dataclass
class _Search:
    """What one ``ls`` / ``down`` looked through: the places asked, what each holds, and the
    places that could not be looked at, each with what to install or set."""

    places: list[tuple[str, Inventory]] = field(default_factory=list)
    collected: list[tuple[Inventory, list[Leftover]]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # "aws: 17 regions (us-east-1, ...)"
    unchecked: list[str] = field(default_factory=list)  # "gcp: not checked: ...; do this"

    def not_checked(self, line: str) -> None:
        self.unchecked.append(_for_the_command_line(line))


def _clouds_to_ask(
    clouds: Sequence[str],
    slurm: _SlurmLogins,
    regions: Sequence[str],
    profile: str | None,
    subscriptions: Sequence[str],
    azure_base_url: str | None,
    projects: Sequence[str],
) -> list[str]:
    """``--cloud`` when given; else the clouds whose options were given (``--region`` is
    AWS's, ``--subscription`` Azure's, ``--project`` GCP's); else, unless only ``--slurm``
    was, every cloud. Each one asked is either searched or named as not checked."""
    if clouds:
        return list(dict.fromkeys(clouds))
    named = [
        cloud
        for cloud, given in (
            ("aws", bool(regions or profile)),
            ("gcp", bool(projects)),
            ("azure", bool(subscriptions or azure_base_url)),
        )
        if given
    ]
    if named or slurm.logins:
        return named
    return list(CLOUDS)


def _inventories(
    clouds: Sequence[str],
    regions: Sequence[str],
    profile: str | None,
    subscriptions: Sequence[str] = (),
    azure_base_url: str | None = None,
    slurm: _SlurmLogins = _SlurmLogins(),
    projects: Sequence[str] = (),
) -> _Search:
    """Every place to ask about; a cloud that cannot be asked is named, with why."""
    from skyward.providers.azure.inventory import inventories as azure

    search = _Search(places=_slurm_inventories(slurm))
    if "aws" in clouds:
        _aws_inventories(search, regions, profile)
    if "gcp" in clouds:
        _gcp_inventories(search, projects)
    if "azure" in clouds:
        on_azure, note = azure(subscriptions, azure_base_url)
        if note:
            search.not_checked(note)
        search.places += on_azure
    return search


def _slurm_inventories(slurm: _SlurmLogins) -> list[tuple[str, Inventory]]:
    from skyward.providers.slurm import Slurm

    found: list[tuple[str, Inventory]] = []
    for login in slurm.logins:
        where = None if login == "local" else login
        inventory = Slurm(login=where, key=slurm.key, known_hosts=slurm.known_hosts).inventory()
        if inventory is not None:
            found.append((f"slurm {login}", inventory))
    return found


def _aws_inventories(search: _Search, regions: Sequence[str], profile: str | None) -> None:
    import importlib.util

    if importlib.util.find_spec("boto3") is None:
        search.not_checked("aws: not checked; install it with: pip install 'skyward[aws]'")
        return
    from skyward.providers.aws import AWS

    asked: list[str | None] = list(regions) or [None]  # None: every enabled region
    for region in asked:
        inventory = AWS(region=region, profile=profile).inventory()
        if inventory is not None:
            search.places.append((f"aws {region or '(every enabled region)'}", inventory))


def _gcp_inventories(search: _Search, projects: Sequence[str]) -> None:
    """Each GCP project asked about, by default the credentials'
    (``SKYWARD_GCP_ENDPOINT``: where the Compute calls go, a proxy or a test server)."""
    import importlib.util
    import os

    if importlib.util.find_spec("google.cloud.compute_v1") is None:
        search.not_checked("gcp: not checked; install it with: pip install 'skyward[gcp]'")
        return
    from skyward.providers.gcp import GCP
    from skyward.providers.gcp.api import credentials_and_project

    endpoint = os.environ.get("SKYWARD_GCP_ENDPOINT") or None
    asked_for: list[str | None] = list(projects) or [None]
    for asked in asked_for:
        try:
            credentials, project = credentials_and_project(asked, None)
        except SkywardError as exc:
            search.not_checked(f"gcp: not checked: {exc}")
            continue
        config = GCP(project=project, credentials=credentials, endpoint=endpoint)
        inventory = config.inventory()
        if inventory is not None:
            search.places.append((f"gcp {project}", inventory))


def _collect(
    clouds: Sequence[str],
    regions: Sequence[str],
    profile: str | None,
    pool: str | None,
    subscriptions: Sequence[str] = (),
    azure_base_url: str | None = None,
    slurm: _SlurmLogins = _SlurmLogins(),
    projects: Sequence[str] = (),
) -> _Search:
    search = _inventories(clouds, regions, profile, subscriptions, azure_base_url, slurm, projects)
    for where, inventory in search.places:
        try:
            leftovers = inventory.leftovers(pool=pool)
        except SkywardError as exc:
            search.not_checked(f"{where}: not checked: {exc}")
            continue
        for problem in getattr(inventory, "problems", []):
            search.not_checked(f"{where}: not searched: {problem}")
        for note in getattr(inventory, "notes", []):
            click.echo(f"{where}: {note}", err=True)
        searched = getattr(inventory, "searched", None)
        if searched is not None and len(searched) > 1:
            names = ", ".join(searched[:3]) + (", ..." if len(searched) > 3 else "")
            search.checked.append(f"aws: {len(searched)} regions ({names})")
        elif searched:
            search.checked.append(f"aws: {searched[0]}")
        elif searched is None:
            search.checked.append(where)
        search.collected.append((inventory, leftovers))
    return search


def _for_the_command_line(text: str) -> str:
    """A provider's advice as this command takes it: its Python options become the flags
    (``sky.AWS(region='us-east-1')`` -> ``--region us-east-1``)."""
    import re

    text = re.sub(r"sky\.AWS\(region='([^']*)'\)", r"--region \1", text)
    text = re.sub(r"sky\.AWS\(profile=(?:'\.\.\.'|\.\.\.)\)", "--profile NAME", text)
    text = re.sub(r"sky\.GCP\(project='([^']*)'\)", r"--project \1", text)
    return text.replace("sky.GCP(credentials=...)", "GOOGLE_APPLICATION_CREDENTIALS")


def _finish(search: _Search, *, nothing: str) -> None:
    """Say what was checked; with something not checked, exit non-zero naming it, however
    empty the rest was: an unchecked cloud is not an all-clear."""
    if search.checked:
        click.echo(f"Checked: {'; '.join(search.checked)}.", err=True)
    if nothing:
        click.echo(nothing)
    if not search.unchecked:
        return
    for line in search.unchecked:
        click.echo(line, err=True)
    narrow = " (or name the clouds to check with --cloud)" if len(search.checked) else ""
    raise click.ClickException(
        f"{len(search.unchecked)} place(s) were not checked, so this is not an all-clear: "
        f"install or set what the lines above name{narrow}"
    )


def _stale_keys(
    leftovers: Sequence[Leftover],
    regions: Sequence[str],
    pool: str | None,
    azure_endpoint: str | None = None,
    clouds: Sequence[str] = CLOUDS,
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
        if key.provider not in clouds:
            return False
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


_clouds = click.option(
    "--cloud",
    "clouds",
    multiple=True,
    type=click.Choice(CLOUDS),
    help="A cloud to check (repeatable). Default: the clouds whose options are given "
    "(--region: aws, --project: gcp, --subscription: azure), else every cloud; one that "
    "cannot be checked makes the command fail.",
)
_RECENT = 5  # pools shown under `skyward ls`; `skyward logs --list` shows them all


def _recent_pools(pool: str | None) -> None:
    """The newest pools that kept logs on this machine: their state and where the logs are."""
    from skyward.console.logs import logs_root, recent_pools

    pools = [m for m in recent_pools() if pool is None or m.get("name") == pool]
    if not pools:
        return
    click.echo(f"\nRecent pools on this machine (logs under {logs_root()}):")
    rows = [
        (
            str(meta.get("name", "?")),
            str(meta.get("state", "?")),
            str(meta.get("provider", "?")),
            f"{meta.get('nodes', '?')} node(s)",
            _age(_started(meta)) + " ago",
            str(meta["directory"]),
        )
        for meta in pools[:_RECENT]
    ]
    widths = [max(len(c) for c in column) for column in zip(*rows, strict=True)]
    for row in rows:
        click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if len(pools) > _RECENT:
        click.echo(f"  ... and {len(pools) - _RECENT} more: skyward logs --list")


def _started(meta: dict[str, object]) -> datetime | None:
    started = meta.get("started")
    if not isinstance(started, int | float):
        return None
    return datetime.fromtimestamp(float(started), UTC)


@click.command("ls")
@click.option("--pool", default=None, help="Only this pool's resources.")
@_clouds
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
    clouds: tuple[str, ...],
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
    every enabled region unless --region is given, pool keys left on this machine, and the
    pools that ran here recently. Fails when a cloud asked about could not be checked."""
    slurm = _SlurmLogins(slurm_logins, ssh_key, known_hosts)
    asked = _clouds_to_ask(clouds, slurm, regions, profile, subscriptions, azure_base_url, projects)
    search = _collect(asked, regions, profile, pool, subscriptions, azure_base_url, slurm, projects)
    everything = [x for _, found in search.collected for x in found]
    azure = _azure_searched(search.collected, azure_base_url)
    if asked:
        everything += _key_rows(_stale_keys(everything, regions, pool, azure, asked))
    if everything:
        _table(everything)
    _recent_pools(pool)
    nothing = "" if everything else _nothing(pool, search)
    _finish(search, nothing=nothing)


def _nothing(pool: str | None, search: _Search) -> str:
    of = f" for pool {pool}" if pool else ""
    if search.unchecked:
        return f"Nothing found{of} in what was checked."
    return f"Nothing left by Skyward{of}."


@click.command("down")
@click.option("--pool", default=None, help="Remove this pool's resources.")
@click.option("--all", "everything", is_flag=True, help="Remove every pool's resources.")
@click.option("--yes", is_flag=True, help="Do not ask first.")
@_clouds
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
    clouds: tuple[str, ...],
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
    machine whose key pair is gone. Fails when a cloud asked about could not be checked
    (after removing what the others hold)."""
    if (pool is None) == (not everything):
        raise click.UsageError("give --pool NAME or --all (one of them)")
    slurm = _SlurmLogins(slurm_logins, ssh_key, known_hosts)
    asked = _clouds_to_ask(clouds, slurm, regions, profile, subscriptions, azure_base_url, projects)
    search = _collect(asked, regions, profile, pool, subscriptions, azure_base_url, slurm, projects)
    collected = search.collected
    total = [x for _, found in collected for x in found]
    azure = _azure_searched(collected, azure_base_url)
    if not total:
        stale = _stale_keys(total, regions, pool, azure, asked) if asked else []
        for key in stale:
            remove_local_key(key)
            click.echo(f"Removed the stale pool key {key.directory}")
        _finish(search, nothing=_nothing(pool, search))
        return
    _table(total + (_key_rows(_stale_keys(total, regions, pool, azure, asked)) if asked else []))
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
    for key in _stale_keys(remaining, regions, pool, azure, asked) if asked else []:
        remove_local_key(key)
        click.echo(f"Removed the pool key {key.directory}")
    if failed:
        raise click.ClickException("; ".join(failed))
    click.echo(f"Deleted {len(total)} resource(s).")
    _finish(search, nothing="")
