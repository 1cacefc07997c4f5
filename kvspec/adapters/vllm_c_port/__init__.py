"""A request-level port of the vLLM-style pool in C11, over the C ABI version 2.

The suite builds ``abi.c engine.c pool.c json.c xxh3.c`` with the machine's C
compiler when it opens the adapter (``conformance/transport/cabi.py``); this
package only carries the sources. See README.md.
"""
