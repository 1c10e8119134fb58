"""``skyward ls`` and ``skyward down``: what Skyward made and is still there, found by the tags
every pool puts on its resources, and its removal.

They work without the client that made the pool: a pool whose client was killed (SIGKILL, a
laptop that died) is found by its ``skyward-pool`` tag, whoever made it. No provider is
named here: each registry entry with a scope (``providers/registry.py``,
``providers/scope.py``) adds its flags to both commands and says where to search, from its
flags and the usual places for credentials and endpoints.

Which providers are asked: the clouds named with ``--cloud``; else the clouds whose flags are
given; else, unless a cluster's flags alone are given, every cloud. A cluster (a scope that
is not a cloud) is searched for what its flags name. A place asked about that cannot be
searched (its extra is not installed, no credentials, no subscription or project, a region
that did not answer) is named with what to install or set, and the command fails after
saying what it did search: an empty list from a cloud nobody looked at is not an all-clear.
Advice coming from a provider names this command's flags, not the Python options.

A killed client also leaves its pool's private key in ``/tmp/skyward-key-*``: ``ls`` lists
those whose key pair is gone from the cloud (stale), ``down`` removes them once it has
removed, or found gone, the pool's key pair. ``ls`` also lists the newest pools that ran on
this machine (``skyward.console.logs``): their state and their log directory.

Machines a pool kept warm (``keep_warm``) carry its tags like any other, so ``ls`` lists
them and ``down`` ends them; ``ls`` also lists this machine's records of them
(``providers/cloud/warm.py``) with the time they have left and what they cost meanwhile,
and ``down`` forgets the records of the pools it removed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path

import click

from skyward._errors import SkywardError
from skyward.cli.columns import aligned
from skyward.client.phases import Choice
from skyward.providers.base import Inventory, Leftover
from skyward.providers.cloud.keys import LocalKey, local_keys, remove_local_key
from skyward.providers.registry import PROVIDERS
from skyward.providers.scope import Given, Places, Scope


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


@functools.cache
def _scopes() -> tuple[tuple[str, Scope], ...]:
    """Each provider's scope by its type, in the registry's order (loaded on first use)."""
    return tuple((e.type, scope) for e in PROVIDERS if (scope := e.scope()) is not None)


_LONGEST = 400  # characters of one "not checked" line


@dataclass
class _Search:
    """What one ``ls`` / ``down`` looked through: the places asked, what each holds, and the
    places that could not be looked at, each with what to install or set."""

    places: list[tuple[Scope, str, Inventory]] = field(default_factory=list)
    collected: list[tuple[Inventory, list[Leftover]]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # "<type>: what it searched"
    unchecked: list[str] = field(default_factory=list)  # "<type>: not checked: why; do this"

    def not_checked(self, line: str) -> None:
        # One line each, whatever a cloud's error carried (an endpoint's HTML page, an SDK's
        # multi-line dump): its whitespace folded, cut at _LONGEST characters.
        text = " ".join(_for_the_command_line(line).split())
        self.unchecked.append(text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…")

    def add(self, scope: Scope, places: Places) -> None:
        self.places += [(scope, where, inventory) for where, inventory in places.found]
        for line in places.unchecked:
            self.not_checked(line)

    @property
    def answered(self) -> list[Inventory]:
        """The inventories that listed their leftovers."""
        return [inventory for inventory, _ in self.collected]


def _clouds_to_ask(clouds: Sequence[str], options: Given) -> tuple[list[tuple[str, Scope]], str]:
    """``--cloud`` when given; else the clouds whose flags were given; else, unless only a
    cluster's were, every cloud configured on this machine. Each one asked is either
    searched or named as not checked; the line says which clouds were left out, and why."""
    every = [(kind, scope) for kind, scope in _scopes() if scope.cloud]
    if clouds:
        return [(kind, scope) for kind, scope in every if kind in clouds], ""
    named = [(kind, scope) for kind, scope in every if scope.given(options)]
    clusters = any(scope.given(options) for _, scope in _scopes() if not scope.cloud)
    if named or clusters:
        return named, ""
    configured = [(kind, scope) for kind, scope in every if scope.configured()]
    left_out = [kind for kind, scope in every if (kind, scope) not in configured]
    if not left_out:
        return configured, ""
    if not configured:
        return [], (
            "No cloud is configured here (no credentials or configuration for "
            f"{', '.join(left_out)} in their usual places), so there is nothing to check: "
            "local pools leave nothing behind. On a cloud machine that has only its own "
            "identity, name the cloud: --cloud NAME."
        )
    return configured, (
        f"Not configured here, so not checked: {', '.join(left_out)} (no credentials or "
        "configuration in their usual places; --cloud NAME checks one anyway)."
    )


def _collect(asked: Sequence[tuple[str, Scope]], options: Given, pool: str | None) -> _Search:
    """Every place to ask about, searched; a place that cannot be asked is named, with why.
    The clusters named on the command line first, then the clouds asked."""
    search = _Search()
    for _, scope in _scopes():
        if not scope.cloud:
            search.add(scope, scope.places(options))
    for _, scope in asked:
        search.add(scope, scope.places(options))
    for scope, where, inventory in search.places:
        try:
            leftovers = inventory.leftovers(pool=pool)
        except SkywardError as exc:
            search.not_checked(f"{where}: not checked: {exc}")
            continue
        searched = scope.searched(where, inventory)
        for problem in searched.problems:
            search.not_checked(f"{where}: not searched: {problem}")
        if searched.checked:
            search.checked.append(searched.checked)
        search.collected.append((inventory, leftovers))
    return search


def _for_the_command_line(text: str) -> str:
    """A provider's advice as this command takes it: its Python options become the flags."""
    for _, scope in _scopes():
        text = scope.advice(text)
    return text


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
    pool: str | None,
    asked: Sequence[tuple[str, Scope]],
    options: Given,
    answered: Sequence[Inventory],
) -> list[LocalKey]:
    """Pool keys on this machine whose pool the search did not find: gone, or going. Each
    is judged by its provider's scope, if that provider was asked, and never one whose
    client still runs."""
    scopes = dict(asked)
    return [
        key
        for key in local_keys()
        if (pool is None or key.pool == pool)
        and (scope := scopes.get(key.provider)) is not None
        and scope.judges(key, options, answered)
        and not key.client_alive
        and not scope.holds(key, leftovers)
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
        for x in sorted(leftovers, key=attrgetter("region", "pool", "kind", "id"))
    ]
    for line in aligned([header, *rows]):
        click.echo(line)
    known = [x.hourly_cost for x in leftovers if x.hourly_cost]
    if known:
        prices = "list prices; spot at its current price"
        click.echo(f"about ${sum(known):.2f}/h while these run ({prices})")


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
    for line in aligned(rows, indent="  "):
        click.echo(line)
    if len(pools) > _RECENT:
        click.echo(f"  ... and {len(pools) - _RECENT} more: skyward logs --list")


