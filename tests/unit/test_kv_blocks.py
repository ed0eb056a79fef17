"""The decode loop's block pool (lmi_trt/engines/torch/kv_blocks.py): allocation, prefix keys,
reuse, and which cached block goes first when the pool runs dry."""

from __future__ import annotations

import pytest

from lmi_trt.engines.torch.kv_blocks import BlockPool


def test_allocation_is_all_or_nothing_and_release_frees():
    pool = BlockPool(4, 2, caching=False)
    first = pool.allocate(3)
    assert first == [0, 1, 2] and pool.free == 1 and pool.used == 3
    assert pool.allocate(2) is None and pool.free == 1  # nothing taken
    pool.release(first)
    assert pool.free == 4 and sorted(pool.allocate(4)) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        BlockPool(0, 16, caching=False)


def test_keys_name_a_whole_prefix():
    pool = BlockPool(8, 2, caching=True)
    a = pool.keys([1, 2, 3, 4, 5], [], 2)
    assert len(a) == 2 and a[0] != a[1]
    assert pool.keys([1, 2, 3, 4, 9, 9], [], 2) == a  # the same first two blocks
    assert pool.keys([7, 7, 3, 4], [], 2)[1] != a[1]  # same tokens, another prefix: another key
    grown = list(a[:1])
    assert pool.keys([1, 2, 3, 4], grown, 2) == a and grown == a  # extends the list it is given
    assert BlockPool(8, 2, caching=True).keys([1, 2], [], 1) != a[:1]  # per-process roots: unpredictable


def test_cached_blocks_are_found_shared_and_evicted_least_recent_first():
    pool = BlockPool(6, 2, caching=True)
    tokens = [1, 2, 3, 4, 5, 6]
    keys = pool.keys(tokens, [], 3)
    held = pool.allocate(3)
    for block, key in zip(held, keys):
        assert pool.register(block, key)
    assert not pool.register(pool.allocate(1)[0], keys[0])  # a second block for a known key stays private
    assert pool.match(keys) == held and pool.used == 4  # held twice now, still three blocks
    pool.release(held)
    pool.release(held)  # nobody holds them: free, but still findable
    assert pool.free == 5 and pool.cached == 3 and pool.match(keys[:1]) == held[:1]
    pool.release(held[:1])
    # Blank blocks go first; then cached ones, least recently released first, and a sequence's
    # tail was released before its head (released tail first): its head outlives it.
    taken = pool.allocate(2)
    assert set(taken).isdisjoint(held) and pool.cached == 3
    assert pool.allocate(1) == [held[2]] and pool.evictions == 1
    assert pool.match(keys) == held[:2]  # the longest prefix still cached


def test_unregister_forgets_contents_never_computed():
    pool = BlockPool(2, 2, caching=True)
    key = pool.keys([1, 2], [], 1)[0]
    block = pool.allocate(1)[0]
    pool.register(block, key)
    pool.release([block])
    pool.unregister(block)
    assert pool.match([key]) == [] and pool.free == 2 and pool.cached == 0
