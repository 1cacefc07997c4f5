"""The vllm profile's caller contract, stated on the model and kept by the driver.

``kvspec prove --profile vllm`` proves PARENT-ANCHOR at operation level under
ASSUME-PARENT-REGISTERED read as "the request holds its prefix"
(reference/smt/vllm/ops.py; with "registered" only it fails, mutant
``contract-registered-only``). ``caller_contracts.vllm_broken_contracts``
states it on ``VllmPoolModel``; the request driver the conformance checker
runs checks it before every Use and Promote it sends. Here: the statement
flags a parent that is cached without an owner and a parent not cached at
all, accepts a held one, and the checker's driver keeps the contract (and
counts its checks) over request workloads.
"""

from __future__ import annotations

import pytest

from kvspec.reference.caller_contracts import ContractBroken, vllm_broken_contracts
from kvspec.reference.requests import PoolSetup, RequestSpec, make_driver, run_to_end
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Deref, FullBlock, PartialBlock, Plh, Promote, Use


def _cfg() -> ManagerConfig:
    return ManagerConfig(profile="vllm", capacity=4, block_size=4, eviction="lru")


def _use(h: int, parent: int | None) -> Use:
    return Use(
        blocks=[FullBlock(full=h)],
        local_hashes=[h + 1000],
        plhs=[Plh(hash=h, parent=parent, position=0)],
        parent=FullBlock(full=parent) if parent is not None else None,
    )


def _ids(m: VllmPoolModel, op: object) -> list[str]:
    return [b.id for b in vllm_broken_contracts(m, op)]  # type: ignore[arg-type]


def test_a_parent_held_keeps_the_contract_one_cached_or_unknown_breaks_it() -> None:
    m = VllmPoolModel(_cfg())
    m.apply(_use(1, None))  # block 1 cached and held
    assert _ids(m, _use(2, 1)) == []
    assert _ids(m, _use(2, 7)) == ["ASSUME-PARENT-REGISTERED"]  # never cached
    m.apply(Deref(blocks=[FullBlock(full=1)]))  # cached, no owner: evictable by the Use itself
    assert _ids(m, _use(2, 1)) == ["ASSUME-PARENT-REGISTERED"]
    m.apply(Use(blocks=[PartialBlock(partial="a")]))
    promote = Promote(uuid="a", seq_hash=3, parent_hash=1, local_hash=1003, plh=Plh(hash=3, parent=1, position=1))
    assert _ids(m, promote) == ["ASSUME-PARENT-REGISTERED"]
    assert _ids(m, _use(2, None)) == []  # the root needs no holder


def _setup(capacity: int, host: int | None = None) -> PoolSetup:
    return PoolSetup(
        manager=ManagerConfig(profile="vllm", capacity=capacity, block_size=4, eviction="lru"), host_blocks=host
    )


@pytest.mark.parametrize("host", [None, 6])
def test_the_checkers_driver_keeps_the_contract_over_shared_prefixes(host: int | None) -> None:
    """Prompts sharing prefixes in a small pool (hits, recomputed last blocks,
    evictions, decode promotes, and with a host tier, onboarded prefixes):
    every Use and Promote the driver sends is checked and none breaks."""
    driver = make_driver(_setup(6, host), check_contracts=True)
    base = list(range(1, 13))
    prompts = [base, [*base[:8], 50, 51, 52], [*base, 60], list(range(100, 109)), base[:4], base]
    for i, p in enumerate(prompts):
        run_to_end(driver.steps(i, RequestSpec(prompt=p, max_tokens=6)), f"request {i}")
    assert driver.contracts_checked >= 2 * len(prompts)


def test_a_driver_that_drops_its_prefix_is_caught() -> None:
    """A misbehaving caller: the prefix it names as parent was freed before
    its second Use (the Deref below stands for a scheduler that released it)."""
    driver = make_driver(_setup(4), check_contracts=True)
    m = driver.model
    m.apply(_use(1, None))
    m.apply(Deref(blocks=[FullBlock(full=1)]))
    with pytest.raises(ContractBroken) as e:
        driver._apply(_use(2, 1))
    assert e.value.contract == "ASSUME-PARENT-REGISTERED"
    assert m.prefix_hits([2]) == 0  # nothing applied
