"""Fixtures of the Vast.ai provider's own tests: its API fake on loopback (``vast``); the one
on the test bridge with stand-in hosts (``vast_standins``) is in ``tests/providers/conftest.py``,
which the contract suite shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.vastai.fake import VastFake


@pytest.fixture(scope="session")
def vast_server() -> Iterator[VastFake]:
    with VastFake() as fake:
        yield fake


@pytest.fixture
def vast(vast_server: VastFake, monkeypatch: pytest.MonkeyPatch) -> VastFake:
    """The fake on loopback, with eight RTX 4090 offers; no key in this process's
    environment (each test gives the provider its key)."""
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    vast_server.reset()
    return vast_server
