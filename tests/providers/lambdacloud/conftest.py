"""Fixtures of the Lambda provider's own tests: the fake of Lambda's API on loopback (the
stand-in tests and the contract suite use the one on the test bridge, ``lambda_standins`` in
``tests/providers/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.lambdacloud.fake import LambdaFake


@pytest.fixture(scope="session")
def lambda_server() -> Iterator[LambdaFake]:
    with LambdaFake() as fake:
        yield fake


@pytest.fixture
def lam(lambda_server: LambdaFake, monkeypatch: pytest.MonkeyPatch) -> LambdaFake:
    """The fake on loopback, empty; no key in the environment (each test gives its own)."""
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    lambda_server.reset()
    return lambda_server
