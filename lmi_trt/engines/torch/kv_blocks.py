"""The built-in decode loop's paged KV cache, as bookkeeping: which fixed-size blocks are free, who
holds each block, and which full blocks hold a known prefix (prefix caching). Pure Python; the
cache tensors themselves live in ``llama_decoder``.

Design after vLLM's automatic prefix caching (vllm-project/vllm, docs/design/prefix_caching.md and
vllm/v1/core/block_pool.py, kv_cache_utils.py): a full block is keyed by a hash of its tokens and of
the key of the block before it (``hash_block_tokens``), so one key names a whole prefix; blocks are
reference-counted, a block nobody holds keeps its key and stays findable until it is handed out
again, least recently released first, and a sequence's blocks are released tail first, so that its
shared head outlives its private tail. SGLang's radix tree (sgl-project/sglang,
python/sglang/srt/mem_cache/radix_cache.py) reaches the same reuse token by token; block keys keep
the lookup a dictionary probe per block. Two differences from vLLM: blocks that never held a cached
prefix are handed out before evicting a cached one, and the first block's parent key is a per-process
random value (vLLM's default NONE_HASH is ``os.urandom`` as well), so keys cannot be predicted from
outside.
"""

from __future__ import annotations

import hashlib
import secrets
from array import array
from collections import OrderedDict
from collections.abc import Sequence


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` positions; with ``caching``, full blocks can be
    registered under their prefix key and found again after their holders released them."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self._root = secrets.token_bytes(16)
        self._refs = [0] * num_blocks
        self._key_of: list[bytes | None] = [None] * num_blocks
        self._by_key: dict[bytes, int] = {}
        self._blank = list(range(num_blocks - 1, -1, -1))  # free, no key; pop() hands out the lowest
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free with a key, least recently released first
        self.evictions = 0

    @property
    def free(self) -> int:
        """Blocks an allocation can take (evicting cached ones if it must)."""
        return len(self._blank) + len(self._evictable)

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    @property
    def cached(self) -> int:
        """Blocks findable by key (held or not)."""
        return len(self._by_key)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` blocks, each held once, or None (and nothing taken) when fewer are free."""
        if n > self.free:
            return None
        out = []
        for _ in range(n):
            if self._blank:
                block = self._blank.pop()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._by_key[self._key_of[block]]
                self._key_of[block] = None
                self.evictions += 1
            self._refs[block] = 1
            out.append(block)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one hold on each block, tail first: a block nobody holds becomes free, and stays
        findable by its key until it is evicted."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._key_of[block] is not None:
                    self._evictable[block] = None
                else:
                    self._blank.append(block)

    def keys(self, tokens: Sequence[int], parents: list[bytes], upto: int, salt: bytes = b"") -> list[bytes]:
        """``parents`` (the keys of the first blocks of ``tokens``) extended to the first ``upto``
        full blocks; each key hashes the key before it and the block's tokens. ``salt`` starts the chain
        elsewhere for what computes other keys and values from the same tokens (a LoRA adapter)."""
        size = self.block_size
        for i in range(len(parents), upto):
            parent = parents[-1] if parents else self._root + salt
            block = array("q", tokens[i * size : (i + 1) * size]).tobytes()
            parents.append(hashlib.sha256(parent + block).digest())
        return parents

    def match(self, keys: Sequence[bytes]) -> list[int]:
        """The blocks of the longest cached prefix of ``keys``, each now held once more."""
        out = []
        for key in keys:
            block = self._by_key.get(key)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            out.append(block)
        return out

    def register(self, block: int, key: bytes) -> bool:
        """Make a held, full block findable under ``key``; False when that key already names
        another block (two sequences computed the same prefix at once: the first one stays)."""
        if key in self._by_key or self._key_of[block] is not None:
            return False
        self._by_key[key] = block
        self._key_of[block] = key
        return True

    def unregister(self, block: int) -> None:
        """Forget ``block``'s key (its contents were never computed: the step failed)."""
        key = self._key_of[block]
        if key is not None:
            del self._by_key[key]
            self._key_of[block] = None
            if self._refs[block] == 0:
                del self._evictable[block]
                self._blank.append(block)
