"""``skyward cache ls URL`` and ``skyward cache prune URL --older-than 7d``: the environment
cache's entries (``Image(cache=...)``), listed and removed from this machine.

The same store client the nodes run (``providers/envcache/store.py``), with this machine's
credentials: boto3's chain for S3 (environment, profile, SSO), Application Default
Credentials for GCS, and for Azure ``AZURE_STORAGE_KEY``/``AZURE_STORAGE_SAS_TOKEN`` or
``DefaultAzureCredential``; each SDK only when it is installed and the store asks for it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import click

from skyward._image import cache_location
from skyward.providers.envcache.store import GCS, S3, Azure, Entry, Store, StoreError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def client_store(url: str, endpoint: str | None) -> tuple[Store, str]:
    """The store ``url`` names, with this machine's credentials; and the prefix."""
    try:
        scheme, bucket, container, prefix = cache_location(url)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error
    import os

    if scheme == "s3":
        keys = None
        if not os.environ.get("AWS_ACCESS_KEY_ID"):
            try:
                import boto3

                found = boto3.Session().get_credentials()
                if found is not None:
                    frozen = found.get_frozen_credentials()
                    if frozen.access_key and frozen.secret_key:
                        keys = (frozen.access_key, frozen.secret_key, frozen.token)
            except ImportError:
                pass
        return S3(bucket, endpoint, credentials=keys), prefix
    if scheme == "gs":
        token = os.environ.get("CLOUDSDK_AUTH_ACCESS_TOKEN")
        if token is None and endpoint is None:
            try:
                import google.auth
                import google.auth.transport.requests

                credentials, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/devstorage.read_write"]
                )
                # google-auth's refresh is untyped: named through a typed callable.
                refresh: Callable[[object], None] = credentials.refresh
                refresh(google.auth.transport.requests.Request())
                token = credentials.token
            except ImportError:
                pass
        return GCS(bucket, endpoint, token=token if endpoint is None else token or ""), prefix
    bearer = None
    if not (os.environ.get("AZURE_STORAGE_KEY") or os.environ.get("AZURE_STORAGE_SAS_TOKEN")):
        try:
            from azure.identity import DefaultAzureCredential

            bearer = DefaultAzureCredential().get_token("https://storage.azure.com/.default").token
        except ImportError:
            pass
    return Azure(bucket, container, endpoint, token=bearer), prefix


def parse_age(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"2w"``, ``"90s"`` in seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r}: a number and s, m, h, d or w (7d, 12h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _entries(store: Store, prefix: str) -> list[Entry]:
    try:
        return sorted(store.list(f"{prefix}/" if prefix else ""), key=lambda e: e.modified)
    except StoreError as error:
        raise click.ClickException(str(error)) from error


def _row(entry: Entry, now: float) -> str:
    age = (now - entry.modified) / 86400
    return f"{entry.size / 1e6:10.1f} MB  {age:6.1f} d  {entry.key}"


@click.group("cache")
def cache() -> None:
    """The environment cache (Image(cache=...)): list and prune its entries."""


_endpoint = click.option(
    "--endpoint", default=None, help="The store's address, when not the cloud's own."
)


@cache.command("ls")
@click.argument("url")
@_endpoint
def cache_ls(url: str, endpoint: str | None) -> None:
    """List the entries under URL (s3://, gs:// or az://), oldest first."""
    store, prefix = client_store(url, endpoint)
    entries = _entries(store, prefix)
    now = time.time()
    for entry in entries:
        click.echo(_row(entry, now))
    total = sum(e.size for e in entries) / 1e6
    click.echo(f"{len(entries)} entries, {total:.1f} MB", err=True)


@cache.command("prune")
@click.argument("url")
@click.option("--older-than", "older_than", required=True, help="An age: 7d, 12h, 30m.")
@_endpoint
@click.option("--yes", is_flag=True, help="Do not ask before deleting.")
def cache_prune(url: str, older_than: str, endpoint: str | None, yes: bool) -> None:
    """Delete the entries under URL older than --older-than."""
    store, prefix = client_store(url, endpoint)
    now = time.time()
    stale = [e for e in _entries(store, prefix) if now - e.modified > parse_age(older_than)]
    if not stale:
        click.echo(f"nothing under {url} is older than {older_than}")
        return
    for entry in stale:
        click.echo(_row(entry, now))
    if not yes:
        click.confirm(f"delete these {len(stale)} entries?", abort=True)
    for entry in stale:
        try:
            store.delete(entry.key)
        except StoreError as error:
            raise click.ClickException(str(error)) from error
    click.echo(f"deleted {len(stale)} entries ({sum(e.size for e in stale) / 1e6:.1f} MB)")
