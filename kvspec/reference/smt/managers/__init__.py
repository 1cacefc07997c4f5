"""The allocator-level profiles in z3: paged reference counts, session fencing."""
