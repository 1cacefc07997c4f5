"""z3 beside the model: the transition rules as constraints, proven invariants,
bounded model checking, and the witness scenarios it exports.

- ``universe``, ``state``, ``step``: the bounded universe and one state of it.
- ``transitions``: one transition relation per operation, its constraints
  named after rule ids (read it beside spec/SPEC.md and reference/g1.py).
- ``invariants``: INV-* and the LEMMA-* that make them inductive
  (spec/INVARIANTS.md states them in prose).
- ``prover``: the inductive proofs, with readable counterexamples.
- ``mutants``: broken variants of the rules the prover must refute.
- ``ops``: the model's operations as sequences of transitions.
- ``agreement``: the encoding against ``reference.g1.G1Model``, step by step.
- ``bmc``, ``witnesses``: bounded model checking and the scenario files it
  writes under spec/scenarios/witnesses/.
- ``cli_prove``, ``cli_witnesses``: ``kvspec prove`` and ``kvspec witnesses``.
"""
