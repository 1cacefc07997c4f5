"""The radix profile in z3: the page tree, its steps, operations and unbounded form."""
