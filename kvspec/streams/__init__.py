"""Reading and checking real KV event streams (``kvspec check-log``, ``kvspec watch``).

``formats`` detects and reads recorded files, ``capture`` is the ZMQ capture
file, ``zmqfeed`` turns multipart ZMQ messages into events (sequence checks
included), ``hashcheck`` checks block hashes against tokens, ``check`` builds
the router view for a producer and reports its findings, ``results`` and
``junit`` are the machine-readable outputs, ``watch`` follows a live feed.
"""
