"""Radix sessions over the JSON-lines protocol, version 4.

A ``kind = "subprocess"`` adapter declaring ``profile:radix`` (without a
``start.radix`` factory) is reached through the child process machinery of
``transport/jsonl.py`` (start, timeouts, crash and garbage detection, reply
size limit, child reuse across sessions), as the allocator profiles are
(``transport/manager.py``): the ``hello`` offers version 4 (with 6, naming
family ``radix``, to a child whose manifest says it reads version 6) and
carries the radix cache's configuration in ``radix`` (``config`` names profile
``radix``); each operation of ``spec.radix_wire`` is one request, answered by
a ``RadixOutcomeReply`` (PROTOCOL.md sections 11 and 13). Every reply is validated
against the wire models, so a bad line names the field that was wrong.
"""

from __future__ import annotations

import time
from pathlib import Path

from kvspec.conformance.radix.interface import RadixImplementation
from kvspec.conformance.transport.jsonl import JsonlImplementation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.manifest import Manifest
from kvspec.spec.protocol import RadixOutcomeReply
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome
from kvspec.spec.registry import RADIX

#: ManagerConfig's largest capacity; the hello's ``config`` only names the
#: profile, the radix config carries the real pool size
_CONFIG_CAPACITY = 1_000_000


def radix_manager_config(config: RadixConfig) -> ManagerConfig:
    """The ``config`` of a version-4 hello: profile radix, the pool and page size repeated."""
    return ManagerConfig(profile=RADIX, capacity=min(config.capacity, _CONFIG_CAPACITY), block_size=config.page_size)


class _RadixSession(JsonlImplementation):
    """A child process in a radix session (version 4, or 6 naming family radix)."""

    def __init__(self, manifest: Manifest, adapter_dir: Path, radix: RadixConfig) -> None:
        super().__init__(manifest, adapter_dir, radix_manager_config(radix), radix=radix)

    def radix_call(self, op: RadixOp) -> RadixOutcome:
        obj, raw, during = self._exchange(op)
        reply: RadixOutcomeReply = self._validate(RadixOutcomeReply, obj, raw, during)
        return reply.outcome


class JsonlRadix(RadixImplementation):
    """A radix cache in a child process (protocol version 4 or 6)."""

    def __init__(self, manifest: Manifest, adapter_dir: Path, config: RadixConfig) -> None:
        self.config = config
        self.started = time.monotonic()
        self._session = _RadixSession(manifest, adapter_dir, config)

    def step(self, op: RadixOp) -> RadixOutcome:
        return self._session.radix_call(op)

    def close(self) -> None:
        self._session.close()
