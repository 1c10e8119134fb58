"""What every cloud's SDK boundary does alike: one call translated, waits bounded by our own
``Deadline``, and the words of a refusal.

::

    Boundary.call(op, doing)      the base of each cloud's ``Api``: an SDK error becomes the
                                  cloud's ``translate(exc, doing, request)``
    poll(probe, doing, deadline)  probe() until it answers: GCP's operations, Azure's
                                  long-running operations, EC2's and every instance's
                                  "running yet?"; a closing pool or the deadline ends it
    cause(exc, read)              a fact of an error or of one it was made from (a status)
    Refusals                      one cloud's table: its codes for no room (which the
                                  failover moves on from: ``Refusal``, for
                                  ``capacity.failover``), its name, its ways to renew
                                  credentials and grant a permission; the errors that say
                                  what to do are worded here, once for every cloud

Each cloud's ``api.py`` keeps its SDK: clients, which of its codes mean what, the patterns of
its messages (a quota's name, a refused action), and the refusals only it has (an AMI, an
image family, a subscription not registered).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline

T = TypeVar("T")
# Why a place could not take the pool: no capacity now, the type not offered there, or
# spot refused (no spot capacity, the spot price above the cap, the spot quota). Another
# place may take it: ``capacity.failover`` makes the refusal a ``CapacityError``.
Refusal = Literal["capacity", "unsupported", "spot"]


class Boundary:
    """The base of a cloud's ``Api``: ``call`` runs one SDK call, and what the SDK raises
    leaves as the cloud's ``translate``: a ``ProvisionError`` saying what to do."""

    def call(self, operation: Callable[..., Any], doing: str, /, *args: Any, **kwargs: Any) -> Any:
        """``operation(*args, **kwargs)``; an SDK error becomes a ``ProvisionError`` about
        ``doing`` (``"creating instance skyward-x-n0"``)."""
        try:
            return operation(*args, **kwargs)
        except Exception as exc:
            if not self.raised_by_sdk(exc):
                raise
            raise self.translate(exc, doing, kwargs) from exc

    def raised_by_sdk(self, exc: BaseException) -> bool:
        return True

    def translate(
        self, exc: BaseException, doing: str, request: Mapping[str, Any]
    ) -> ProvisionError:
        raise NotImplementedError


def poll(
    probe: Callable[[], T | None],
    doing: str,
    deadline: Deadline,
    *,
    pause: float = 0.1,
    most: float = 2.0,
) -> T:
    """``probe()`` until it returns something other than ``None``: at once, then between
    ``deadline.sleep``s growing from ``pause`` to ``most`` seconds. Never the SDKs' own waits,
    whose sleeps a closing pool could not cut short: ``ProvisionCancelled`` when the pool
    closes, ``TimeoutError`` past the deadline (both naming ``doing``)."""
    while True:
        found = probe()
        if found is not None:
            return found
        deadline.check(doing)
        deadline.sleep(pause)
        pause = min(pause * 1.5, most)


def cause(exc: BaseException | None, read: Callable[[BaseException], T | None]) -> T | None:
    """The first fact ``read`` finds (not ``None``) in ``exc`` or the errors it was made
    from (``__cause__``): a translated error still answers for its SDK error."""
    while exc is not None:
        found = read(exc)
        if found is not None:
            return found
        exc = exc.__cause__
    return None


@dataclass(frozen=True)
class Refusals:
    """One cloud's refusals: its codes, and its words for what to do.

    ``capacity``: no room there now (spot or on-demand alike); ``unsupported``: the type not
    offered there; ``spot``: codes that refuse spot only (the spot quota, the cap below the
    price), after which on-demand may still work. Any other refusal (a quota, a permission)
    stops the failover: no other place changes it.
    """

    cloud: str  # who refused: "AWS", "Azure", "Compute Engine"
    renew: str  # how to renew refused credentials
    grant: str  # how to grant a missing permission, with {action}
    roles: str  # where the minimal roles or policy are written down
    identity: str = ""  # whose identity lacks a permission, when not the cloud's: "Google"
    capacity: frozenset[str] = frozenset()
    unsupported: frozenset[str] = frozenset()
    spot: frozenset[str] = frozenset()

    def refusal(self, code: str, *, spot: bool) -> Refusal | None:
        """How a refused create counts for the failover (``capacity.CapacityError``), or
        ``None`` when another place would not change it."""
        if code in self.capacity:
            return "spot" if spot else "capacity"
        if code in self.unsupported:
            return "unsupported"
        if spot and code in self.spot:
            return "spot"
        return None

    # ── the words: one refusal, said alike by every cloud ──────────────────────────────

    def credentials_refused(self, doing: str, detail: str) -> ProvisionError:
        return ProvisionError(
            f"{doing}: {self.cloud} refused the credentials ({detail}). They may have "
            f"expired: {self.renew}"
        )

    def denied(self, doing: str, action: str, where: str, code: str = "") -> ProvisionError:
        """``action`` (``ec2:RunInstances``) is not allowed ``where`` (``in us-east-1``)."""
        said, who = f" ({code})" if code else "", self.identity or self.cloud
        return ProvisionError(
            f"{doing}: your {who} identity lacks the permission {action} {where}{said}. "
            f"{self.grant.format(action=action)}; {self.roles}"
        )

    def quota(
        self,
        doing: str,
        quota: str,
        where: str,
        *,
        detail: str,
        ask: str,
        limit: str = "too small",
        more: str = "",
    ) -> ProvisionError:
        """``quota`` (named as the cloud's console names it) ``where`` is ``limit``."""
        return ProvisionError(
            f"{doing}: your {quota} in {where} is {limit} ({detail}). Ask for more ({ask}), "
            f"or ask for fewer or smaller nodes{more}"
        )

    def unreachable(
        self, doing: str, detail: str, *, what: str = "", check: str = "the network"
    ) -> ProvisionError:
        what = what or f"cannot reach {self.cloud}"
        return ProvisionError(f"{doing}: {what} ({detail}); check {check}")

    def said(self, doing: str, code: str, message: str) -> ProvisionError:
        """A refusal without a remedy of its own: the cloud's code and message, as said."""
        return ProvisionError(f"{doing}: {self.cloud} said {code}: {message}")
