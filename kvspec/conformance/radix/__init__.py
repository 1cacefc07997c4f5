"""The radix profile: the radix cache interface, its opener and its checkers."""