def _started(meta: dict[str, object]) -> datetime | None:
    started = meta.get("started")
    if not isinstance(started, int | float):
        return None
    return datetime.fromtimestamp(float(started), UTC)


def _warm(pool: str | None) -> None:
    """This machine's records of machines kept warm: each set's pool, size, time left and
    price per hour while it waits."""
    from skyward.providers.cloud import warm

    sets = [w for w in warm.kept() if pool is None or w.pool == pool]
    if not sets:
        return
    click.echo(
        f"\nWarm machines, kept for the next pool like theirs (records under {warm.warm_dir()}):"
    )
    rows = []
    for kept in sets:
        left = kept.left()
        price = "" if kept.hourly_cost is None else f"${kept.hourly_cost:.2f}/h"
        rows.append(
            (
                kept.cloud,
                kept.pool,
                kept.describe or f"{kept.nodes} machine(s)",
                f"{left / 60:.1f} min left" if left > 0 else "time up: ending",
                price,
                ", ".join(m.id for m in kept.machines),
            )
        )
    widths = [max(len(c) for c in column) for column in zip(*rows, strict=True)]
    for row in rows:
        click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    downs = sorted({kept.down or f"skyward down --pool {kept.pool}" for kept in sets})
    click.echo(f"  they bill until then; {', '.join(f'`{d}`' for d in downs)} ends them now")


def _forget_warm(pools: set[str] | None, clouds: set[str], options: Given) -> None:
    """Forget the records of kept sets ``down`` ended (of ``pools``; ``None``: every pool),
    in the places it searched, and their login keys."""
    from skyward.providers.cloud import warm

    scopes = dict(_scopes())
    for kept in warm.kept():
        if kept.cloud not in clouds or (pools is not None and kept.pool not in pools):
            continue
        if kept.cloud in scopes and not scopes[kept.cloud].searched_kept(kept.record, options):
            continue
        warm.forget(kept.id)
        if kept.key_dir:  # a set whose machines a pool key opens
            remove_local_key(LocalKey(Path(kept.key_dir), kept.cloud, "", kept.pool, ""))
        click.echo(f"Forgot the warm machines of pool {kept.pool} ({kept.describe})")


