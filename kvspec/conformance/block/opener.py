"""Opening the block-level implementation a manifest describes.

``open_implementation`` is the one opener (``conformance/opener.py``) for a
``ManagerConfig``: an in-process Python factory, a child process speaking JSON
lines (``transport/jsonl.py``) or a C ABI library (``transport/cabi.py``). The
interface every implementation offers lives one layer below, in
``conformance/block/interface.py`` (re-exported here for adapters that import it
from this module).
"""

from __future__ import annotations

from pathlib import Path

from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.opener import open_adapter
from kvspec.spec.config import ManagerConfig
from kvspec.spec.manifest import Manifest

__all__ = ["Implementation", "open_implementation"]


def open_implementation(
    manifest: Manifest, adapter_dir: Path, config: ManagerConfig, *, workers: int = 1
) -> Implementation:
    """Start the block-level implementation a manifest describes, configured with ``config``:
    ``workers`` workers of one process sharing G3/G4 (at most the manifest's ``workers`` capability;
    1 opens the adapter exactly as before workers existed). The one opener
    (``kvspec.conformance.opener.open_adapter``) does it; this name stays for code written against it."""
    return open_adapter(manifest, adapter_dir, config, workers=workers)
