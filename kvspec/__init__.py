"""kvspec: an executable specification of KV-cache block managers and their
KV event protocol, and a conformance suite that runs it against any
implementation.

The package is the architecture, one sub-package per layer, each import name
following its path: ``kvspec/spec`` (rules, wire models, scenarios),
``kvspec/reference`` (the model and the router view), ``kvspec/conformance``
(the pytest suite and harness) and ``kvspec/adapters`` (one folder per
implementation). The repository's top-level ``spec/``, ``reference/``,
``conformance/`` and ``adapters/`` are links to them.
"""

__version__ = "0.1.0"
