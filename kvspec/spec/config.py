"""Manager configuration: what an implementation is opened with.

The same object configures the reference model, travels in the JSON-lines
handshake and in the C ABI's open call, and heads every scenario and replay
file, so that a run can be reproduced from its file alone.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .wire import Wire

#: paged and session are the allocator-level profiles (spec.manager_wire): a
#: ManagerConfig of theirs only heads a protocol-version-3 hello
ProfileName = Literal["kvbm", "legacy", "atomic", "vllm", "paged", "session"]
PolicyName = Literal["lineage", "lru", "multi_lru", "unordered"]


class OffloadConfig(Wire):
    """The G2 (host pinned) tier behind G1.

    Transfer time of one block is ``block_size_bytes / (bandwidth_gbps * 1e9)``
    seconds; transfers on one link run one after another (they share it), so
    a batch of n evictions completes at n consecutive deadlines. A missing or
    zero size means transfers are instant (they complete at the next tick).
    """

    num_g2_blocks: int = Field(ge=1)
    block_size_bytes: int | None = Field(default=None, ge=0)
    bandwidth_gbps: float = Field(default=1.0, gt=0)
    g2_eviction: Literal["lru"] = "lru"

    def transfer_ms(self) -> float:
        if not self.block_size_bytes:
            return 0.0
        return self.block_size_bytes / (self.bandwidth_gbps * 1e9) * 1e3


class ManagerConfig(Wire):
    profile: ProfileName = "kvbm"
    capacity: int = Field(ge=1, le=1_000_000)
    block_size: int = Field(default=16, ge=1, le=4096)
    dp_rank: int = Field(default=0, ge=0)
    eviction: PolicyName = "lineage"
    offload: OffloadConfig | None = None

    @model_validator(mode="after")
    def _profile_fits(self) -> ManagerConfig:
        if self.profile == "legacy" and self.eviction != "lru":
            raise ValueError("the legacy profile evicts by LRU only (eviction='lru')")
        if self.profile == "vllm" and self.eviction != "lru":
            raise ValueError("the vllm profile evicts from its free queue (eviction='lru')")
        if self.offload is not None and self.profile != "kvbm":
            raise ValueError(f"the {self.profile} profile has no offload tier")
        return self
