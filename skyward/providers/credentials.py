"""A provider's line in ``skyward doctor``: where its credentials are, said without using them.

``cli/doctor.py`` names no cloud: for each registry entry with a credentials check it calls
the check (a function of the environment and the home directory) and prints the ``Check``
it returns. A check reads environment variables and files only: no network, no SDK import
(a first look must not cost a slow call or an extra), and it says where credentials were
found, never what they are. A malformed file may raise ``OSError``, ``ValueError`` or
``configparser.Error``: doctor reports it as that provider's line and carries on.
"""

from __future__ import annotations

from collections.abc import Mapping
from configparser import ConfigParser
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

Status = Literal["ok", "missing", "error"]


@dataclass(frozen=True)
class Check:
    """One line of ``skyward doctor``: what was checked, how it stands, and how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@runtime_checkable
class CredentialsCheck(Protocol):
    """``check(env, home)``: where this provider's credentials (and its default place: region,
    project, subscription) are found in ``env`` and the files under ``home``."""

    def __call__(self, env: Mapping[str, str], home: Path, /) -> Check: ...


def read_text(path: Path) -> str:
    """The file's text, or "" when it cannot be read (absent is the common case)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def read_ini(path: Path) -> ConfigParser:
    """The file as an INI file (empty when absent); ``configparser.Error`` when malformed."""
    parser = ConfigParser(interpolation=None)
    parser.read_string(read_text(path), source=str(path))
    return parser
