"""Allocator-level sessions over the JSON-lines protocol, version 3.

A ``kind = "subprocess"`` adapter declaring ``profile:paged`` or
``profile:session`` is reached through the child process machinery of
``transport/jsonl.py`` (start, timeouts, crash and garbage detection, child
reuse across sessions): only the handshake and the reply model differ. The
``hello`` offers version 3 alone and carries the manager's configuration in
``manager`` (its ``config`` names the same profile, with the pool size as
capacity); each operation of ``spec.manager_wire`` is one request, answered
by a ``ManagerOutcomeReply`` (PROTOCOL.md section 10).
"""

from __future__ import annotations

import time
from pathlib import Path

from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.transport.jsonl import JsonlImplementation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.manager_wire import ManagerConfigKind, ManagerOp, ManagerOutcome, PagedConfig, PagedOutcome
from kvspec.spec.manifest import Manifest
from kvspec.spec.protocol import MANAGER_VERSION, Hello, ManagerOutcomeReply


def manager_config(config: ManagerConfigKind) -> ManagerConfig:
    """The ``config`` of a version-3 hello: the profile, and the pool's size as capacity."""
    if isinstance(config, PagedConfig):
        return ManagerConfig(profile="paged", capacity=config.device_blocks, block_size=config.block_size)
    return ManagerConfig(profile="session", capacity=config.slots)


class SingleVersionSession(JsonlImplementation):
    """A child process in a session of one protocol version offered alone
    (3: allocator-level, 4: radix): the hello names that version only, and
    the ready must choose it and the profile configured."""

    #: the one version the hello offers
    version: int = MANAGER_VERSION
    #: what the session is, for the error message of a wrong version
    what: str = "an allocator-level session"

    def _hello(self) -> bytes:
        """The hello line, without its newline."""
        raise NotImplementedError

    def _wrong_version(self, chosen: int) -> str | None:
        if chosen == self.version:
            return None
        return f"chose protocol version {chosen}; {self.what} offers only {self.version}"


class _ManagerSession(SingleVersionSession):
    """A child process in a version-3 session."""

    def __init__(self, manifest: Manifest, adapter_dir: Path, manager: ManagerConfigKind) -> None:
        self.manager = manager
        super().__init__(manifest, adapter_dir, manager_config(manager))

    def _hello(self) -> bytes:
        hello = Hello(type="hello", versions=[MANAGER_VERSION], config=self.config, manager=self.manager)
        return hello.model_dump_json(exclude={"engine", "radix", "workers"}).encode()

    def manager_call(self, op: ManagerOp) -> ManagerOutcome:
        obj, raw, during = self._exchange(op)
        reply: ManagerOutcomeReply = self._validate(ManagerOutcomeReply, obj, raw, during)
        want = PagedOutcome if isinstance(self.manager, PagedConfig) else None
        if (want is not None) != isinstance(reply.outcome, PagedOutcome):
            raise self._fail(f"reply {during} is a {type(reply.outcome).__name__}, not the session's kind")
        return reply.outcome


class JsonlManager(ManagerImplementation):
    """A paged or session manager in a child process (protocol version 3)."""

    def __init__(self, manifest: Manifest, adapter_dir: Path, config: ManagerConfigKind) -> None:
        self.config = config
        self.started = time.monotonic()
        self._session = _ManagerSession(manifest, adapter_dir, config)

    def step(self, op: ManagerOp) -> ManagerOutcome:
        return self._session.manager_call(op)

    def close(self) -> None:
        self._session.close()
