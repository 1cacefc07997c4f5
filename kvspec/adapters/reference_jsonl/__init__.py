"""The reference model behind the JSON-lines protocol (spec/PROTOCOL.md).

``server.py`` runs in a child process, so that the suite exercises the whole
subprocess path (handshake, framing, validation, cleanup) on a model whose
behaviour is known to be right.
"""
