"""The kvbm-offload encoding held against the Python model: sampled agreement (``sampled``), seeded
campaigns (``campaign``), the encoding mutants only the model exposes (``encoding_mutants``) and the
exhaustive both-ways check (``equivalence``)."""
