"""The interface between the suite and an implementation under test.

An ``Implementation`` is one running manager: the suite sends it operations
one at a time and gets back a ``StepOutcome`` (result or typed error, the
counters, the events published). How the operation gets there is the
adapter's business: in-process Python, a child process speaking JSON lines
(spec/PROTOCOL.md), or a C ABI through ctypes (spec/kvspec_abi.h).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Any

from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.wire import StepOutcome

from .manifest import Manifest


class Implementation(ABC):
    """One running manager under test. Close it (or use ``with``)."""

    manifest: Manifest
    config: ManagerConfig

    @abstractmethod
    def step(self, op: Any) -> StepOutcome:
        """Apply one operation; raise AdapterError if the transport fails."""

    def close(self) -> None:  # noqa: B027 - optional for in-process adapters
        """Release everything the implementation holds (processes, libraries)."""

    def __enter__(self) -> Implementation:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_implementation(manifest: Manifest, adapter_dir: Path, config: ManagerConfig) -> Implementation:
    """Start the implementation a manifest describes, configured with ``config``."""
    if manifest.kind == "python":
        if not manifest.start.python or ":" not in manifest.start.python:
            raise ConfigError(f"{manifest.name}: kind 'python' needs start.python = 'module:factory'")
        mod_name, _, attr = manifest.start.python.partition(":")
        factory = getattr(importlib.import_module(mod_name), attr)
        impl: Implementation = factory(config, manifest, adapter_dir)
        return impl
    if manifest.kind == "subprocess":
        from .transport.jsonl import JsonlImplementation

        return JsonlImplementation(manifest, adapter_dir, config)
    if manifest.kind == "c_abi":
        from .transport.cabi import CAbiImplementation

        return CAbiImplementation(manifest, adapter_dir, config)
    raise ConfigError(f"{manifest.name}: kind {manifest.kind!r} takes requests, not block operations")
