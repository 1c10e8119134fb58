"""Errors that say what happened, output that shows up, and configuration refused with the
field named, whatever is thrown at the public constructors (issue 14, 11-16)."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, get_type_hints

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import skyward as sky
from skyward.plugins._jax import JaxOptions


def _flood_then_die() -> None:
    sys.stderr.write("x" * (20 << 20))  # 20 MB, no newline: a stuck progress bar
    sys.stderr.write("\nFATAL: the real reason\n")
    sys.stderr.flush()
    os._exit(1)


@pytest.mark.timeout(120)
def test_worker_lost_keeps_a_bounded_tail_that_ends_with_the_fatal_line() -> None:
    with sky.ComputePool(output="none", quiet=True) as pool:
        with pytest.raises(sky.WorkerLost) as lost:
            pool.run(_flood_then_die)
    tail = lost.value.stderr_tail
    assert tail.splitlines()[-1] == "FATAL: the real reason"
    assert len(tail) < 10_000
    assert len(str(lost.value)) < 10_000


def _progress() -> str:
    print("  0%", end="\r", flush=True)
    print(" 50%", end="\r", flush=True)
    print("100%", end="", flush=True)  # no newline: the bar's final state
    return "done"


def test_a_partial_line_shows_up_when_its_call_returns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(quiet=True) as pool:
        assert pool.run(_progress) == "done"
        shown = capsys.readouterr().out  # right after the result, before the pool closes
    assert "[node 0] 100%" in shown


def _slow_bar() -> None:
    for step in range(6):
        print(f"step {step}", end="\r", flush=True)
        time.sleep(0.3)
    print()


@pytest.mark.timeout(60)
def test_a_carriage_return_progress_bar_is_shown_while_its_call_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(quiet=True) as pool:
        future = pool.submit(_slow_bar)
        seen = ""
        deadline = time.monotonic() + 20
        while "[node 0] step" not in seen and time.monotonic() < deadline:
            seen += capsys.readouterr().out
            time.sleep(0.05)
        assert not future.done(), "an update arrived while the call still ran"
        future.result()
    assert "[node 0] step" in seen


# ── configuration, fuzzed ────────────────────────────────────────────────────────────────

_ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.text(max_size=6), max_size=3),
    st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2),
)

_POOL_OPTIONS = [
    "nodes",
    "accelerator",
    "image",
    "plugins",
    "concurrency",
    "name",
    "provision_timeout",
    "start_timeout",
    "shutdown_timeout",
    "console",
    "output",
    "quiet",
]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(option=st.sampled_from(_POOL_OPTIONS), value=_ANYTHING)
def test_pool_options_are_validated_with_the_field_named(option: str, value: Any) -> None:
    try:
        sky.ComputePool(**{option: value}, provider=sky.SSH(hosts=["h1", "h2"]))
    except pydantic.ValidationError as error:
        assert option in str(error)
    except ValueError as error:  # a provider's own limit (SSH: more nodes than hosts)
        assert "nodes" in str(error)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    option=st.sampled_from(["python", "pip", "index_url", "pip_indexes", "apt", "env", "setup"]),
    value=_ANYTHING,
)
def test_image_options_are_validated_with_the_field_named(option: str, value: Any) -> None:
    try:
        sky.Image(**{option: value})
    except pydantic.ValidationError as error:
        assert option in str(error)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    option=st.sampled_from(
        [
            "hosts",
            "key",
            "known_hosts",
            "accept_new_hosts",
            "python",
            "workdir",
            "peer_addresses",
            "connect_timeout",
            "keepalive",
            "link_timeout",
        ]
    ),
    value=_ANYTHING,
)
def test_ssh_options_are_validated_with_the_field_named(option: str, value: Any) -> None:
    options = {"hosts": ["h1"], option: value}
    try:
        sky.SSH(**options)
    except pydantic.ValidationError as error:
        assert option in str(error)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_ANYTHING)
def test_compute_timeout_is_validated_with_the_field_named(value: Any) -> None:
    try:
        timeout = sky.compute(timeout=value)(print).timeout
    except pydantic.ValidationError as error:
        assert "timeout" in str(error)
    else:
        assert timeout is None or (0 < timeout <= 7 * 24 * 3600 and math.isfinite(timeout))


def test_plugins_none_is_a_validation_error_naming_plugins() -> None:
    with pytest.raises(pydantic.ValidationError, match="plugins"):
        sky.ComputePool(plugins=None)  # type: ignore[arg-type]


def test_an_env_value_with_a_nul_byte_is_refused_at_construction() -> None:
    with pytest.raises(pydantic.ValidationError, match="env"):
        sky.Image(env={"A": "b\x00c"})


@settings(deadline=None)
@given(option=st.sampled_from(list(get_type_hints(JaxOptions))), value=_ANYTHING)
def test_jax_plugin_options_are_validated_with_the_option_named(option: str, value: Any) -> None:
    try:
        sky.plugins.jax(**{option: value})
    except pydantic.ValidationError as error:
        assert option in str(error)
    except sky.PluginError as error:  # a CUDA version jax has no wheels for
        assert option in str(error)


def test_a_key_path_under_an_unknown_users_home_is_a_validation_error() -> None:
    # Found by the fuzz test above: Path("~0").expanduser() raises RuntimeError.
    with pytest.raises(pydantic.ValidationError, match="key"):
        sky.SSH(hosts=["h1"], key="~0")  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="known_hosts"):
        sky.SSH(hosts=["h1"], known_hosts="~nobody-here/known_hosts")  # type: ignore[arg-type]
