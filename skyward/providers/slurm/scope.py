"""What Slurm adds to ``skyward ls`` / ``down`` (``providers/scope.py``): the clusters named
with ``--slurm LOGIN`` (``local`` for this machine's Slurm commands), reached with
``--ssh-key`` and ``--known-hosts``. Skyward's jobs there are this user's jobs named
``skyward-<pool>``. A cluster is searched only when named: given only ``--slurm``, no cloud
is asked. Its pools leave no pool key on this machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from skyward.providers.scope import Flag, Given, Places, Scope

if TYPE_CHECKING:
    from skyward.providers.base import Inventory


class SlurmScope(Scope):
    flags = (
        Flag(
            "--slurm",
            "slurm_logins",
            "A Slurm cluster to look in: its login host ([user@]host[:port]), or 'local' for "
            "this machine's Slurm commands (repeatable). Given alone, no cloud is asked.",
            multiple=True,
            metavar="LOGIN",
        ),
        Flag("--ssh-key", "ssh_key", "Key for --slurm logins.", path=True),
        Flag(
            "--known-hosts",
            "known_hosts",
            "known_hosts file for --slurm logins (default ~/.ssh/known_hosts).",
            path=True,
        ),
    )
    cloud = False

    def given(self, options: Given) -> bool:
        return bool(options.many("slurm_logins"))

    def places(self, options: Given) -> Places:
        from skyward.providers.slurm import Slurm

        key: Path | None = options.path("ssh_key")
        known_hosts = options.path("known_hosts")
        found: list[tuple[str, Inventory]] = []
        for login in options.many("slurm_logins"):
            where = None if login == "local" else login
            inventory = Slurm(login=where, key=key, known_hosts=known_hosts).inventory()
            if inventory is not None:
                found.append((f"slurm {login}", inventory))
        return Places(found)

    def searched_kept(self, record: Mapping[str, object], options: Given) -> bool:
        # A kept job's record names its cluster as --slurm does (``local`` or the login).
        return record.get("login") in options.many("slurm_logins")


SCOPE = SlurmScope()
