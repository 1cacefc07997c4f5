"""The checker of the ``generic`` family: any profile whose model and implementation answer ``step(op)``."""
