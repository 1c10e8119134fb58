"""A pending call used as if it were its value says how to get the value."""

from __future__ import annotations

import pytest

import skyward as sky


@sky.compute
def double(x: int) -> int:
    return 2 * x


@sky.compute
def quadruple(x: int) -> int:
    return double(x) + double(x)  # the mistake: a decorated function called inside another


@pytest.mark.parametrize(
    "misuse",
    [
        lambda: double(1) + 1,
        lambda: 1 + double(1),
        lambda: double(1) * 2,
        lambda: -double(1),
        lambda: double(1) < 3,
        lambda: list(double(1)),
        lambda: double(1)[0],
        lambda: float(double(1)),
        lambda: round(double(1)),
    ],
)
def test_a_pending_call_used_as_a_value_says_to_send_it_or_call_local(misuse: object) -> None:
    with pytest.raises(TypeError) as raised:
        misuse()  # type: ignore[operator]
    message = str(raised.value)
    assert "double(...) is a call waiting to be sent to a pool, not its value" in message
    assert "double(...) >> pool" in message and "double.local(...)" in message


def test_a_decorated_function_called_inside_another_fails_on_the_node_with_the_hint() -> None:
    with sky.ComputePool(nodes=1, console="off") as pool:
        with pytest.raises(TypeError, match=r"call `double\.local\(\.\.\.\)` instead"):
            quadruple(3) >> pool
        assert double(3) >> pool == 6  # the operators that send a call still work
        assert (double(1) & double(2)) >> pool == (2, 4)


def test_messages_give_a_type_its_article() -> None:
    with pytest.raises(TypeError, match=r"got an int$"):
        double(1) >> 3  # type: ignore[operator]
