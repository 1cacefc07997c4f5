"""The kvbm profile with an offload tier in z3 (bounded): state, transitions, invariants."""
