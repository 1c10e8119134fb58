"""``Image`` and ``PipIndex``: what a worker needs.

An image is a value; plugins return new images from old ones (``with_pip``, ``with_env``).
Remote providers turn it into a bootstrap script; the local provider runs no script and checks
the image's requirements against the client's interpreter instead (``providers/local.py``).

Requirements are pip's: names with versions, and direct references (``name @ git+https://
...@<rev>``, ``name @ https://.../x.whl``). A wheel file on this machine may be named by its
path; it becomes ``name @ file:///absolute/path.whl`` here, and the bootstrap carries the
file to the hosts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")


# A wheel's file name: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
_WHEEL_FILE = re.compile(r"^([^-]+)-[^-]+(?:-[^-]+)?-[^-]+-[^-]+-[^-]+\.whl$")


def local_wheel(requirement: str) -> Path | None:
    """The wheel file on this machine that ``requirement`` installs (``file://`` URL)."""
    _, at, url = requirement.partition("@")
    url = url.split(";")[0].strip()
    if not at or not url.startswith("file:") or not url.endswith(".whl"):
        return None
    return Path(unquote(urlsplit(url).path))


def _wheel_requirement(requirement: str) -> str:
    """A path to a wheel file (``./dist/x-1.0-py3-none-any.whl``) as ``x @ file:///...``."""
    text = requirement.strip()
    if text.startswith("file:") and "@" not in text:
        text = unquote(urlsplit(text).path)
    if "@" in text or not text.endswith(".whl"):
        return requirement
    path = Path(text).expanduser()
    match = _WHEEL_FILE.match(path.name)
    if not match:
        raise ValueError(f"{requirement!r} is not a wheel file name (name-version-tags.whl)")
    if not path.is_file():
        raise ValueError(f"no wheel file at {path.resolve()}")
    return f"{match.group(1)} @ {path.resolve().as_uri()}"


def _check_direct_reference(requirement: str) -> None:
    """Refuse what pip or uv cannot install, before any host is touched."""
    from packaging.requirements import InvalidRequirement, Requirement

    if "@" not in requirement:
        return
    try:
        url = Requirement(requirement).url
    except InvalidRequirement as exc:
        raise ValueError(f"{requirement!r} is not a pip requirement: {exc}") from exc
    if url is None:
        return
    if url.startswith("git+git://"):
        # uv cannot parse it at all, and then fails with a misleading "setuptools not found".
        raise ValueError(
            f"{requirement!r}: uv, which the bootstrap uses, cannot fetch git:// URLs; "
            f"use git+https://, git+http:// or git+ssh://"
        )
    wheel = local_wheel(requirement)
    if wheel is not None and not wheel.is_file():
        raise ValueError(f"{requirement!r}: no wheel file at {wheel}")


def requirement_name(requirement: str) -> str:
    """The normalized project name of a requirement string (PEP 503)."""
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"{requirement!r} is not a pip requirement")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


class PipIndex(BaseModel):
    """An extra package index used only for the named packages.

    ``url`` is a PEP 503 simple index, or a find-links page when ``find_links=True`` (JAX's
    CUDA release page is one). Scoping keeps an extra index from shadowing other packages.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    url: str = Field(min_length=1)
    packages: tuple[str, ...] = Field(min_length=1)
    find_links: bool = False

    @field_validator("packages")
    @classmethod
    def _names(cls, packages: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(requirement_name(p) for p in packages)


class Image(BaseModel):
    """What a worker needs: Python, packages, system packages, environment, setup commands.

    - ``python``: ``"auto"`` (the client's minor version, required by cloudpickle) or
      ``"3.X"``.
    - ``pip``: requirement strings, direct references included (``name @ git+https://...``);
      a path to a wheel file on this machine becomes ``name @ file:///...`` and is carried
      to the hosts. ``index_url`` replaces the default index (a company mirror);
      ``pip_indexes`` adds indexes scoped to named packages.
    - ``apt``: Debian/Ubuntu packages; ``setup``: shell commands run after installs.
    - ``env``: environment variables every worker process starts with.

    The local provider uses the client's own interpreter: it applies ``env``, checks ``pip``
    against what is installed, and ignores ``python``, ``apt``, ``setup`` and the indexes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    python: str = "auto"
    pip: tuple[str, ...] = ()
    index_url: str | None = None
    pip_indexes: tuple[PipIndex, ...] = ()
    apt: tuple[str, ...] = ()
    env: Mapping[str, str] = Field(default_factory=dict)
    setup: tuple[str, ...] = ()

    @field_validator("python")
    @classmethod
    def _python(cls, python: str) -> str:
        if python != "auto" and not re.fullmatch(r"3\.\d{1,2}", python):
            raise ValueError(f"python must be 'auto' or '3.X', not {python!r}")
        return python

    @field_validator("pip")
    @classmethod
    def _requirements(cls, pip: tuple[str, ...]) -> tuple[str, ...]:
        pip = tuple(_wheel_requirement(r) for r in pip)
        for requirement in pip:
            requirement_name(requirement)
            _check_direct_reference(requirement)
        return pip

    @field_validator("env")
    @classmethod
    def _env(cls, env: Mapping[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if "\x00" in value:  # no process environment can hold it: exec would fail
                raise ValueError(f"the value of {key!r} contains a NUL byte")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return dict(env)

    def with_pip(self, *requirements: str, indexes: Iterable[PipIndex] = ()) -> Image:
        """A new image with these requirements added (requirements already named are kept)."""
        have = {requirement_name(r) for r in self.pip}
        added = tuple(r for r in requirements if requirement_name(r) not in have)
        return self.model_copy(
            update={
                "pip": self.pip + added,
                "pip_indexes": self.pip_indexes + tuple(indexes),
            }
        )

    def with_env(self, env: Mapping[str, str]) -> Image:
        """A new image with ``env`` merged in; its values replace ones already set."""
        return self.model_validate({**self.model_dump(), "env": {**self.env, **env}})
