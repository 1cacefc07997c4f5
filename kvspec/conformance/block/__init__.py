"""The block-level checker: an implementation and the reference model in lockstep.

The adapter interface of the block profiles, the opener, the Hypothesis state
machine and its traffic, the per-step comparison and the router-view stream checks."""
