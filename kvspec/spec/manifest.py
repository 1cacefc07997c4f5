"""The adapter manifest format: what an implementation is and what it claims.

Every adapter folder holds a ``manifest.toml`` that validates against
``Manifest`` (prose: spec/ADAPTERS.md; schema: spec/schema/adapter_manifest.json).
The format belongs to the spec because adapters in any language write it and
the JSON-lines handshake carries its ``Capabilities``; finding and loading
manifests is the suite's job (``kvspec.conformance.manifest``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .config import PolicyName, ProfileName
from .errors import ConfigError
from .rules import RuleId
from .wire import StorageTier, Wire

Kind = Literal["python", "subprocess", "c_abi", "request"]


class Start(Wire):
    """How to start the implementation (which fields apply depends on kind)."""

    #: python: "module:factory" returning an Implementation (kind "request":
    #: returning a RequestImplementation)
    python: str | None = None
    #: a block-level adapter that also takes requests: "module:factory"
    #: returning its RequestImplementation (capability request_level)
    requests: str | None = None
    #: subprocess: argv; "{python}" is replaced by the running interpreter and
    #: "{adapter_dir}" by the manifest's folder
    command: list[str] | None = None
    #: c_abi: C sources (relative to the folder) compiled into a shared library
    sources: list[str] = []
    cflags: list[str] = ["-O2", "-std=c11", "-Wall", "-Werror"]
    #: c_abi: "process" runs the library in a child host (a crash in it is an
    #: AdapterError); "inprocess" loads it into the test process (faster)
    isolation: Literal["process", "inprocess"] = "process"
    #: seconds one call may take before the adapter is declared hung
    timeout_s: float = Field(default=10.0, gt=0)
    startup_timeout_s: float = Field(default=30.0, gt=0)
    #: largest reply, in bytes, accepted from a process-crossing adapter
    max_reply_bytes: int = Field(default=4 * 1024 * 1024, gt=0)


class Capabilities(Wire):
    block_level: bool = True
    request_level: bool = False
    partial_blocks: bool = True
    promote: bool = True
    #: reports DEREF-UNKNOWN / PROMOTE-UNKNOWN / USE-VALIDATE errors as typed errors
    typed_errors: bool = True
    offload: bool = False
    swap_in: bool = False
    tiers: list[StorageTier] = ["device"]
    event_token_ids: bool = True
    profiles: list[ProfileName] = []
    policies: list[PolicyName] = ["lru"]
    destroy: bool = False
    reset: bool = False
    max_capacity: int = 1_000_000
    #: also rejects the malformed Uses the kvbm source accepts (token lists
    #: of the wrong length, identity conflicts): the kvbm known break of
    #: USE-VALIDATE; goldens that check those rejections under kvbm need it
    strict_validation: bool = False

    def has(self, name: str) -> bool:
        """Does the implementation have capability ``name``?

        Names are the boolean fields, ``profile:NAME``, ``policy:NAME`` and
        ``tier:NAME``."""
        if ":" in name:
            kind, _, value = name.partition(":")
            named: dict[str, list[str]] = {
                "profile": list(self.profiles),
                "policy": list(self.policies),
                "tier": list(self.tiers),
            }
            return value in named.get(kind, [])
        val = getattr(self, name, None)
        if not isinstance(val, bool):
            raise ConfigError(f"unknown capability {name!r}")
        return val


class Deviation(Wire):
    """A known departure from the spec, keyed by rule id, with its reason."""

    rule: RuleId
    reason: str
    link: str | None = None
    #: only for this profile (default: any)
    profile: ProfileName | None = None


class Manifest(Wire):
    name: str
    kind: Kind
    profile: ProfileName
    description: str = ""
    start: Start = Start()
    capabilities: Capabilities = Capabilities()
    deviations: list[Deviation] = []
    #: the adapter runs named variants, picked by ``--impl=DIR/VARIANT``
    variants: bool = False

    def deviation(self, rule: str, profile: str | None = None) -> Deviation | None:
        for d in self.deviations:
            if d.rule == rule and (d.profile is None or profile is None or d.profile == profile):
                return d
        return None

    def supported_profiles(self) -> list[ProfileName]:
        return list(dict.fromkeys([self.profile, *self.capabilities.profiles]))
