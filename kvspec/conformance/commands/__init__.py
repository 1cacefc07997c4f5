"""The conformance CLI verbs: replay, mutants, gate, report."""
