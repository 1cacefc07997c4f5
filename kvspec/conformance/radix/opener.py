"""Start the radix cache a manifest describes.

Either the in-process factory named in ``start.radix`` or, for a
``kind = "subprocess"`` adapter without one, a child speaking protocol
version 4 (``transport/radix.py``); the one opener (``conformance/opener.py``)
does it. Kept apart from ``radix/interface.py`` so that the interface, which
the transport implements, never imports the transport
(tests/test_import_layers.py).
"""

from __future__ import annotations

from pathlib import Path

from kvspec.conformance.opener import open_adapter
from kvspec.conformance.radix.interface import RadixImplementation
from kvspec.spec.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig


def open_radix(manifest: Manifest, adapter_dir: Path, config: RadixConfig) -> RadixImplementation:
    """Start the radix cache a manifest describes, configured with ``config`` (through the one
    opener, ``kvspec.conformance.opener.open_adapter``)."""
    return open_adapter(manifest, adapter_dir, config)