class _ProviderCommand(click.Command):
    """A command with the providers' options after its own: ``--cloud`` and each scope's
    flags. They are read from the registry when the command first parses or shows its help,
    not when ``skyward`` starts: that loads every provider's package (about a second)."""

    _with_providers = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._with_providers:
            self._with_providers = True
            self.params += _provider_options()
        return super().get_params(ctx)


def _provider_options() -> list[click.Parameter]:
    clouds = [(kind, scope) for kind, scope in _scopes() if scope.cloud]
    selectors = ", ".join(f"{s.flags[0].option}: {kind}" for kind, s in clouds if s.flags)
    options: list[click.Parameter] = [
        click.Option(
            ["--cloud", "clouds"],
            multiple=True,
            type=click.Choice([kind for kind, _ in clouds]),
            help=f"A cloud to check (repeatable). Default: the clouds whose options are given "
            f"({selectors}), else every cloud; one that cannot be checked makes the command fail.",
        )
    ]
    for _, scope in _scopes():
        for flag in scope.flags:
            path = click.Path(dir_okay=False, path_type=Path) if flag.path else None
            options.append(
                click.Option(
                    [flag.option, flag.dest],
                    multiple=flag.multiple,
                    metavar=flag.metavar,
                    type=path,
                    help=flag.help,
                )
            )
    return options


@click.command("ls", cls=_ProviderCommand)
@click.option("--pool", default=None, help="Only this pool's resources.")
def ls(pool: str | None, clouds: tuple[str, ...], **flags: object) -> None:
    """List what Skyward created and is still there (instances, groups, keys, jobs), where
    the options below say (by default every cloud, in every enabled region), pool keys left
    on this machine, and the pools that ran here recently. Fails when a cloud asked about
    could not be checked."""
    options = Given(flags)
    asked, left_out = _clouds_to_ask(clouds, options)
    search = _collect(asked, options, pool)
    if left_out:
        click.echo(left_out, err=True)
    everything = [x for _, found in search.collected for x in found]
    if asked:
        everything += _key_rows(_stale_keys(everything, pool, asked, options, search.answered))
    if everything:
        _table(everything)
    _warm(pool)
    _recent_pools(pool)
    nothing = "" if everything else _nothing(pool, search)
    _finish(search, nothing=nothing)


def _nothing(pool: str | None, search: _Search) -> str:
    of = f" for pool {pool}" if pool else ""
    if search.unchecked:
        # Said only when something was looked through: a search where every place failed
        # found nothing because it saw nothing.
        return f"Nothing found{of} in what was checked." if search.checked else ""
    if not search.places:
        return ""  # nothing was asked: the line that says why has been printed
    return f"Nothing left by Skyward{of}."


@click.command("down", cls=_ProviderCommand)
@click.option("--pool", default=None, help="Remove this pool's resources.")
@click.option("--all", "everything", is_flag=True, help="Remove every pool's resources.")
@click.option("--yes", is_flag=True, help="Do not ask first.")
def down(
    pool: str | None, everything: bool, yes: bool, clouds: tuple[str, ...], **flags: object
) -> None:
    """Remove what Skyward created: one pool's resources, or every pool's, wherever `ls`
    looks with the same options; then the pool keys on this machine whose key pair is gone.
    Fails when a cloud asked about could not be checked (after removing what the others
    hold)."""
    if (pool is None) == (not everything):
        raise click.UsageError("give --pool NAME or --all (one of them)")
    options = Given(flags)
    asked, left_out = _clouds_to_ask(clouds, options)
    search = _collect(asked, options, pool)
    if left_out:
        click.echo(left_out, err=True)
    collected, answered = search.collected, search.answered
    total = [x for _, found in collected for x in found]
    searched = {kind for kind, _ in asked}
    searched |= {kind for kind, scope in _scopes() if not scope.cloud and scope.given(options)}
    if not total:
        stale = _stale_keys(total, pool, asked, options, answered) if asked else []
        for key in stale:
            remove_local_key(key)
            click.echo(f"Removed the stale pool key {key.directory}")
        if not search.unchecked:  # nothing of theirs is left where it was looked for
            _forget_warm(None if pool is None else {pool}, searched, options)
        _finish(search, nothing=_nothing(pool, search))
        return
    stale = _stale_keys(total, pool, asked, options, answered) if asked else []
    _table(total + _key_rows(stale))
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
    for key in _stale_keys(remaining, pool, asked, options, answered) if asked else []:
        remove_local_key(key)
        click.echo(f"Removed the pool key {key.directory}")
    if not failed and not search.unchecked:
        _forget_warm(None if pool is None else {pool}, searched, options)
    if failed:
        raise click.ClickException("; ".join(failed))
    click.echo(f"Deleted {len(total)} resource(s).")
    _finish(search, nothing="")
