"""Manager configuration: what an implementation is opened with.

The same object configures the reference model, travels in the JSON-lines
handshake and in the C ABI's open call, and heads every scenario and replay
file, so that a run can be reproduced from its file alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from kvspec.spec.profiles import PROFILES
from kvspec.spec.registry import KVBM_NAME, ProfileName
from kvspec.spec.wire import Wire

#: the profile names come from the registry (spec.registry); paged and session are the
#: allocator-level profiles (spec.manager_wire): a ManagerConfig of theirs only heads a
#: protocol-version-3 hello
PolicyName = Literal["lineage", "lru", "multi_lru", "unordered"]


@dataclass(frozen=True, slots=True)
class SemanticsOption:
    """A behaviour that engines legitimately implement differently.

    ``default`` is what Dynamo's source does (the ``kvbm`` profile's default);
    ``legacy`` is what kvspec fixed before the option existed, and what an
    adapter that does not mention the option is taken to implement."""

    name: str
    values: tuple[str, ...]
    default: str
    legacy: str
    #: where the option lives: "offload" (OffloadConfig) or "manager"
    scope: str
    doc: str


#: every semantics option, by name (SPEC.md, "Offload semantics options")
SEMANTICS: dict[str, SemanticsOption] = {
    o.name: o
    for o in [
        SemanticsOption(
            "link",
            ("shared", "fifo"),
            "shared",
            "fifo",
            "offload",
            "shared: one transfer per blocked Use or swap-in, in batches of batch_size blocks, concurrent "
            "transfers share the link's bandwidth (processor sharing); fifo: one block at a time, in queue order",
        ),
        SemanticsOption(
            "g2_eviction",
            ("lineage", "lru"),
            "lineage",
            "lru",
            "offload",
            "lineage: G2 is a lineage pool (leaves first, as G1's lineage policy); lru: least recently used first",
        ),
        SemanticsOption(
            "g2_allocation",
            ("at_start", "at_completion"),
            "at_start",
            "at_completion",
            "offload",
            "at_start: a transfer's G2 destinations are allocated (and G2's evictions published) when it starts; "
            "at_completion: when it completes",
        ),
        SemanticsOption(
            "dedup",
            ("filter", "resend"),
            "filter",
            "resend",
            "offload",
            "filter: a block already in G2 or on its way there is not sent again; resend: every eviction is sent",
        ),
        SemanticsOption(
            "tick_result",
            ("none", "released_slots", "transfers"),
            "none",
            "transfers",
            "offload",
            "what a Tick returns: none (Dynamo's KvManager::tick_offload_engine returns nothing), released_slots "
            "(MockOffloadEngine::tick: the G1 source slots the tick gave back), transfers (transfers completed)",
        ),
        SemanticsOption(
            "lower_tier_events",
            ("none", "owner"),
            "none",
            "none",
            "offload",
            "none: G3 and G4 publish no router events (Dynamo's mocker); owner: the worker whose put completed "
            "publishes a disk (G3) or external (G4) Stored, and a G3 victim's Removed comes from the worker "
            "that put it",
        ),
    ]
}

LinkMode = Literal["shared", "fifo"]
G2Eviction = Literal["lineage", "lru"]
G2Allocation = Literal["at_start", "at_completion"]
Dedup = Literal["filter", "resend"]
TickResult = Literal["none", "released_slots", "transfers"]
LowerTierEvents = Literal["none", "owner"]


class OffloadConfig(Wire):
    """The G2 (host pinned) tier behind G1.

    Transfer time of one block alone on its link is ``block_size_bytes /
    (bandwidth_gbps * 1e9)`` seconds. How transfers share the link, how G2
    evicts, when G2 destinations are allocated and whether blocks already in
    G2 are sent again, and what a Tick returns are semantics options (``SEMANTICS``): the defaults are
    Dynamo's (ai-dynamo/dynamo ``lib/mocker/src/kvbm_offload/``), the legacy
    values what kvspec fixed before (a serial FIFO link, LRU, allocation at
    completion, resend, a Tick returning the transfers it completed). A missing or zero size means transfers are instant
    (they complete at the next tick).
    """

    num_g2_blocks: int = Field(ge=1)
    block_size_bytes: int | None = Field(default=None, ge=0)
    bandwidth_gbps: float = Field(default=1.0, gt=0)
    link: LinkMode = "shared"
    #: blocks per transfer on a shared link (Dynamo's offload_batch_size); at
    #: most this many transfers run at once, later batches wait their turn
    batch_size: int = Field(default=32, ge=1, le=1_000_000)
    g2_eviction: G2Eviction = "lineage"
    g2_allocation: G2Allocation = "at_start"
    dedup: Dedup = "filter"
    tick_result: TickResult = "none"
    #: G3 (local disk), shared by every worker of the process; None: off
    #: (Dynamo's ``num_g3_blocks``)
    num_g3_blocks: int | None = Field(default=None, ge=1)
    #: G2 <-> G3 bandwidth, each direction (a shared link per direction)
    bandwidth_g3_gbps: float = Field(default=1.0, gt=0)
    #: G4 (object store), shared by every worker of the process (Dynamo's
    #: ``enable_g4_storage``); it never evicts
    g4: bool = False
    #: G2 <-> G4 bandwidth, each direction (a shared link per direction)
    bandwidth_g4_gbps: float = Field(default=1.0, gt=0)
    lower_tier_events: LowerTierEvents = "none"

    @model_validator(mode="after")
    def _lower_tiers_need_the_shared_link(self) -> OffloadConfig:
        if (self.num_g3_blocks is not None or self.g4) and self.link != "shared":
            raise ValueError("G3 and G4 hang off Dynamo's pipelines: they need link = 'shared'")
        return self

    def lower_tiers(self) -> bool:
        """Is G3 or G4 on?"""
        return self.num_g3_blocks is not None or self.g4

    @classmethod
    def legacy(cls, **kw: object) -> OffloadConfig:
        """An offload tier with every semantics option at its legacy value."""
        opts = {n: o.legacy for n, o in SEMANTICS.items() if o.scope == "offload"}
        return cls.model_validate({**opts, **kw})

    def options(self) -> dict[str, str]:
        """The semantics options of this tier, by name."""
        return {n: getattr(self, n) for n, o in SEMANTICS.items() if o.scope == "offload"}

    def transfer_ms(self) -> float:
        if not self.block_size_bytes:
            return 0.0
        return self.block_size_bytes / (self.bandwidth_gbps * 1e9) * 1e3


class ManagerConfig(Wire):
    profile: ProfileName = KVBM_NAME
    capacity: int = Field(ge=1, le=1_000_000)
    block_size: int = Field(default=16, ge=1, le=4096)
    dp_rank: int = Field(default=0, ge=0)
    eviction: PolicyName = "lineage"
    offload: OffloadConfig | None = None

    @model_validator(mode="after")
    def _profile_fits(self) -> ManagerConfig:
        """The policy and the tier must be ones the profile has (its declaration, spec/profiles.py)."""
        semantics = PROFILES.get(self.profile)
        if semantics is None:
            return self
        if self.eviction not in semantics.policies:
            raise ValueError(
                f"the {self.profile} profile evicts by {' or '.join(map(repr, semantics.policies))} only "
                f"(got eviction={self.eviction!r})"
            )
        if self.offload is not None and not semantics.offload_tier:
            raise ValueError(f"the {self.profile} profile has no offload tier")
        return self
