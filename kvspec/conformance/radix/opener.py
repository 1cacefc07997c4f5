"""Start the radix cache a manifest describes.

Either the in-process factory named in ``start.radix`` or, for a
``kind = "subprocess"`` adapter without one, a child speaking protocol
version 4 (``transport/radix.py``). Kept apart from ``radix_interface`` so
that the interface, which the transport implements, never imports the
transport (tests/test_import_layers.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kvspec.conformance.radix.interface import RadixImplementation
from kvspec.conformance.transport.radix import JsonlRadix
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig


def open_radix(manifest: Manifest, adapter_dir: Path, config: RadixConfig) -> RadixImplementation:
    """Start the radix cache a manifest describes, configured with ``config``."""
    target = manifest.start.radix
    if not target and manifest.kind == "subprocess":
        return JsonlRadix(manifest, adapter_dir, config)
    if not target or ":" not in target:
        raise ConfigError(
            f"{manifest.name}: a radix adapter names its factory in start.radix = 'module:factory' "
            "or is kind 'subprocess' (protocol version 4)"
        )
    mod_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(mod_name), attr)
    extra = {"variant": manifest.variant} if manifest.variant else {}
    impl: RadixImplementation = factory(config, manifest, adapter_dir, **extra)
    return impl
