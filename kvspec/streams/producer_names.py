"""The names a stream gives the vLLM engine: as a producer and as an input format.

Both are spelled ``vllm``, like the vllm profile, but mean the engine: the
producer whose feed ``kvspec check-log`` reads (its hash representation and
counting), and the format of its raw ``KVEventBatch`` msgpack payloads. They are
named here once, apart from the profile registry, so that a search for the
profile's name finds the profile (tests/test_profile_names.py).
"""

from __future__ import annotations

#: the vLLM engine as the producer of a feed (``--producer``)
VLLM_PRODUCER = "vllm"
#: vLLM ``KVEventBatch`` msgpack payloads, one a record (``--format``)
VLLM_FORMAT = "vllm"
