"""Ports with one declared difference from the spec each (see adapter.py)."""
