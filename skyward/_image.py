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

import dataclasses
import fnmatch
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward.metrics import Metric, default_metrics
from skyward.metrics import check as check_metrics

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


# An object store's bucket (S3, GCS) or account and container (Azure): the names each
# store accepts, so a typo is refused here rather than by the nodes after they booted.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]$")
_AZURE_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_AZURE_CONTAINER = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")
CACHE_SCHEMES = ("s3", "gs", "az")


def cache_location(url: str) -> tuple[str, str, str, str]:
    """``Image.cache`` as (scheme, bucket or account, container (Azure) or "", prefix);
    ``ValueError`` saying what is wrong with it."""
    usage = (
        "an environment cache is 's3://bucket/prefix', 'gs://bucket/prefix' or "
        "'az://account/container/prefix'"
    )
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in CACHE_SCHEMES:
        raise ValueError(f"cache={url!r}: {usage}")
    parts = [part for part in rest.strip("/").split("/") if part]
    if any(part in (".", "..") for part in parts) or re.search(r"\s", rest):
        raise ValueError(f"cache={url!r}: the prefix has '.', '..' or spaces in it")
    if scheme == "az":
        if len(parts) < 2:
            raise ValueError(f"cache={url!r}: {usage} (the account and the container)")
        account, container, prefix = parts[0], parts[1], "/".join(parts[2:])
        if not _AZURE_ACCOUNT.match(account):
            raise ValueError(f"cache={url!r}: {account!r} is not a storage account name")
        if not _AZURE_CONTAINER.match(container):
            raise ValueError(f"cache={url!r}: {container!r} is not a container name")
        return scheme, account, container, prefix
    if not parts:
        raise ValueError(f"cache={url!r}: {usage} (no bucket)")
    if not _BUCKET.match(parts[0]):
        raise ValueError(f"cache={url!r}: {parts[0]!r} is not a bucket name")
    return scheme, parts[0], "", "/".join(parts[1:])


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
      to the hosts. ``index_url`` replaces the default index (a company mirror), uv's own
      download included; ``pip_indexes`` adds indexes scoped to named packages.
    - ``python_mirror``: where a remote host that lacks the client's Python version
      downloads a uv-managed CPython of that version: a mirror of python-build-standalone's
      releases (uv's ``python-install-mirror``), by default its GitHub releases.
      ``python_downloads_json_url``: the list of builds uv may install (uv's
      ``python-downloads-json-url``), needed only when the mirror serves builds other than
      the official ones.
    - ``apt``: Debian/Ubuntu packages; ``setup``: shell commands run after installs.
    - ``env``: environment variables every worker process starts with.
    - ``includes``: local directories or ``.py`` files (relative to the current directory,
      made absolute here) that workers can import: ``includes=["lib"]`` makes ``import lib``
      work on every worker. Remote nodes get a copy, without what ``excludes`` (glob
      patterns on names, such as ``"__pycache__"`` or ``"*.pyc"``) matches.
    - ``skyward_source``: where a worker's skyward comes from. Only ``"auto"`` and
      ``"local"``, which mean the same: the client's own package, uploaded to remote nodes,
      so both ends run the same code.
    - ``bootstrap_timeout``: seconds the image's bootstrap script may run on a remote node
      (``None``: bounded only by the pool's ``provision_timeout``).
    - ``cache``: where remote nodes keep the environment this image builds, so that later
      bootstraps download it instead of installing: ``"s3://bucket/prefix"``,
      ``"gs://bucket/prefix"`` or ``"az://account/container/prefix"``. The nodes reach it
      with their own identity (instance profile, service account, managed identity), or
      with the store's usual variables in their own environment; never with a key the
      client sends (``docs/images.md``). ``cache_endpoint``: the store's address when it is
      not the cloud's own (an S3-compatible server, an emulator).
    - ``metrics``: what each node samples about itself while the pool runs
      (``sky.metrics``: ``[CPU(interval=0.5), GPU(), Memory()]``), sent to the client
      (``pool.metrics()``); ``None``: nothing. By default ``sky.metrics.Default()``.

    The local provider uses the client's own interpreter: it applies ``env``, checks ``pip``
    against what is installed, puts ``includes`` on the workers' path, and ignores
    ``python``, ``apt``, ``setup``, the indexes, the Python mirror, ``bootstrap_timeout`` and
    the cache.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    python: str = "auto"
    pip: tuple[str, ...] = ()
    index_url: str | None = None
    pip_indexes: tuple[PipIndex, ...] = ()
    python_mirror: str | None = None
    python_downloads_json_url: str | None = None
    apt: tuple[str, ...] = ()
    env: Mapping[str, str] = Field(default_factory=dict)
    setup: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    skyward_source: Literal["auto", "local"] = "auto"
    bootstrap_timeout: float | None = Field(default=None, gt=0)
    cache: str | None = None
    cache_endpoint: str | None = None

    @field_validator("cache")
    @classmethod
    def _cache(cls, url: str | None) -> str | None:
        if url is not None:
            cache_location(url)
        return None if url is None else url.rstrip("/")

    @field_validator("cache_endpoint")
    @classmethod
    def _cache_endpoint(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"https?://[^\s/]+/?$", url):
            raise ValueError(f"cache_endpoint {url!r} is not an http:// or https:// host[:port]")
        return None if url is None else url.rstrip("/")

    metrics: tuple[Metric, ...] | None = Field(default_factory=default_metrics)

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, metrics: tuple[Metric, ...] | None) -> tuple[Metric, ...] | None:
        return None if metrics is None else check_metrics(metrics)

    @field_validator("skyward_source", mode="before")
    @classmethod
    def _source(cls, source: object) -> object:
        if source in ("pypi", "github"):
            raise ValueError(
                f"skyward_source={source!r} is not offered: workers always run the client's "
                f"own skyward, uploaded to remote nodes, so both ends run the same code (the "
                f"'skyward' on PyPI is another project). Use 'auto' (the default) or 'local'"
            )
        return source

    @field_validator("includes")
    @classmethod
    def _includes(cls, includes: tuple[str, ...]) -> tuple[str, ...]:
        found = []
        for path in includes:
            absolute = os.path.abspath(os.path.expanduser(path))
            if not os.path.exists(absolute):
                raise ValueError(f"includes: {path!r} does not exist (looked at {absolute})")
            if os.path.isfile(absolute) and not absolute.endswith(".py"):
                raise ValueError(f"includes: {path!r} is a file but not a .py module")
            found.append(absolute)
        return tuple(found)

    def include_roots(self) -> list[str]:
        """The directories that hold ``includes``, for ``sys.path`` on the client's machine."""
        return sorted({os.path.dirname(path) for path in self.includes})

    def included_files(self) -> Iterator[tuple[str, str]]:
        """Every file ``includes`` ships, as (local path, path under the include root),
        without what ``excludes`` matches, in a stable order."""
        for path in sorted(self.includes):
            root = os.path.dirname(path)
            if os.path.isfile(path):
                yield path, os.path.relpath(path, root)
                continue
            for directory, folders, files in os.walk(path):
                folders[:] = sorted(f for f in folders if not self._excluded(f))
                for name in sorted(files):
                    if not self._excluded(name):
                        full = os.path.join(directory, name)
                        yield full, os.path.relpath(full, root)

    def _excluded(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in self.excludes)

    @field_validator("python")
    @classmethod
    def _python(cls, python: str) -> str:
        if python != "auto" and not re.fullmatch(r"3\.\d{1,2}", python):
            raise ValueError(f"python must be 'auto' or '3.X', not {python!r}")
        return python

    @field_validator("python_mirror", "python_downloads_json_url")
    @classmethod
    def _download_url(cls, url: str | None) -> str | None:
        # uv takes these as URLs (file:// for a directory on the host); a bare path or a
        # typo would fail only on the host, after the machines were made.
        if url is not None and not re.match(r"(https?|file)://[^\s]+$", url):
            raise ValueError(f"{url!r} is not an http://, https:// or file:// URL")
        return None if url is None else url.rstrip("/")

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


def _replaceable(model: type[BaseModel]) -> None:
    """Let ``dataclasses.replace(image, pip=...)`` make a new image, validated like any.

    skyward 0.5's ``Image`` was a dataclass, and its plugin docs write transforms that way.
    ``replace`` needs only each field's name; marked as ordinary fields (dataclasses' own
    marker, stable since 3.7), ``fields()`` and ``asdict()`` work too.
    """
    fields = {}
    for name in model.model_fields:
        field = dataclasses.field()
        field.name = name
        field._field_type = getattr(dataclasses, "_FIELD", None)
        fields[name] = field
    model.__dataclass_fields__ = fields


_replaceable(Image)


DEFAULT_IMAGE = Image()
"""The image a pool gets when it names none: ``sky.Image()`` (skyward 0.5's name)."""
