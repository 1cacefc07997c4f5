"""Importing SGLang's ``radix_cache`` module on a CPU-only machine, in the worker only.

``sglang.srt.mem_cache.radix_cache`` imports ``base_prefix_cache``, which
imports ``memory_pool`` for a type name, which imports the package
``sglang.srt.configs``, whose ``__init__`` imports every model config; one of
them (``configs/nano_nemotron_vl.py``) imports ``multimodal/internvl_utils.py``,
which does ``import torchvision.transforms`` at module level. No torchvision
build for the CPU torch 2.13.0 exists on this machine's index (the published
wheels are CUDA builds whose ``_C`` does not load on CPU torch, and their
import then fails), and the radix cache never touches torchvision.

So, and only here (the worker child process, never the test process), the
three module names ``torchvision``, ``torchvision.transforms`` and
``torchvision.transforms.functional`` are bound to an ``Absent`` placeholder
*when torchvision is not installed*. It is not silent: every attribute
anyone reads from it is recorded (``ABSENT_READS``); the worker reports them
and the adapter fails the run if anything beyond the names
``internvl_utils`` binds at import time is read while the cache runs.
Everything else SGLang imports is the real package, pinned in
``constraints-engines.txt``.

The clock: ``radix_cache`` reads ``time.monotonic()`` for last-access and
creation times. Two readings can be equal on a coarse clock source, and then
the eviction order of two leaves would depend on set iteration order. The
worker gives the module a logical clock (``LogicalClock``: each reading is
one more than the last) so that every run is deterministic; the order of the
readings is SGLang's own.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from typing import Any

#: what ``internvl_utils`` binds at import time (read once, never called)
IMPORT_TIME_READS = frozenset(
    {
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.InterpolationMode",
        "torchvision.transforms.functional.InterpolationMode",
    }
)
ABSENT_READS: list[str] = []
ABSENT_MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class Absent(types.ModuleType):
    """A module that is not installed: records every attribute read and call."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        ABSENT_READS.append(f"{self.__name__}.{name}")
        return Absent(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ABSENT_READS.append(f"{self.__name__}()")
        return self


class LogicalClock:
    """Stands for the ``time`` module inside ``radix_cache``: ``monotonic`` counts."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def perf_counter(self) -> float:
        return time.perf_counter()


def load_radix_cache() -> tuple[types.ModuleType, list[str]]:
    """Import ``radix_cache`` (and its params module); returns it and the
    placeholder modules bound (empty when torchvision is installed)."""
    import sglang  # noqa: F401 - its transformers patches run before any placeholder exists

    bound: list[str] = []
    if importlib.util.find_spec("torchvision") is None:
        for name in ABSENT_MODULES:
            sys.modules[name] = Absent(name)
            bound.append(name)
    import sglang.srt.mem_cache.radix_cache as rc

    return rc, bound


def unexpected_reads() -> list[str]:
    """Placeholder reads beyond what ``internvl_utils`` binds at import time."""
    return sorted(set(ABSENT_READS) - IMPORT_TIME_READS)
