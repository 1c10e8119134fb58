"""``skyward catalog``: what each cloud offers, with GPUs, memory and price per hour, read from
the catalog a pool chooses its machines from (``skyward.providers.cloud.catalog``), so what is
listed here is what ``accelerator=`` can get.

::

    skyward catalog                               every machine type of every cloud
    skyward catalog A100 --cloud aws --region us-west-2
    skyward catalog cpu --cloud gcp               machines without an accelerator
    skyward catalog H100 --spot                   with AWS's current spot prices (credentials)
    skyward catalog L4 --json                     the same rows as JSON, for scripts

A rich table on a terminal, aligned plain columns in a pipe, JSON with ``--json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import click

from skyward.cli.columns import aligned
from skyward.providers.cloud.catalog import CLOUDS, CatalogEntry

_HEADER = ("CLOUD", "TYPE", "ACCELERATOR", "GPUS", "GPU MEM", "VCPUS", "MEMORY", "REGION")


@click.command("catalog")
@click.argument("accelerator", required=False)
@click.option("--cloud", type=click.Choice(CLOUDS), default=None, help="Only this cloud.")
@click.option(
    "--region",
    default=None,
    help="Prices in this region (default: each cloud's reference region); names its cloud.",
)
@click.option("--spot", is_flag=True, help="Ask AWS for its current spot prices too.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def catalog(
    accelerator: str | None, cloud: str | None, region: str | None, spot: bool, as_json: bool
) -> None:
    """List machine types: ACCELERATOR (A100, A100-80GB:8, cpu) and price per hour."""
    from skyward._errors import SkywardError
    from skyward.providers.cloud.catalog import catalog as listing

    try:
        entries = listing(accelerator, cloud=cloud, region=region, spot=spot)
    except (ValueError, SkywardError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps([e.as_dict() for e in entries], indent=2))
        return
    if not entries:
        where = f" in {region}" if region else ""
        raise click.ClickException(
            f"no machine type matches {accelerator or 'that'}{where}{_sold_where(accelerator)}"
        )
    if sys.stdout.isatty():
        _rich(entries, spot)
    else:
        _plain(entries, spot)
    from skyward.providers.cloud.catalog import AS_OF, PROVIDERS

    shown = dict.fromkeys(e.cloud for e in entries)  # each cloud listed, in order
    dated = ", ".join(
        f"{PROVIDERS[cloud].removeprefix('sky.')}'s "
        + (f"as of {AS_OF[cloud]}" if cloud in AS_OF else "undated")
        for cloud in shown
    )
    click.echo(
        f"On-demand list prices ({dated}), USD per hour per machine; '-': unknown.",
        err=True,
    )


def _sold_where(accelerator: str | None) -> str:
    """ "; L4 is sold in aws us-east-1, ...": where to look instead, from the price tables."""
    from skyward.providers.cloud.catalog import selling

    if accelerator is None or accelerator.strip().lower() == "cpu":
        return ""
    places = selling(accelerator)
    if not places:
        return ""
    shown = "; ".join(
        f"{cloud} {', '.join(regions)}"
        if len(regions) <= 6
        else f"{cloud} ({len(regions)} regions) {', '.join(regions[:6])}, ..."
        for cloud, regions in places.items()
    )
    return f". {accelerator} is sold in {shown} (give one of these --region)"


def _row(entry: CatalogEntry, spot: bool) -> tuple[str, ...]:
    cells = (
        entry.cloud,
        entry.type,
        entry.accelerator or "-",
        str(entry.accelerators),
        f"{entry.accelerator_memory_gb} GB" if entry.accelerators else "-",
        str(entry.vcpus),
        f"{entry.memory_gb:g} GB" if entry.memory_gb else "-",
        entry.region,
        _price(entry.on_demand),
    )
    return (*cells, _price(entry.spot)) if spot else cells


def _price(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _header(spot: bool) -> tuple[str, ...]:
    return (*_HEADER, "$/H", "SPOT $/H") if spot else (*_HEADER, "$/H")


def _plain(entries: Sequence[CatalogEntry], spot: bool) -> None:
    for line in aligned([_header(spot), *(_row(e, spot) for e in entries)]):
        click.echo(line)


def _rich(entries: Sequence[CatalogEntry], spot: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in _header(spot):
        numeric = name in ("GPUS", "GPU MEM", "VCPUS", "MEMORY", "$/H", "SPOT $/H")
        table.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    for entry in entries:
        style = "green" if entry.accelerator else None
        table.add_row(*_row(entry, spot), style=style)
    Console().print(table)
