"""A misrouted app: the configured URL answers that it has no such route (docs/app-contract.md).

:class:`AppRoute` owns what the sidecar knows of it: whether the route is missing (the URL and
the status the app answered), the wait before the next try, and the one log line each way. It
is told by the pipeline of every answer (`missing`, `answered`), closes intake through the
pipeline's :class:`~sidecar.engines.outlet.Reachability` (so both engines stop handing out records
as for an app that does not listen) and reopens it after a backoff: the next request, alone, is
the probe (only a real request to the real path can tell a fixed deploy). A route-missing answer is
no attempt, so a probe costs a record nothing. Must not import either engine or confluent-kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

from sidecar.engines.outlet import Reachability
from sidecar.http.appclient import AppRouteMissing

log = logging.getLogger("sidecar.engine")

T = TypeVar("T")


class AppRoute(Generic[T]):
    """Whether the app has the configured route, and the retry while it has not.

    The retry is one request: after the backoff intake opens again, the first request to start is
    the probe (`may_send`), and every other request that would start before its answer is parked
    here, holding its request slot. The probe's outcome (`settled`) hands them back: to be sent
    when the app answered it, or as not reached when it did not (the route still missing, or the
    app gone), as the probe's own records are.
    """

    def __init__(
        self,
        reachability: Reachability,
        intake_changed: Callable[[], None],
        *,
        backoff_initial_s: float,
        backoff_max_s: float,
    ) -> None:
        self._reachability = reachability
        self._intake_changed = intake_changed
        self._initial_s = backoff_initial_s
        self._max_s = backoff_max_s
        self._delay_s = backoff_initial_s
        self.url: str | None = None  # set while the route is missing
        self.status: int | None = None
        self.answers = 0  # route-missing answers since the process started
        self.probing = False  # intake reopened after the backoff: the next request is the probe
        self._probe_out = False  # the probe was sent; its answer has not come
        self._parked: list[T] = []  # requests (their items) waiting for the probe's answer

    @property
    def missing(self) -> bool:
        return self.url is not None

    def reason(self) -> str | None:
        """What /readyz says while the route is missing."""
        if self.url is None:
            return None
        return (
            f"the app answers HTTP {self.status} at {self.url}: it has no such route "
            "(check app.url); intake is paused, nothing is counted or dead-lettered"
        )

    def lost(self, exc: AppRouteMissing, nursery: trio.Nursery | None) -> None:
        """The app answered a request with route-missing: intake closes until the next try."""
        self.answers += 1
        if self.url != exc.url or self.status != exc.status:
            self.url, self.status = exc.url, exc.status
            log.error(
                "the app answers HTTP %d at %s: it has no such route (check app.url); intake "
                "paused, records are not counted or dead-lettered; trying again until it answers",
                exc.status,
                exc.url,
            )
        if self._reachability.lost():
            self._intake_changed()
            if nursery is not None:
                nursery.start_soon(self._try_again)

    def answered(self) -> None:
        """The app answered a request with something else: the route exists (again)."""
        if self.url is None:
            return
        log.info("the app answers at %s again: resuming intake", self.url)
        self.url = self.status = None
        self._delay_s = self._initial_s

    def may_send(self, items: T) -> bool:
        """Whether the request carrying `items` starts now; False: parked until the probe's
        answer (`settled` gives it back)."""
        if not self.probing:
            return True
        if not self._probe_out:
            self._probe_out = True
            return True
        self._parked.append(items)
        return False

    def settled(self) -> list[T]:
        """A request's outcome came (an answer, route-missing or not reached): the probe, if one
        was out, is over. The parked requests, for the caller to send (after an answer, once
        `answered` has run) or to treat as not reached (after `lost`, or the app gone)."""
        self.probing = self._probe_out = False
        parked, self._parked = self._parked, []
        return parked

    def drop_parked(self) -> list[T]:
        """Shutdown: the parked requests, never sent."""
        return self.settled()

    async def _try_again(self) -> None:
        """After the backoff, let records go again: the first request is the probe."""
        await trio.sleep(self._delay_s)
        self._delay_s = min(self._delay_s * 2, self._max_s)
        if not self._reachability.reachable:
            self.probing = True
            self._probe_out = False
            self._reachability.back()
            self._intake_changed()


__all__ = ["AppRoute"]
