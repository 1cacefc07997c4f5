"""The allocator-level profiles (paged, session): interface, lockstep, checks."""
