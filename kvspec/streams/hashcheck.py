"""Hash checks of stored blocks, wherever the stream carries what they need.

A ``HashCheck`` is the router view's ``StoredCheck`` for engine streams:

- Dynamo router events carry each block's ``block_hash`` and ``tokens_hash``
  but no tokens: the chain is checked (``block_hash`` = xxh3 of the parent's
  sequence hash and the block's ``tokens_hash``, HASH-SEQUENCE; the first
  block of a sequence is its own local hash). The chain's seed is fixed, so
  LoRA names and cache namespaces do not enter it.
- Streams with token ids (kvspec events with ``block_token_ids``, vLLM-style
  feeds): the tokens per block against ``block_size`` and the local hash of
  the tokens against ``tokens_hash`` (STORE-TOKENS-HASH), salted by the LoRA
  name and cache namespace and in Eagle windows when so configured.
- vLLM-style feeds carry tokens and a block hash but no tokens hash: the
  block hash is recomputed with the scheme of the engine that produced it,
  Dynamo's (its mocker's ``zmq_kv_events_port`` feed) or vLLM's own
  (sha256 / sha256_cbor / xxhash / xxhash_cbor, rooted in a seed,
  ``spec/hashing.py``), HASH-SEQUENCE on a mismatch. vLLM chains through the
  parent's full digest, which the event does not carry when hashes are
  ints; the checker keeps the digest it computed for each stored block, so a
  block is checked when its parent was stored (and checked) within the
  capture.
- SGLang's feed (the same shape, hashes signed int64): each page's hash is
  the first 8 bytes of sha256 over the parent page's digest and the page's
  token ids as little-endian u32 (``spec/hashing.py``, ``sglang_*``), the
  chain rooted in nothing or, for a request with a ``cache_salt``, in the
  salt's digest; SGLang's dynamo event format namespaces salted hashes once
  more, so a salted page matches either form. Pages of a LoRA adapter
  (``lora_name``) are namespaced by a key the event does not carry: they are
  counted (``unchecked_blocks``), not checked.

With ``scheme="auto"`` the scheme of a vLLM-style feed is learned from the
stream: the first blocks are tried against each candidate (Dynamo, then each
vLLM function with the seed given or vLLM's default seed) and the first that
reproduces a block is kept; if none does within ``LEARN_LIMIT`` blocks, the
hashes are not checked and a warning says so.

State (vLLM digests, Eagle blocks waiting for their next token) is kept per
stored block and dropped when the router view reports the block gone.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from kvspec.reference.router_view import Problem, TierKey
from kvspec.spec.hashing import (
    SEED,
    VLLM_DEFAULT_SEED,
    VLLM_HASH_ALGOS,
    chain,
    local_block_hash,
    local_hash_mm,
    salt_seed,
    sglang_namespace_seed,
    sglang_namespaced,
    sglang_page_digest,
    sglang_salt_prior,
    sglang_u64,
    vllm_block_hash,
    vllm_external,
    vllm_hash_fn,
    vllm_none_hash,
)
from kvspec.spec.rules import RuleId

_pack = struct.Struct("<QQ").pack
_xxh = xxhash.xxh3_64_intdigest

SCHEMES = ("auto", "dynamo", "sglang", "none", *(f"vllm-{a}" for a in VLLM_HASH_ALGOS))
#: blocks tried before giving up on learning a feed's hash scheme
LEARN_LIMIT = 64


@dataclass(slots=True)
class StoredMeta:
    """What a Stored carries beyond hashes, for the hash checks."""

    #: the tokens of all blocks, concatenated (vLLM's ``token_ids``)
    flat_tokens: Sequence[int] | None = None
    block_size: int | None = None
    lora_name: str | None = None
    #: vLLM's per-block extra keys (LoRA name, multimodal ids, cache salt)
    extra_keys: Sequence[Any] | None = None
    #: full digests when the feed carries hashes as bytes
    full_hashes: Sequence[bytes | None] | None = None
    full_parent: bytes | None = None
    #: multimodal object hashes per block (Dynamo ``mm_extra_info``)
    mm_hashes: Sequence[Sequence[int] | None] | None = None
    #: SGLang: the request's cache salt
    cache_salt: str | None = None


class _VllmScheme:
    __slots__ = ("algo", "fn", "none", "seed")

    def __init__(self, algo: str, seed: str) -> None:
        self.algo = algo
        self.seed = seed
        self.fn = vllm_hash_fn(algo)
        self.none = vllm_none_hash(algo, seed)

    def __str__(self) -> str:
        return f"vllm-{self.algo} (seed {self.seed!r})"


class HashCheck:
    def __init__(
        self,
        scheme: str = "auto",
        *,
        lora_name: str | None = None,
        cache_namespace: str | None = None,
        is_eagle: bool = False,
        vllm_seed: str | None = None,
        warn: Callable[[str], None] | None = None,
        note: Callable[[str], None] | None = None,
    ) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown hash scheme {scheme!r}; known: {', '.join(SCHEMES)}")
        self.requested = scheme
        self.lora_name = lora_name
        self.cache_namespace = cache_namespace
        self.is_eagle = is_eagle
        self.vllm_seed = vllm_seed
        self.warn = warn or (lambda msg: None)
        self.note = note or (lambda msg: None)
        #: the scheme for token-carrying feeds without tokens hashes: "dynamo",
        #: a vLLM scheme, None (not checked) or "learn"
        self.scheme: str | _VllmScheme | None
        if scheme == "auto":
            self.scheme = "learn"
        elif scheme.startswith("vllm-"):
            self.scheme = _VllmScheme(scheme[5:], vllm_seed or VLLM_DEFAULT_SEED)
        elif scheme in ("dynamo", "sglang"):
            self.scheme = scheme
        else:
            self.scheme = None
        self.chain_checks = scheme != "none"
        self._tried = 0
        self._candidates: list[str | _VllmScheme] = ["dynamo", "sglang"]
        for algo in VLLM_HASH_ALGOS:
            if vllm_seed is not None:
                self._candidates.append(_VllmScheme(algo, vllm_seed))
            elif algo.startswith("sha256"):  # vLLM's xxhash roots are random unless a seed is set
                self._candidates.append(_VllmScheme(algo, VLLM_DEFAULT_SEED))
        self._seeds: dict[str | None, int] = {}
        #: vLLM digests of stored blocks, per tier
        self.full: dict[TierKey, dict[int, bytes]] = {}
        #: Eagle: blocks whose hash needs the first token of a child
        self.pending: dict[TierKey, dict[int, tuple[list[int], int, int | None, bool]]] = {}
        self.checked_blocks = 0
        self.chain_blocks = 0
        #: SGLang pages of a LoRA namespace (not checkable from the stream)
        self.unchecked_blocks = 0

    def prefer(self, scheme: str) -> None:
        """The feed showed whose stream it is (SGLang's signed hashes): take
        that scheme at once if it was still to be learned."""
        if self.scheme == "learn":
            self.scheme = scheme
            self.note(f"block hashes are signed int64: SGLang's scheme ({scheme}), checked from here on")

    @property
    def learned(self) -> str | None:
        """The scheme in use for token-carrying feeds, once known."""
        s = self.scheme
        return None if s is None or s == "learn" else str(s)

    def describe(self) -> str:
        """What was checked, for the summary."""
        parts = []
        if self.chain_blocks:
            parts.append("Dynamo chain from tokens_hash")
        if self.learned is not None:
            parts.append(f"{self.learned} from tokens")
        if self.unchecked_blocks:
            parts.append(f"{self.unchecked_blocks} LoRA-namespaced SGLang blocks not checkable")
        if not parts:
            return "none checked" if self.requested == "none" or self.scheme is None else "nothing to check"
        return ", ".join(parts)

    def _seed(self, lora_name: str | None) -> int:
        lora = lora_name if lora_name is not None else self.lora_name
        s = self._seeds.get(lora)
        if s is None:
            s = self._seeds[lora] = salt_seed(lora, self.cache_namespace)
        return s

    # ---------------------------------------------------------- StoredCheck
    def stored(
        self,
        key: TierKey,
        parent: int | None,
        hashes: Sequence[int],
        tokens_hashes: Sequence[int] | None,
        token_ids: Sequence[Sequence[int]] | None,
        meta: Any,
    ) -> list[Problem] | None:
        if token_ids is None and meta is None:
            if tokens_hashes is None or not self.chain_checks:
                return None
            # Dynamo router events: the chain only (the hot path, inlined)
            prev = parent
            for h, th in zip(hashes, tokens_hashes, strict=True):
                if (th if prev is None else _xxh(_pack(prev, th), SEED)) != h:
                    return self._dynamo_chain(parent, hashes, tokens_hashes)
                prev = h
            self.checked_blocks += len(hashes)
            self.chain_blocks += len(hashes)
            return None
        out: list[Problem] | None = None
        m: StoredMeta | None = meta if isinstance(meta, StoredMeta) else None
        if m is not None and m.flat_tokens is not None and m.block_size:
            flat, bs = m.flat_tokens, m.block_size
            if len(flat) != bs * len(hashes):
                return [
                    (
                        RuleId.STORE_TOKENS_HASH,
                        f"Stored carries {len(flat)} token ids for {len(hashes)} block(s) of block_size {bs}",
                        {"block_size": bs, "token_ids": len(flat)},
                    )
                ]
            token_ids = [flat[i * bs : (i + 1) * bs] for i in range(len(hashes))]
        if tokens_hashes is not None and self.chain_checks:
            out = self._dynamo_chain(parent, hashes, tokens_hashes)
        if token_ids is not None:
            if self.is_eagle and parent is not None:
                out = self._resolve_eagle(key, parent, token_ids[0][0] if token_ids[0] else None, out)
            if tokens_hashes is not None:
                out = self._tokens_hashes(key, hashes, tokens_hashes, token_ids, m, out)
            elif self.scheme is not None:
                out = self._feed_hashes(key, parent, hashes, token_ids, m, out)
        return out

    def gone(self, key: TierKey, block_hashes: list[int]) -> None:
        full = self.full.get(key)
        if full:
            for h in block_hashes:
                full.pop(h, None)
        pend = self.pending.get(key)
        if pend:
            for h in block_hashes:
                pend.pop(h, None)

    def cleared(self, key: TierKey) -> None:
        self.full.pop(key, None)
        self.pending.pop(key, None)

    # ---------------------------------------------------------------- Dynamo
    def _dynamo_chain(
        self, parent: int | None, hashes: Sequence[int], tokens_hashes: Sequence[int]
    ) -> list[Problem] | None:
        out: list[Problem] | None = None
        prev = parent
        for h, th in zip(hashes, tokens_hashes, strict=True):
            want = chain(prev, th)
            if want != h:
                out = out or []
                out.append(
                    (
                        RuleId.HASH_SEQUENCE,
                        f"block_hash {h} does not follow from its parent {prev} and tokens_hash {th}",
                        {"block": h, "expected_block_hash": want},
                    )
                )
            prev = h
        self.checked_blocks += len(hashes)
        self.chain_blocks += len(hashes)
        return out

    def _local(self, toks: Sequence[int], nxt: int | None, m: StoredMeta | None, i: int) -> int | None:
        """The Dynamo local hash of one block (None: an Eagle block whose next
        token is not known yet)."""
        if self.is_eagle:
            if nxt is None:
                return None
            toks = [*toks, nxt]
        seed = self._seed(m.lora_name if m is not None else None)
        mm = m.mm_hashes[i] if m is not None and m.mm_hashes is not None and i < len(m.mm_hashes) else None
        return local_hash_mm(toks, mm, seed=seed) if mm else local_block_hash(toks, seed=seed)

    def _tokens_hashes(
        self,
        key: TierKey,
        hashes: Sequence[int],
        tokens_hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        m: StoredMeta | None,
        out: list[Problem] | None,
    ) -> list[Problem] | None:
        n = len(hashes)
        for i in range(n):
            nxt = token_ids[i + 1][0] if i + 1 < n and token_ids[i + 1] else None
            want = self._local(token_ids[i], nxt, m, i)
            if want is None:
                self.pending.setdefault(key, {})[hashes[i]] = (list(token_ids[i]), tokens_hashes[i], None, True)
                continue
            if want != tokens_hashes[i]:
                out = out or []
                out.append(
                    (
                        RuleId.STORE_TOKENS_HASH,
                        f"block {hashes[i]}: tokens_hash {tokens_hashes[i]} is not the local hash {want} of its "
                        "token ids",
                        {"block": hashes[i]},
                    )
                )
        return out

    def _resolve_eagle(self, key: TierKey, parent: int, first: int | None, out: list[Problem] | None) -> Any:
        pend = self.pending.get(key)
        if not pend or first is None or parent not in pend:
            return out
        toks, expected, prev, is_tokens_hash = pend.pop(parent)
        want = local_block_hash([*toks, first], seed=self._seed(None))
        got = want if is_tokens_hash else chain(prev, want)
        if got != expected:
            out = out or []
            rule = RuleId.STORE_TOKENS_HASH if is_tokens_hash else RuleId.HASH_SEQUENCE
            out.append((rule, f"block {parent}: its hash does not follow from its tokens (Eagle window)", {}))
        return out

    # ----------------------------------------------------- token-carrying feeds
    def _feed_hashes(
        self,
        key: TierKey,
        parent: int | None,
        hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        m: StoredMeta | None,
        out: list[Problem] | None,
    ) -> list[Problem] | None:
        if self.scheme == "learn":
            self._learn(key, parent, hashes, token_ids, m)
            if self.scheme == "learn" or self.scheme is None:
                return out
        scheme = self.scheme
        n = len(hashes)
        if scheme == "sglang":
            return self._sglang(key, parent, hashes, token_ids, m, out)
        if scheme == "dynamo":
            prev = parent
            for i in range(n):
                nxt = token_ids[i + 1][0] if i + 1 < n and token_ids[i + 1] else None
                local = self._local(token_ids[i], nxt, m, i)
                if local is None:
                    self.pending.setdefault(key, {})[hashes[i]] = (list(token_ids[i]), hashes[i], prev, False)
                elif chain(prev, local) != hashes[i]:
                    out = out or []
                    out.append(
                        (
                            RuleId.HASH_SEQUENCE,
                            f"block_hash {hashes[i]} is not Dynamo's hash of its tokens under parent {prev}",
                            {"block": hashes[i], "expected_block_hash": chain(prev, local)},
                        )
                    )
                prev = hashes[i]
            self.checked_blocks += n
            return out
        assert isinstance(scheme, _VllmScheme)
        full = self.full.setdefault(key, {})
        if parent is None:
            pfull: bytes | None = scheme.none
        else:
            pfull = m.full_parent if m is not None and m.full_parent is not None else full.get(parent)
        extra = m.extra_keys if m is not None else None
        for i in range(n):
            h = hashes[i]
            if pfull is None:  # the parent's digest is unknown (stored before the capture began)
                if m is not None and m.full_hashes is not None and m.full_hashes[i] is not None:
                    pfull = m.full_hashes[i]
                continue
            ek = extra[i] if extra is not None and i < len(extra) else None
            digest = vllm_block_hash(scheme.algo, pfull, token_ids[i], ek, fn=scheme.fn)
            carried = m.full_hashes[i] if m is not None and m.full_hashes is not None else None
            if (carried is not None and carried != digest) or vllm_external(digest) != h:
                out = out or []
                out.append(
                    (
                        RuleId.HASH_SEQUENCE,
                        f"block_hash {h} is not vLLM's {scheme.algo} hash of its tokens under parent "
                        f"{parent if i == 0 else hashes[i - 1]}",
                        {"block": h, "expected_block_hash": vllm_external(digest)},
                    )
                )
                pfull = None  # what follows chains from a digest we cannot know
                continue
            full[h] = digest
            pfull = digest
            self.checked_blocks += 1
        return out

    def _sglang(
        self,
        key: TierKey,
        parent: int | None,
        hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        m: StoredMeta | None,
        out: list[Problem] | None,
    ) -> list[Problem] | None:
        """SGLang's page hashes (see the module docstring)."""
        n = len(hashes)
        if m is not None and m.lora_name is not None:
            self.unchecked_blocks += n
            return out
        full = self.full.setdefault(key, {})
        salt = m.cache_salt if m is not None else None
        seed = sglang_namespace_seed(None, salt) if salt is not None else None
        root = sglang_salt_prior(salt) if salt is not None else b""
        # None: the parent was stored before the capture began
        prior: bytes | None = root if parent is None else full.get(parent)
        for i in range(n):
            h = hashes[i]
            if prior is None:
                continue
            digest = sglang_page_digest(prior, token_ids[i])
            plain = sglang_u64(digest)
            if plain != h and (seed is None or sglang_namespaced(plain, seed) != h):
                out = out or []
                out.append(
                    (
                        RuleId.HASH_SEQUENCE,
                        f"block_hash {h} is not SGLang's hash of its tokens under parent "
                        f"{parent if i == 0 else hashes[i - 1]}",
                        {"block": h, "expected_block_hash": plain},
                    )
                )
                prior = None  # what follows chains from a digest we cannot know
                continue
            full[h] = digest
            prior = digest
            self.checked_blocks += 1
        return out

    def _sglang_root_matches(self, h: int, toks: Sequence[int], m: StoredMeta | None) -> bool:
        salt = m.cache_salt if m is not None else None
        plain = sglang_u64(sglang_page_digest(sglang_salt_prior(salt) if salt is not None else b"", toks))
        if plain == h:
            return True
        seed = sglang_namespace_seed(None, salt) if salt is not None else None
        return seed is not None and sglang_namespaced(plain, seed) == h

    def _learn(
        self,
        key: TierKey,
        parent: int | None,
        hashes: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        m: StoredMeta | None,
    ) -> None:
        if self.is_eagle or not token_ids or not token_ids[0]:
            return
        lora = m.lora_name if m is not None else None
        for cand in self._candidates:
            if cand == "dynamo":
                toks = token_ids[0]
                ok = chain(parent, local_block_hash(toks, seed=self._seed(lora))) == hashes[0]
            elif cand == "sglang":
                ok = parent is None and self._sglang_root_matches(hashes[0], token_ids[0], m)
            elif parent is None and isinstance(cand, _VllmScheme):
                ek = m.extra_keys[0] if m is not None and m.extra_keys else None
                ok = vllm_external(vllm_block_hash(cand.algo, cand.none, token_ids[0], ek, fn=cand.fn)) == hashes[0]
            else:
                continue
            if ok:
                self.scheme = cand
                self.note(f"block hashes follow {cand}: checked from here on")
                return
        self._tried += 1
        if self._tried >= LEARN_LIMIT:
            self.scheme = None
            self.warn(
                f"block hashes not checked: none of Dynamo's, SGLang's or vLLM's hash schemes reproduces the first "
                f"{LEARN_LIMIT} blocks (name it with --hash-scheme, and vLLM's seed with --vllm-hash-seed)"
            )


__all__ = ["LEARN_LIMIT", "SCHEMES", "SEED", "HashCheck", "StoredMeta"]
