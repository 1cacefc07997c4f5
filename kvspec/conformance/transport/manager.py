"""Allocator-level sessions over the JSON-lines protocol, version 3 (or 6).

A ``kind = "subprocess"`` adapter declaring ``profile:paged`` or
``profile:session`` is reached through the child process machinery of
``transport/jsonl.py`` (start, timeouts, crash and garbage detection, child
reuse across sessions, the handshake): only the reply model differs. The
``hello`` offers version 3 (with 6, naming family ``manager``, to a child whose
manifest says it reads version 6) and carries the manager's configuration in
``manager`` (its ``config`` names the same profile, with the pool size as
capacity); each operation of ``spec.manager_wire`` is one request, answered
by a ``ManagerOutcomeReply`` (PROTOCOL.md sections 10 and 13).
"""

from __future__ import annotations

import time
from pathlib import Path

from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.transport.jsonl import JsonlImplementation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.manager_wire import ManagerConfigKind, ManagerOp, ManagerOutcome, PagedConfig, PagedOutcome
from kvspec.spec.manifest import Manifest
from kvspec.spec.protocol import ManagerOutcomeReply
from kvspec.spec.registry import PAGED, SESSION


def manager_config(config: ManagerConfigKind) -> ManagerConfig:
    """The ``config`` of a version-3 hello: the profile, and the pool's size as capacity."""
    if isinstance(config, PagedConfig):
        return ManagerConfig(profile=PAGED, capacity=config.device_blocks, block_size=config.block_size)
    return ManagerConfig(profile=SESSION, capacity=config.slots)


class _ManagerSession(JsonlImplementation):
    """A child process in an allocator-level session (version 3, or 6 naming family manager)."""

    def __init__(self, manifest: Manifest, adapter_dir: Path, manager: ManagerConfigKind) -> None:
        super().__init__(manifest, adapter_dir, manager_config(manager), manager=manager)

    def manager_call(self, op: ManagerOp) -> ManagerOutcome:
        obj, raw, during = self._exchange(op)
        reply: ManagerOutcomeReply = self._validate(ManagerOutcomeReply, obj, raw, during)
        want = PagedOutcome if isinstance(self.manager, PagedConfig) else None
        if (want is not None) != isinstance(reply.outcome, PagedOutcome):
            raise self._fail(f"reply {during} is a {type(reply.outcome).__name__}, not the session's kind")
        return reply.outcome


class JsonlManager(ManagerImplementation):
    """A paged or session manager in a child process (protocol version 3 or 6)."""

    def __init__(self, manifest: Manifest, adapter_dir: Path, config: ManagerConfigKind) -> None:
        self.config = config
        self.started = time.monotonic()
        self._session = _ManagerSession(manifest, adapter_dir, config)

    def step(self, op: ManagerOp) -> ManagerOutcome:
        return self._session.manager_call(op)

    def close(self) -> None:
        self._session.close()
