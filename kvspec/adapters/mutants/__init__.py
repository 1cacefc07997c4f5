"""Mutants: deliberately broken variants of the reference model.

Each mutant reproduces one realistic bug a port of the KV manager could have,
as a small subclass of the reference model (or of one of its eviction
policies) that overrides the one method where the bug lives. They exist to
prove that the conformance suite catches bugs: ``kvspec mutants`` runs the
suite against each and reports which test killed it, under which rule, and
how fast. ``catalogue.py`` lists them; ``README.md`` explains how to run one.
"""
