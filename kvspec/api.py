"""kvspec's public API for adapters: everything an implementation's adapter needs, in one place.

An adapter (``adapters/NAME/``) imports from here and from ``kvspec.spec`` (the wire models, rule ids,
configs and errors), nothing else: the modules behind these names may move, these names do not
(``tests/test_import_layers.py`` holds every bundled adapter to it; the mutant zoos, which patch the
reference model's internals on purpose, may also import ``kvspec.reference``).

What is here, by job:

- the one implementation protocol (``StepwiseImplementation[Config, Op, Outcome]``: ``config``,
  ``step(op) -> outcome``, ``close``; ``ImplementationBase`` its root) and the interface an
  in-process adapter subclasses for each family of operations, that protocol with the family's
  wire models filled in (``Implementation`` for block-level profiles, ``ManagerImplementation``
  for paged/session, ``RadixImplementation`` for radix; ``RequestImplementation`` for
  request-level engines shares only the root), and ``open_adapter``, the one opener the suite uses
  for a manifest and a configuration of any family (``family_of`` says which family a
  configuration opens; ``open_implementation`` is its block-level name of old);
- manifests: ``Manifest``, ``Capabilities``, ``load_manifest``, ``builtin_adapters_dir``;
- transports an adapter can build on: ``ChildProcess`` (a JSON-lines child with bounded reads) and its
  errors, ``open_engine_command``, ``build_dir`` (where C and Rust ports are built);
- the reference models, for adapters that run or wrap them: ``make_model``, ``Model``, ``Step``,
  ``G1Model``, ``Process`` (several kvbm workers sharing G3/G4), ``LegacyModel``, ``VllmPoolModel``,
  ``PagedModel``, ``SessionModel``, ``RadixModel``,
  and the request-level driver (``RequestDriver``, ``PoolSetup``, ``RequestSpec``, ...).

Names load on first use (PEP 562), so importing this module costs nothing until a name is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

_HOME = {
    "Implementation": "kvspec.conformance.block.interface",
    "ImplementationBase": "kvspec.conformance.implementation",
    "StepwiseImplementation": "kvspec.conformance.implementation",
    "open_implementation": "kvspec.conformance.block.opener",
    "open_adapter": "kvspec.conformance.opener",
    "family_of": "kvspec.conformance.opener",
    "ManagerImplementation": "kvspec.conformance.managers.interface",
    "RadixImplementation": "kvspec.conformance.radix.interface",
    "ConcurrentRun": "kvspec.conformance.requests.api",
    "RequestImplementation": "kvspec.conformance.requests.api",
    "RequestOutcome": "kvspec.conformance.requests.api",
    "ImplementationUnavailableError": "kvspec.conformance.requests.interface",
    "Capabilities": "kvspec.conformance.run.manifest",
    "Manifest": "kvspec.conformance.run.manifest",
    "builtin_adapters_dir": "kvspec.conformance.run.manifest",
    "load_manifest": "kvspec.conformance.run.manifest",
    "build_dir": "kvspec.conformance.transport.cabi",
    "open_engine_command": "kvspec.conformance.transport.engine",
    "ChildExitedError": "kvspec.conformance.transport.process",
    "ChildProcess": "kvspec.conformance.transport.process",
    "ChildTimeoutError": "kvspec.conformance.transport.process",
    "LineTooLongError": "kvspec.conformance.transport.process",
    "G1Model": "kvspec.reference",
    "LegacyModel": "kvspec.reference",
    "Model": "kvspec.reference",
    "make_model": "kvspec.reference",
    "Step": "kvspec.reference.outcome",
    "Process": "kvspec.reference.process",
    "PagedModel": "kvspec.reference.paged",
    "RadixModel": "kvspec.reference.radix",
    "EngineCall": "kvspec.reference.requests",
    "Finished": "kvspec.reference.requests",
    "RequestEngine": "kvspec.reference.requests",
    "make_engine": "kvspec.reference.requests",
    "PoolSetup": "kvspec.reference.requests",
    "RequestDriver": "kvspec.reference.requests",
    "RequestSpec": "kvspec.reference.requests",
    "SyntheticDecode": "kvspec.reference.requests",
    "interleave": "kvspec.reference.requests",
    "run_sequential": "kvspec.reference.requests",
    "SessionModel": "kvspec.reference.session",
    "SPEC_VARIANT": "kvspec.reference.vllm_pool",
    "HostTier": "kvspec.reference.vllm_pool",
    "PoolVariant": "kvspec.reference.vllm_pool",
    "VllmPoolModel": "kvspec.reference.vllm_pool",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the public names are kvspec.api.__all__)")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
