"""The adapter manifest format: what an implementation is and what it claims.

Every adapter folder holds a ``manifest.toml`` that validates against
``Manifest`` (prose: spec/ADAPTERS.md; schema: spec/schema/adapter_manifest.json).
The format belongs to the spec because adapters in any language write it and
the JSON-lines handshake carries its ``Capabilities``; finding and loading
manifests is the suite's job (``kvspec.conformance.run.manifest``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from kvspec.spec.config import SEMANTICS, PolicyName, ProfileName
from kvspec.spec.deviations import Deviation, Site, scope_problems
from kvspec.spec.errors import ConfigError
from kvspec.spec.registry import RADIX, RADIX_FAMILY, VLLM_NAME
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import StorageTier, Wire

Kind = Literal["python", "subprocess", "c_abi", "request"]

#: what the suite opens an adapter for: one of the profile families of the registry
#: (``spec/registry.py``: ``block``, ``manager``, ``radix``, ``generic``) or ``request`` (whole requests
#: of an engine, checked against the vllm or the radix profile)
AdapterFamily = Literal["block", "manager", "radix", "generic", "request"]

#: the per-family keys of ``[start]`` written before ``python`` named the one factory of every family,
#: kept as accepted (deprecated) aliases: a family's key, when written, names that family's factory;
#: otherwise ``start.python`` does (spec/ADAPTERS.md, "[start]")
FAMILY_KEYS: dict[AdapterFamily, str] = {"request": "requests", "manager": "managers", RADIX_FAMILY: "radix"}


class Start(Wire):
    """How to start the implementation (which fields apply depends on kind)."""

    #: kinds python and request: "module:factory", the one factory of every
    #: family the adapter runs; called with the family's configuration, it
    #: returns that family's implementation (``factory_for``)
    python: str | None = None
    #: deprecated alias: "module:factory" of the request level only
    #: (a RequestImplementation; capability request_level)
    requests: str | None = None
    #: deprecated alias: "module:factory" of the allocator-level profiles
    #: (paged, session) only, returning a ManagerImplementation
    managers: str | None = None
    #: deprecated alias: "module:factory" of the radix profile only,
    #: returning a RadixImplementation
    radix: str | None = None
    #: subprocess: argv; "{python}" is replaced by the running interpreter and
    #: "{adapter_dir}" by the manifest's folder
    command: list[str] | None = None
    #: c_abi: C sources (relative to the folder) compiled into a shared library
    sources: list[str] = []
    cflags: list[str] = ["-O2", "-std=c11", "-Wall", "-Werror"]
    #: subprocess: argv appended to ``command`` when a variant is selected
    #: (``--impl=DIR/NAME``); "{variant}" is replaced by the variant's name
    variant_args: list[str] = ["--variant", "{variant}"]
    #: c_abi: flags added to ``cflags`` when a variant is selected ("{variant}"
    #: as above), so each variant is its own cached build
    variant_cflags: list[str] = ["-DKVSPEC_VARIANT_{variant}=1"]
    #: c_abi: "process" runs the library in a child host (a crash in it is an
    #: AdapterError); "inprocess" loads it into the test process (faster)
    isolation: Literal["process", "inprocess"] = "process"

    def factory_for(self, family: AdapterFamily, kind: Kind) -> str | None:
        """The ``module:factory`` that opens ``family`` in process (None: none is named, and a
        process-crossing kind reaches the family through its transport, if it has one).

        ``python`` is the one factory of an in-process adapter, whatever the family: it is called
        with the family's configuration (``ManagerConfig``, ``PagedConfig`` / ``SessionConfig``,
        ``RadixConfig``, or a ``PoolSetup`` for the request level) and returns that family's
        implementation. The per-family keys of old (``requests``, ``managers``, ``radix``) are
        accepted aliases: when written, each names its family's factory instead. A ``request``
        adapter takes requests only; a process-crossing kind's families go through its transport
        unless an alias names a factory."""
        if family == "block":
            return self.python if kind == "python" else None
        key = FAMILY_KEYS.get(family)
        alias: str | None = getattr(self, key) if key else None
        if alias:
            return alias
        if kind == "python" or (kind == "request" and family == "request"):
            return self.python
        return None

    #: seconds one call may take before the adapter is declared hung
    timeout_s: float = Field(default=10.0, gt=0)
    startup_timeout_s: float = Field(default=30.0, gt=0)
    #: largest reply, in bytes, accepted from a process-crossing adapter
    max_reply_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    #: subprocess: the newest JSON-lines protocol version the child reads
    #: (PROTOCOL.md section 13). Left out, the child was written for versions
    #: 1-5 and gets exactly their hellos (it may refuse fields it does not
    #: know). ``6``: every hello names its session's family and offers 6
    #: together with the older version of that kind of session.
    protocol: Literal[6] | None = None


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
    #: semantics options (spec/config.py ``SEMANTICS``): option name -> the
    #: values the implementation supports. An option left out supports only
    #: the value kvspec had before the option existed (its ``legacy`` value).
    semantics: dict[str, list[str]] = {}
    #: how many workers of one process (sharing G3/G4) a session can drive:
    #: operations then carry a worker id (PROTOCOL.md version 5; ADAPTERS.md)
    workers: Annotated[int, Field(ge=1, le=64)] = 1

    @field_validator("semantics")
    @classmethod
    def _known_options(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, values in v.items():
            opt = SEMANTICS.get(name)
            if opt is None:
                raise ValueError(f"unknown semantics option {name!r}; known: {sorted(SEMANTICS)}")
            bad = [x for x in values if x not in opt.values]
            if bad or not values:
                raise ValueError(f"semantics option {name!r} takes values from {list(opt.values)}, got {values}")
        return v

    def supports(self, option: str, value: str) -> bool:
        """Does the implementation support ``value`` of semantics option ``option``?"""
        opt = SEMANTICS.get(option)
        if opt is None:
            raise ConfigError(f"unknown semantics option {option!r}; known: {sorted(SEMANTICS)}")
        return value in self.semantics.get(option, [opt.legacy])

    def supported(self, option: str) -> list[str]:
        """The values of ``option`` the implementation supports (default first when supported)."""
        opt = SEMANTICS[option]
        vals = self.semantics.get(option, [opt.legacy])
        return sorted(vals, key=lambda v: v != opt.default)

    def has(self, name: str) -> bool:
        """Does the implementation have capability ``name``?

        Names are the boolean fields, ``profile:NAME``, ``policy:NAME``,
        ``tier:NAME`` and ``workers`` (several workers in one process)."""
        if name == "workers":
            return self.workers > 1
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


#: capabilities that only do something under a profile or another capability:
#: (capability, what it needs, why)
_NEEDS: tuple[tuple[str, str, str], ...] = (
    ("destroy", "profile:legacy", "Destroy is an operation of the legacy profile only"),
    ("reset", "profile:vllm", "the prefix-cache reset is an operation of the vllm profile only"),
    ("swap_in", "offload", "swap-in brings blocks back from the offload tier"),
)


def idle_capabilities(caps: dict[str, Any], profiles: Sequence[str]) -> list[str]:
    """Declared capabilities that would do nothing (no test could ever use
    them), each with what to write instead: a manifest that claims one would
    read as checked when it never is."""
    out: list[str] = []
    for name, need, why in _NEEDS:
        if not caps.get(name):
            continue
        kind, _, value = need.partition(":")
        if (value in profiles) if kind == "profile" else bool(caps.get(kind)):
            continue
        fix = f"add {value!r} to the profiles" if kind == "profile" else f"declare {kind} = true"
        out.append(f"capability {name} = true does nothing: {why}; {fix} or remove it")
    return out


def scope_problems_of(deviations: list[Deviation], profiles: Sequence[str], block_level: bool) -> list[str]:
    """Every reason one of ``deviations`` could never match (``scope_problems``)."""
    return [p for d in deviations for p in scope_problems(d, profiles=profiles, block_level=block_level)]


#: a variant name: snake_case, so that it is a path segment, an argv word
#: and (after KVSPEC_VARIANT_) a C identifier
VARIANT_NAME = re.compile(r"[a-z][a-z0-9_]*")


class Variant(Wire):
    """One named variant of an adapter (``[[variants]]``), selected with
    ``--impl=DIR/NAME``. Two kinds:

    - ``mutant`` (the default): a deliberately broken twin of the
      implementation whose one bug breaks ``rule``. ``kvspec mutants
      --impl=DIR`` runs the suite against each and expects every one to be
      killed.
    - ``backend``: another real configuration of the same implementation
      (an engine with several selectable backends, such as Dynamo's mocker)
      checked as an implementation in its own right: it may run another
      ``profile``, carry its own ``capabilities`` (merged over the adapter's)
      and its own ``deviations`` (replacing the adapter's, because each
      backend departs in its own ways). It has no ``rule`` and is never a
      mutant."""

    name: str
    kind: Literal["mutant", "backend"] = "mutant"
    #: mutant: the rule its bug breaks (what a kill is expected to name)
    rule: RuleId | None = None
    description: str
    #: mutant: the profiles the bug lives in (default: every profile the
    #: adapter runs); under any other profile the variant must behave like
    #: the adapter itself
    profiles: list[ProfileName] = []
    #: mutant: capabilities a configuration needs for the bug to be reachable
    #: (names as ``Capabilities.has`` takes them)
    needs: list[str] = []
    #: backend: the profile it runs instead of the adapter's
    profile: ProfileName | None = None
    #: backend: capability fields that differ from the adapter's
    capabilities: dict[str, Any] = {}
    #: backend: its declared deviations (None: the adapter's)
    deviations: list[Deviation] | None = None

    @field_validator("name")
    @classmethod
    def _name_is_snake_case(cls, v: str) -> str:
        if not VARIANT_NAME.fullmatch(v):
            raise ValueError(f"variant name {v!r} must be snake_case ([a-z][a-z0-9_]*)")
        return v

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> Variant:
        if self.kind == "mutant":
            if self.rule is None:
                raise ValueError(f"variant {self.name}: a mutant names the rule its bug breaks (rule = ...)")
            extra = [f for f in ("profile", "capabilities", "deviations") if getattr(self, f) not in (None, {})]
            if extra:
                raise ValueError(f"variant {self.name}: {', '.join(extra)} belong to kind = 'backend' variants")
        else:
            wrong = [f for f in ("rule", "profiles", "needs") if getattr(self, f) not in (None, [])]
            if wrong:
                raise ValueError(
                    f"variant {self.name}: a backend variant is not a mutant ({', '.join(wrong)} not allowed)"
                )
        return self


class Manifest(Wire):
    name: str
    kind: Kind
    profile: ProfileName
    description: str = ""
    start: Start = Start()
    capabilities: Capabilities = Capabilities()
    deviations: list[Deviation] = []
    #: the named variants the folder runs, each picked by ``--impl=DIR/NAME``
    variants: list[Variant] = []
    #: the selected variant: set by the loader from ``--impl=DIR/NAME``
    #: (``kvspec.conformance.run.manifest.load_manifest``), never written in a
    #: manifest file; ``None`` runs the adapter itself
    variant: str | None = None

    @field_validator("variants", mode="before")
    @classmethod
    def _variants_are_tables(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(
                "`variants = true` is no longer accepted: declare each variant as a [[variants]] table "
                "(name, rule, description, optional profiles and needs); see spec/ADAPTERS.md"
            )
        return v

    @model_validator(mode="after")
    def _variants_are_consistent(self) -> Manifest:
        names = [v.name for v in self.variants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variant(s) declared twice: {', '.join(dup)}")
        supported = set(self.supported_profiles())
        caps = self.capabilities
        for v in self.variants:
            if v.kind == "backend":
                try:
                    Capabilities.model_validate({**caps.model_dump(), **v.capabilities})
                except ValueError as e:
                    raise ValueError(f"variant {v.name}: capabilities: {e}") from None
                continue
            outside = [p for p in v.profiles if p not in supported]
            if outside:
                raise ValueError(f"variant {v.name}: profile(s) {', '.join(outside)} not run by this adapter")
            for need in v.needs:
                try:
                    caps.has(need)
                except ConfigError as e:
                    raise ValueError(f"variant {v.name}: {e}") from None
        if self.variant is not None and self.variant not in names:
            known = ", ".join(names) or "none declared"
            raise ValueError(f"unknown variant {self.variant!r} of {self.name} (known: {known})")
        self._scopes_match_something()
        self._workers_fit()
        if self.start.protocol is not None and self.kind != "subprocess":
            raise ValueError(
                f"start.protocol = {self.start.protocol} does nothing: it is the JSON-lines version of a "
                f"kind 'subprocess' child, and kind {self.kind!r} has no hello; remove it"
            )
        return self

    def _workers_fit(self) -> None:
        """``workers = N`` (N > 1) only does something for the shared lower
        tiers, and only a transport that carries a worker id can serve it."""
        caps = self.capabilities
        if caps.workers == 1:
            return
        if self.kind == "c_abi":
            raise ValueError(
                f"workers = {caps.workers}: the C ABI (spec/kvspec_abi.h) has no worker id and serves one "
                "worker; declare workers = 1 or serve the port over JSON lines (PROTOCOL.md version 5)"
            )
        if self.kind == "request":
            raise ValueError(f"workers = {caps.workers}: a request-level adapter takes no block operations")
        if not caps.offload or not ({"disk", "external"} & set(caps.tiers)):
            raise ValueError(
                f"capability workers = {caps.workers} does nothing: several workers share only G3/G4; "
                "declare offload = true and tier disk or external, or remove it"
            )

    def _scopes_match_something(self) -> None:
        """Every declared deviation (the adapter's and each backend's) can
        match a failure of the profiles and operations it runs: a scope that
        matches nothing is refused here, at load time, with what to write."""
        problems = idle_capabilities(self.capabilities.model_dump(), self.supported_profiles())
        problems += scope_problems_of(self.deviations, self.supported_profiles(), self.capabilities.block_level)
        for v in self.variants:
            if v.kind != "backend":
                continue
            profile = v.profile or self.profile
            caps = {**self.capabilities.model_dump(), **v.capabilities}
            profiles = list(dict.fromkeys([profile, *caps.get("profiles", [])]))
            devs = self.deviations if v.deviations is None else v.deviations
            # a capability the variant sets itself must do something under it;
            # one inherited from the adapter is the adapter's claim
            own = {k: caps[k] for k in v.capabilities}
            problems += [
                f"variant {v.name}: {p}"
                for p in idle_capabilities({**own, "offload": caps.get("offload")}, profiles)
                + scope_problems_of(devs, profiles, bool(caps.get("block_level", True)))
            ]
        if problems:
            raise ValueError("; ".join(problems))

    def find_variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    def mutants(self) -> list[Variant]:
        """The variants ``kvspec mutants`` runs (not the backends)."""
        return [v for v in self.variants if v.kind == "mutant"]

    def variant_profiles(self, v: Variant) -> list[ProfileName]:
        """The profiles variant ``v``'s bug lives in."""
        return list(v.profiles) or self.supported_profiles()

    def with_variant(self, name: str | None) -> Manifest:
        """This manifest with variant ``name`` selected: ``start.command``
        and ``start.cflags`` get the variant's ``variant_args`` /
        ``variant_cflags`` (so a child process or a C build is told the
        variant explicitly); a python factory gets ``variant=name``. Raises
        ConfigError for a name the manifest does not declare."""
        if name is None:
            return self
        if self.find_variant(name) is None:
            known = ", ".join(v.name for v in self.variants) or "none declared"
            raise ConfigError(f"adapter {self.name}: unknown variant {name!r} (known: {known})")
        st = self.start
        update: dict[str, Any] = {}
        if st.command is not None:
            update["command"] = [*st.command, *(a.replace("{variant}", name) for a in st.variant_args)]
        if self.kind == "c_abi":
            update["cflags"] = [*st.cflags, *(f.replace("{variant}", name) for f in st.variant_cflags)]
        selected: dict[str, Any] = {"variant": name, "start": st.model_copy(update=update)}
        v = self.find_variant(name)
        if v is not None and v.kind == "backend":
            if v.profile is not None:
                selected["profile"] = v.profile
            if v.capabilities:
                selected["capabilities"] = Capabilities.model_validate(
                    {**self.capabilities.model_dump(), **v.capabilities}
                )
            if v.deviations is not None:
                selected["deviations"] = list(v.deviations)
        return self.model_copy(update=selected)

    def deviation_for(self, site: Site) -> Deviation | None:
        """The declared deviation that covers a failure at ``site`` (None: the
        failure is not declared, whatever other scopes its rule has)."""
        return next((d for d in self.deviations if d.covers(site)), None)

    def request_profile(self) -> ProfileName:
        """The profile request workloads are checked against: ``radix`` for an
        adapter whose own profile is ``radix``, else ``vllm``."""
        return RADIX if self.profile == RADIX else VLLM_NAME

    def supported_profiles(self) -> list[ProfileName]:
        return list(dict.fromkeys([self.profile, *self.capabilities.profiles]))
