"""The interface between the request-level layer and an implementation.

Some implementations take requests, not block operations (the Dynamo mocker
behind ``ai-dynamo-runtime`` is one). A ``RequestImplementation`` is one
running engine with one KV pool: the suite hands it a workload of requests
and gets back what each request reported (its cached-token count, how it
finished) and the KV event stream the engine published while running them.

- ``run_sequential``: one request after another; each request's events are
  the ones published after it started and before the stream went quiet, so
  they can be compared with the reference model request by request.
- ``run_concurrent``: all requests in flight together; one stream, checked
  against the protocol rules only.

An adapter folder declares ``kind = "request"`` and ``start.python =
"module:factory"``; ``factory(setup, manifest, adapter_dir)`` returns the
implementation. A block-level adapter declaring ``request_level`` names its
own factory in ``start.requests``, or, for ``kind = "subprocess"`` and
``kind = "c_abi"``, leaves it out: the layer then runs through the
request-level messages of protocol version 2 (``transport.engine``), so a
port in any language is checked by the same layer. An implementation that cannot run on this machine (a wheel
that is not installed) raises ``ImplementationUnavailableError`` from its factory,
which the suite turns into a skip naming the reason; an implementation that
is there but fails to start raises ``AdapterError``, a failure.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from pydantic import Field

from kvspec.reference.requests import PoolSetup, RequestSpec
from kvspec.spec.errors import ConfigError, KvSpecError
from kvspec.spec.wire import KvEvent, Wire

from .manifest import Manifest


class ImplementationUnavailableError(KvSpecError):
    """The implementation cannot run here (a missing package); the suite skips."""


class RequestOutcome(Wire):
    """What the engine reported for one request.

    ``cached_tokens`` is the prompt's prefix-cache hit in tokens (None when the
    engine does not report it); ``finish`` is how the request ended
    (``length`` when it generated ``max_tokens``). In a sequential run
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


class RequestImplementation(ABC):
    """One running engine with one KV pool. Close it (or use ``with``)."""

    manifest: Manifest
    setup: PoolSetup

    @abstractmethod
    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        """Run the requests one after another; raise AdapterError on transport failure."""

    @abstractmethod
    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        """Run the requests all at once."""

    def close(self) -> None:  # noqa: B027 - optional for in-process adapters
        """Release everything the implementation holds (processes, sockets)."""

    def __enter__(self) -> RequestImplementation:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_request_implementation(manifest: Manifest, adapter_dir: Path, setup: PoolSetup) -> RequestImplementation:
    """Start the request-level implementation a manifest describes."""
    if not manifest.capabilities.request_level:
        raise ConfigError(f"{manifest.name}: the manifest does not declare request_level")
    target = manifest.start.python if manifest.kind == "request" else manifest.start.requests
    if target is None and manifest.kind in ("subprocess", "c_abi"):
        from .transport.engine import open_engine_implementation

        return open_engine_implementation(manifest, adapter_dir, setup)
    if not target or ":" not in target:
        raise ConfigError(
            f"{manifest.name}: a request-level adapter needs start.python (kind 'request') or "
            "start.requests (kind 'python') = 'module:factory'; kinds 'subprocess' and 'c_abi' "
            "speak protocol version 2 without one"
        )
    mod_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(mod_name), attr)
    impl: RequestImplementation = factory(setup, manifest, adapter_dir)
    return impl
