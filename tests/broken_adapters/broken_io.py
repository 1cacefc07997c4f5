"""The JSON-lines I/O of the broken children (broken_server.py, broken_engine.py).

Standard library only, so the children start fast; each child runs as a
script from this folder, which is first on its import path.
"""

from __future__ import annotations

import json
import sys
import time

OUT = sys.stdout.buffer


def send(obj: object) -> None:
    OUT.write(json.dumps(obj).encode() + b"\n")
    OUT.flush()


def read() -> dict:
    """The next line from the parent as JSON; at end of input, exit quietly."""
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def sleep_forever() -> None:
    while True:
        time.sleep(3600)
