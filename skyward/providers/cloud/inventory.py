"""What a cloud's inventory (``skyward ls`` / ``down``) does alike: the API connected once,
when first asked; leftovers read from their tags; and ``delete``: the leftovers of this cloud
by place and kind, each kind said, the cloud's deletions, and one ``ProvisionError`` naming
what is left.

A cloud's subclass lists (``leftovers``) and deletes (``remove``: the leftovers of one place
by kind, in ``kinds``' order; what could not be deleted, as ``"kind name (why)"``). A place
is what one API reaches: GCP's project and Azure's subscription are one each; AWS's regions
are each their own (``place``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Generic, TypeVar

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import Leftover, tagged_leftover

ApiT = TypeVar("ApiT")


class CloudInventory(Generic[ApiT]):
    """Leftovers in one place of a cloud, reached through the API that ``connect`` makes
    (built of values by the configuration's module)."""

    provider: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]  # what ``delete`` deletes, in this order

    def __init__(self, connect: Callable[[], ApiT], *, release_timeout: float) -> None:
        self._connect = connect
        self._release_timeout = release_timeout
        self._api: ApiT | None = None

    @property
    def where(self) -> str:
        """The place searched, in words ("project P"); it may take the API to know."""
        raise NotImplementedError

    @property
    def api(self) -> ApiT:
        if self._api is None:
            self._api = self._connect()
        return self._api

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        raise NotImplementedError

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        raise NotImplementedError

    def place(self, leftover: Leftover) -> str:
        """Where ``leftover`` is deleted through (``""``: this inventory's one API)."""
        return ""

    def leftover(
        self,
        kind: str,
        id: str,
        tags: Mapping[str, str],
        *,
        region: str,
        state: str = "exists",
        hourly: float | None = None,
    ) -> Leftover:
        return tagged_leftover(
            self.provider, kind, id, tags, state=state, region=region, hourly_cost=hourly
        )

    def delete(self, leftovers: Sequence[Leftover], reporter: Reporter) -> None:
        mine = [x for x in leftovers if x.provider == self.provider]
        failed = []
        for place in sorted({self.place(x) for x in mine}):
            here = [x for x in mine if self.place(x) == place]
            by_kind = {kind: [x for x in here if x.kind == kind] for kind in self.kinds}
            if not any(by_kind.values()):
                continue
            where = place or self.where
            for kind, some in by_kind.items():
                if some:
                    reporter.status(f"deleting {len(some)} {kind}(s) in {where}")
            timeout = self._release_timeout
            left = self.remove(by_kind, Deadline(timeout, f"release_timeout ({timeout:g} s)"))
            if left:
                failed.append(f"could not delete {', '.join(left)} in {where}")
        if failed:
            raise ProvisionError("; ".join(failed))
