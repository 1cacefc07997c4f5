"""The C port adapter: C sources (abi.c, g1.c, json.c) implementing
spec/kvspec_abi.h, built and loaded by ``kvspec.conformance.transport.cabi``.

There is no Python here on purpose: the folder is what a port author would
ship (C sources and a manifest); kvspec does the building and the calling.
"""
