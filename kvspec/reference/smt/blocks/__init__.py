"""The block profiles without an offload tier in z3: kvbm, legacy, atomic."""
