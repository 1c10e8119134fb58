"""The ``skyward`` command.

::

    skyward --version
    skyward doctor            what this machine has for Skyward, and how to fix what it lacks
    skyward catalog [ACCEL]   machine types per cloud: GPUs, memory, price per hour
    skyward ls                what Skyward created and is still there, by its tags
    skyward down --pool NAME  remove it (or --all; --yes to skip the question)
    skyward logs [POOL]       a pool's events and its nodes' output, kept after it ends
    skyward cache ls URL      the environment cache's entries (Image(cache=URL))
    skyward cache prune URL --older-than 7d

Each command lives in a module of this package and is added to ``main`` below, so the cloud
providers' commands (``skyward ls``, ``skyward down``: find and remove what a crashed pool
left behind, by its tags) joined the same way: a module with a ``click.Command``, one
``main.add_command`` line. Commands import providers and SDKs inside their bodies, so
``skyward --help`` stays fast and works with no extra installed.
"""

from __future__ import annotations

import click

import skyward
from skyward.cli.cache import cache
from skyward.cli.catalog import catalog
from skyward.cli.doctor import doctor
from skyward.cli.leftovers import down, ls
from skyward.cli.logs import logs


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(skyward.__version__, "-V", "--version", prog_name="skyward")
def main() -> None:
    """Skyward: run ordinary Python functions on a pool of machines."""


main.add_command(doctor)
main.add_command(catalog)
main.add_command(ls)
main.add_command(down)
main.add_command(logs)
main.add_command(cache)
