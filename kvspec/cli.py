"""The ``kvspec`` command line.

Each subcommand lives in the module that owns its job and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this file only lists them,
so importing the CLI stays cheap (z3 loads only for ``prove``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvspec import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("kvspec.conformance.commands.replay", "run a replay file against an implementation"),
    "mutants": ("kvspec.conformance.commands.mutants", "run the suite against every mutant; table of kills"),
    "prove": ("kvspec.reference.smt.cli.prove", "prove the lifecycle invariants with z3"),
    "equivalence": (
        "kvspec.reference.smt.cli.equivalence",
        "model and z3 encoding: equal successor sets in every state of a small bound",
    ),
    "witnesses": ("kvspec.reference.smt.cli.witnesses", "regenerate the bounded-model-checking scenarios"),
    "schemas": ("kvspec.spec.schema_export", "write (or --check) the JSON Schemas in spec/schema/"),
    "check-log": ("kvspec.streams.check_log", "check a recorded event stream (Dynamo, vLLM, SGLang, kvspec) offline"),
    "watch": (
        "kvspec.streams.watch",
        "subscribe to a live ZMQ KV event feed (vLLM-style or Dynamo's event plane) and check it continuously",
    ),
    "report": (
        "kvspec.conformance.commands.report",
        "results files as a rules x implementations matrix (Markdown, HTML)",
    ),
    "gate": (
        "kvspec.conformance.commands.gate",
        "compare a run's results with a baseline; non-zero exit on a regression",
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"kvspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        # no help of its own: "kvspec NAME --help" reaches the full parser below
        p = sub.add_parser(name, help=help_text, description=help_text, add_help=False)
        p.set_defaults(_module=module)
        # arguments are added lazily below, once we know which subcommand runs
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    mod = importlib.import_module(args._module)
    full = argparse.ArgumentParser(prog=f"kvspec {args.command}", description=SUBCOMMANDS[args.command][1])
    mod.add_arguments(full)
    sub_args = full.parse_args(rest)
    return int(mod.run(sub_args))


if __name__ == "__main__":
    sys.exit(main())
