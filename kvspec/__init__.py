"""kvspec: an executable specification of KV-cache block managers and their
KV event protocol, and a conformance suite that runs it against any
implementation.

The source tree is the architecture: ``spec/`` (rules, wire models, scenarios)
is ``kvspec.spec``, ``reference/`` (the model and the router view) is
``kvspec.reference``, ``conformance/`` (the pytest suite and harness) is
``kvspec.conformance``, and ``adapters/`` is ``kvspec.adapters``.
"""

__version__ = "0.1.0"
