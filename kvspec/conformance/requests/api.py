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
port in any language is checked by the same layer. An implementation that
cannot run on this machine (a wheel that is not installed) raises
``ImplementationUnavailableError`` from its factory, which the suite turns
into a skip naming the reason; an implementation that is there but fails to
start raises ``AdapterError``, a failure.

The interface itself (``RequestImplementation``, ``RequestOutcome``,
``ConcurrentRun``) lives in ``request_interface.py``, below the transports;
it is re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.conformance.opener import open_adapter
from kvspec.conformance.requests.interface import (
    STALLED,
    ConcurrentRun,
    ImplementationUnavailableError,
    RequestImplementation,
    RequestOutcome,
    by_tier,
)
from kvspec.conformance.run.manifest import Manifest
from kvspec.reference.requests import PoolSetup

__all__ = [
    "STALLED",
    "ConcurrentRun",
    "ImplementationUnavailableError",
    "RequestImplementation",
    "RequestOutcome",
    "by_tier",
    "open_request_implementation",
]


def open_request_implementation(manifest: Manifest, adapter_dir: Path, setup: PoolSetup) -> RequestImplementation:
    """Start the request-level implementation a manifest describes (through the one opener,
    ``kvspec.conformance.opener.open_adapter``)."""
    return open_adapter(manifest, adapter_dir, setup)
