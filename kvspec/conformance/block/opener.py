"""Opening the implementation a manifest describes.

``open_implementation`` picks how the suite talks to it from the manifest's
``kind``: an in-process Python factory, a child process speaking JSON lines
(``transport/jsonl.py``) or a C ABI library (``transport/cabi.py``). The
interface every implementation offers lives one layer below, in
``conformance/block/interface.py`` (re-exported here for adapters that import it
from this module).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kvspec.conformance.block.interface import Implementation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest

__all__ = ["Implementation", "open_implementation"]


def open_implementation(
    manifest: Manifest, adapter_dir: Path, config: ManagerConfig, *, workers: int = 1
) -> Implementation:
    """Start the implementation a manifest describes, configured with ``config``:
    ``workers`` workers of one process sharing G3/G4 (at most the manifest's
    ``workers`` capability; 1 opens the adapter exactly as before workers existed)."""
    if not 1 <= workers <= manifest.capabilities.workers:
        raise ConfigError(
            f"{manifest.name}: {workers} workers asked, the manifest declares workers = {manifest.capabilities.workers}"
        )
    if manifest.kind == "python":
        if not manifest.start.python or ":" not in manifest.start.python:
            raise ConfigError(f"{manifest.name}: kind 'python' needs start.python = 'module:factory'")
        mod_name, _, attr = manifest.start.python.partition(":")
        factory = getattr(importlib.import_module(mod_name), attr)
        # a selected variant (--impl=DIR/NAME) is an explicit argument
        extra: dict[str, object] = {} if manifest.variant is None else {"variant": manifest.variant}
        if workers > 1:  # a factory written before workers existed is never asked for more than one
            extra["workers"] = workers
        impl: Implementation = factory(config, manifest, adapter_dir, **extra)
        return impl
    if manifest.kind == "subprocess":
        from kvspec.conformance.transport.jsonl import JsonlImplementation

        return JsonlImplementation(manifest, adapter_dir, config, workers=workers)
    if manifest.kind == "c_abi":
        from kvspec.conformance.transport.cabi import CAbiImplementation

        return CAbiImplementation(manifest, adapter_dir, config)
    raise ConfigError(f"{manifest.name}: kind {manifest.kind!r} takes requests, not block operations")
