"""Fake ``tensorrt_llm.mapping.Mapping`` (1.x keywords; NVIDIA/TensorRT-LLM tensorrt_llm/mapping.py)."""

from __future__ import annotations


class Mapping:
    def __init__(
        self,
        world_size=1,
        rank=0,
        gpus_per_node=8,
        *,
        cp_size=1,
        cp_config=None,
        tp_size=1,
        pp_size=1,
        moe_cluster_size=-1,
        moe_tp_size=-1,
        moe_ep_size=-1,
        attn_tp_size=-1,
        attn_cp_size=-1,
        enable_attention_dp=False,
        enable_lm_head_tp_in_adp=False,
    ):
        if tp_size * pp_size * cp_size != world_size:
            raise ValueError(
                f"world_size must equal to tp_size * pp_size * cp_size, but got {world_size} != "
                f"{tp_size} * {pp_size} * {cp_size}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
        self.world_size = world_size
        self.rank = rank
        self.gpus_per_node = gpus_per_node
        self.cp_size = cp_size
        self.cp_config = cp_config or {}
        self.tp_size = tp_size
        self.pp_size = pp_size
        self.moe_cluster_size = 1 if moe_cluster_size == -1 else moe_cluster_size
        self.moe_tp_size = tp_size if moe_tp_size == -1 else moe_tp_size
        self.moe_ep_size = 1 if moe_ep_size == -1 else moe_ep_size
        self.attn_tp_size = tp_size if attn_tp_size == -1 else attn_tp_size
        self.attn_cp_size = cp_size if attn_cp_size == -1 else attn_cp_size
        self.enable_attention_dp = enable_attention_dp
        self.enable_lm_head_tp_in_adp = enable_lm_head_tp_in_adp

    tp_rank = property(lambda self: self.rank % self.tp_size)
    pp_rank = property(lambda self: self.rank // (self.tp_size * self.cp_size))
    cp_rank = property(lambda self: self.rank % (self.tp_size * self.cp_size) // self.tp_size)
    node_rank = property(lambda self: self.rank // self.gpus_per_node)
    local_rank = property(lambda self: self.rank % self.gpus_per_node)
    dp_size = property(lambda self: self.tp_size if self.enable_attention_dp else 1)
    moe_ep_rank = property(lambda self: self.tp_rank % self.moe_ep_size)
    moe_cluster_rank = property(lambda self: self.tp_rank % self.moe_cluster_size)
    moe_tp_rank = property(lambda self: self.tp_rank // (self.moe_ep_size * self.moe_cluster_size))

    @property
    def tp_group(self):
        first = self.pp_rank * self.tp_size * self.cp_size + self.cp_rank * self.tp_size
        return list(range(first, first + self.tp_size))

    @property
    def pp_group(self):
        step = self.tp_size * self.cp_size
        return [self.cp_rank * self.tp_size + self.tp_rank + i * step for i in range(self.pp_size)]

    @property
    def cp_group(self):
        first = self.pp_rank * self.tp_size * self.cp_size + self.tp_rank
        return [first + i * self.tp_size for i in range(self.cp_size)]

    def is_multi_node(self):
        return self.world_size > self.gpus_per_node

    def has_tp(self):
        return self.tp_size > 1

    def has_pp(self):
        return self.pp_size > 1

    def has_cp(self):
        return self.cp_size > 1

    def is_first_pp_rank(self):
        return self.pp_rank == 0

    def is_last_pp_rank(self):
        return self.pp_rank == self.pp_size - 1

    def pp_layers(self, num_layers):
        per_rank = -(-num_layers // self.pp_size)
        return list(range(self.pp_rank * per_rank, min((self.pp_rank + 1) * per_rank, num_layers)))

    def to_dict(self):
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "gpus_per_node": self.gpus_per_node,
            "cp_size": self.cp_size,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            "moe_tp_size": self.moe_tp_size,
            "moe_cluster_size": self.moe_cluster_size,
            "moe_ep_size": self.moe_ep_size,
            "attn_tp_size": self.attn_tp_size,
            "attn_cp_size": self.attn_cp_size,
            "cp_config": self.cp_config,
            "enable_attention_dp": self.enable_attention_dp,
            "enable_lm_head_tp_in_adp": self.enable_lm_head_tp_in_adp,
        }

    @classmethod
    def from_dict(cls, mapping):
        mapping = dict(mapping)
        positional = [mapping.pop(k, d) for k, d in (("world_size", 1), ("rank", 0), ("gpus_per_node", 8))]
        return cls(*positional, **mapping)

    def __eq__(self, other):
        return isinstance(other, Mapping) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return (
            f"Mapping(world_size={self.world_size}, rank={self.rank}, tp_size={self.tp_size}, pp_size={self.pp_size})"
        )
