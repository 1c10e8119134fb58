"""``skyward ls`` and ``skyward down``: what Skyward made and is still there, found by the tags
every pool puts on its resources, and its removal.

They work without the client that made the pool: a pool whose client was killed (SIGKILL, a
laptop that died) is found by its ``skyward-pool`` tag, whoever made it. Each provider that
creates things offers an inventory (``Provider.inventory()``): AWS, in the regions named with
``--region`` (default: the one boto3 would use), with credentials and the endpoint from the
usual places (``AWS_PROFILE`` or ``--profile``, ``AWS_ENDPOINT_URL``); and the Slurm clusters
named with ``--slurm LOGIN`` (``local`` for this machine's Slurm commands), where Skyward's
jobs are this user's jobs named ``skyward-<pool>``. Given only ``--slurm``, AWS is not asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click

from skyward._errors import SkywardError
from skyward.providers.base import Inventory, Leftover


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


def _inventories(
    regions: Sequence[str], profile: str | None, slurm: _SlurmLogins
) -> list[tuple[str, Inventory]]:
    """(where, inventory) for every place asked about; an SDK that is not installed is said."""
    import importlib.util

    found: list[tuple[str, Inventory]] = []
    for login in slurm.logins:
        from skyward.providers.slurm import Slurm

        where = None if login == "local" else login
        inventory = Slurm(login=where, key=slurm.key, known_hosts=slurm.known_hosts).inventory()
        if inventory is not None:
            found.append((f"slurm {login}", inventory))
    if slurm.logins and not regions:
        return found  # only the clusters were asked about
    if importlib.util.find_spec("boto3") is None:
        click.echo("aws: not checked; install it with: pip install 'skyward[aws]'", err=True)
        return found
    from skyward.providers.aws import AWS

    asked: list[str | None] = list(regions) or [None]
    for region in asked:
        inventory = AWS(region=region, profile=profile).inventory()
        if inventory is not None:
            found.append((f"aws {region or 'default region'}", inventory))
    return found


def _collect(
    regions: Sequence[str], profile: str | None, pool: str | None, slurm: _SlurmLogins
) -> list[tuple[Inventory, list[Leftover]]]:
    collected = []
    for where, inventory in _inventories(regions, profile, slurm):
        try:
            leftovers = inventory.leftovers(pool=pool)
        except SkywardError as exc:
            raise click.ClickException(f"{where}: {exc}") from exc
        collected.append((inventory, leftovers))
    return collected


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
        click.echo(f"about ${sum(known):.2f}/h while these run (list prices; spot not counted)")


_regions = click.option(
    "--region", "regions", multiple=True, help="A region to look in (repeatable)."
)
_profile = click.option("--profile", default=None, help="The AWS profile to use.")
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


@click.command("ls")
@click.option("--pool", default=None, help="Only this pool's resources.")
@_regions
@_profile
@_slurm
@_ssh_key
@_known_hosts
def ls(
    pool: str | None,
    regions: tuple[str, ...],
    profile: str | None,
    slurm_logins: tuple[str, ...],
    ssh_key: Path | None,
    known_hosts: Path | None,
) -> None:
    """List what Skyward created and is still there (instances, groups, keys, Slurm jobs)."""
    slurm = _SlurmLogins(slurm_logins, ssh_key, known_hosts)
    everything = [x for _, found in _collect(regions, profile, pool, slurm) for x in found]
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
@_slurm
@_ssh_key
@_known_hosts
def down(
    pool: str | None,
    everything: bool,
    yes: bool,
    regions: tuple[str, ...],
    profile: str | None,
    slurm_logins: tuple[str, ...],
    ssh_key: Path | None,
    known_hosts: Path | None,
) -> None:
    """Remove what Skyward created: one pool's resources, or every pool's."""
    if (pool is None) == (not everything):
        raise click.UsageError("give --pool NAME or --all (one of them)")
    slurm = _SlurmLogins(slurm_logins, ssh_key, known_hosts)
    collected = _collect(regions, profile, pool, slurm)
    total = [x for _, found in collected for x in found]
    if not total:
        click.echo("Nothing left by Skyward" + (f" for pool {pool}." if pool else "."))
        return
    _table(total)
    if not yes:
        click.confirm(f"Delete these {len(total)} resource(s)?", abort=True)
    failed = []
    for inventory, found in collected:
        if not found:
            continue
        try:
            inventory.delete(found, _Echo())
        except SkywardError as exc:
            failed.append(str(exc))
    if failed:
        raise click.ClickException("; ".join(failed))
    click.echo(f"Deleted {len(total)} resource(s).")
