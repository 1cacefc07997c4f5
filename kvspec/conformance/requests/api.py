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

import importlib
from pathlib import Path

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
from kvspec.spec.errors import ConfigError

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
    """Start the request-level implementation a manifest describes."""
    if not manifest.capabilities.request_level:
        raise ConfigError(f"{manifest.name}: the manifest does not declare request_level")
    target = manifest.start.python if manifest.kind == "request" else manifest.start.requests
    if target is None and manifest.kind in ("subprocess", "c_abi"):
        from kvspec.conformance.transport.engine import open_engine_implementation

        return open_engine_implementation(manifest, adapter_dir, setup)
    if not target or ":" not in target:
        raise ConfigError(
            f"{manifest.name}: a request-level adapter needs start.python (kind 'request') or "
            "start.requests (kind 'python') = 'module:factory'; kinds 'subprocess' and 'c_abi' "
            "speak protocol version 2 without one"
        )
    mod_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(mod_name), attr)
    extra = {} if manifest.variant is None else {"variant": manifest.variant}  # --impl=DIR/NAME
    impl: RequestImplementation = factory(setup, manifest, adapter_dir, **extra)
    return impl
