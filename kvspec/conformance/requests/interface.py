"""The request-level interface: what the suite hands an engine and what comes back.

A ``RequestImplementation`` is one running engine with one KV pool: the
suite hands it a workload of requests and gets back what each request
reported (``RequestOutcome``: its cached-token count, how it finished, in a
sequential run its events) or, for a concurrent run, one stream
(``ConcurrentRun``). This module sits below everything that talks to such an
engine, as ``interface.py`` does for block-level implementations: the
protocol-v2 transport (``transport/engine.py``) implements it, the
request-level layer (``request_check``, ``test_requests``) consumes it, and
``requests_api.py`` opens the right one for a manifest.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from kvspec.conformance.implementation import ImplementationBase
from kvspec.reference.requests import PoolSetup, RequestSpec
from kvspec.spec.errors import KvSpecError
from kvspec.spec.manifest import Manifest
from kvspec.spec.wire import KvEvent, Wire


class ImplementationUnavailableError(KvSpecError):
    """The implementation cannot run here (a missing package); the suite skips."""


#: the ``finish`` of a request the engine never completed: the adapter saw
#: no progress on it for a while (condition ``request_stalled``)
STALLED = "stalled"


class RequestOutcome(Wire):
    """What the engine reported for one request.

    ``cached_tokens`` is the prompt's prefix-cache hit in tokens (None when the
    engine does not report it); ``finish`` is how the request ended
    (``length`` when it generated ``max_tokens``; ``STALLED`` when the engine
    kept it without progress until the adapter gave up). In a sequential run
    ``events`` holds the events the request caused, in publication order."""

    cached_tokens: int | None = Field(default=None, ge=0)
    finish: str = "length"
    output_tokens: int = Field(default=0, ge=0)
    events: list[KvEvent] = Field(default_factory=list)


class ConcurrentRun(Wire):
    """A concurrent run: each request's outcome (without events) and the stream."""

    outcomes: list[RequestOutcome]
    events: list[KvEvent]

    def by_tier(self) -> dict[str, list[KvEvent]]:
        return by_tier(self.events)


def by_tier(events: Sequence[KvEvent]) -> dict[str, list[KvEvent]]:
    """The stream of each storage tier, in publication order (ids stay as
    published: they count across tiers)."""
    out: dict[str, list[KvEvent]] = {}
    for ev in events:
        out.setdefault(ev.storage_tier, []).append(ev)
    return out


class RequestImplementation(ImplementationBase):
    """One running engine with one KV pool, driven by whole requests (it shares the root of the
    implementation protocol, ``conformance/implementation.py``, not its ``step``). Close it (or use
    ``with``)."""

    manifest: Manifest
    setup: PoolSetup

    @abstractmethod
    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        """Run the requests one after another; raise AdapterError on transport failure."""

    @abstractmethod
    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        """Run the requests all at once."""

    # -- step by step, with the prefix-cache reset (capability ``reset``) ------
    # The reset test (``requests/reset_check.py``) drives one engine session
    # by these: a request runs while another call comes in only this way. An
    # adapter that declares ``reset`` implements all three.

    def add(self, request_id: str, spec: RequestSpec) -> None:
        """Queue one request (it is admitted and run by ``step``)."""
        raise NotImplementedError(f"{type(self).__name__} does not run requests step by step (capability reset)")

    def step(self) -> tuple[list[KvEvent], list[dict[str, Any]], bool]:
        """One engine step: its events, the requests that finished (each a
        dict with at least ``id`` and ``cached_tokens``), whether the engine
        is idle (nothing running or waiting)."""
        raise NotImplementedError(f"{type(self).__name__} does not run requests step by step (capability reset)")

    def reset_prefix_cache(self) -> tuple[bool, list[KvEvent]]:
        """The prefix-cache reset (CLEAR-ALL): whether it happened, and the
        events it published."""
        raise NotImplementedError(f"{type(self).__name__} has no prefix-cache reset (capability reset)")
