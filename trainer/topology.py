"""Where each rank sits, its process groups, and collectives that count the bytes they send.

Topology comes from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK). With ``DYNA_SIMULATED_RANKS_PER_NODE=k`` (or ``ranks_per_node=k``) every k consecutive
ranks act as one node, so one machine can play several nodes (tests, benchmarks). Nodes must be
homogeneous and ranks contiguous per node (torchrun's layout): rank = node * R + local_rank.

Byte model. Every collective issued through a ``CountedGroup`` records the logical point-to-point
bytes this rank sends, split by whether the receiver sits on the sender's node (intra) or not
(inter); summing over ranks gives a step's traffic:
  all_to_all  the chunk for member j is sent to j (nothing for oneself);
  broadcast   the source sends the whole tensor to every other member;
  all_reduce  a reduce-scatter then an all-gather: every member sends 1/g of the tensor to every
              other member twice, 2·m·(g-1)/g bytes per member.
All-to-all and all-reduce move distinct data and cannot do with less. A broadcast can: a node-aware
tree (as NCCL may route it) crosses each node boundary once instead of once per remote receiver,
so ``CommStats.inter_node_aware`` also counts broadcasts that way: m per remote node, sent once.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

SIMULATED_RANKS_PER_NODE = "DYNA_SIMULATED_RANKS_PER_NODE"


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    num_nodes: int

    def __post_init__(self) -> None:
        if self.world_size != self.num_nodes * self.local_world_size:
            raise ValueError(f"{self}: world_size must be num_nodes * local_world_size (homogeneous nodes)")
        if self.rank != self.node * self.local_world_size + self.local_rank:
            raise ValueError(f"{self}: ranks must be contiguous per node (rank = node * R + local_rank)")

    @classmethod
    def single(cls) -> Topology:
        return cls(rank=0, world_size=1, local_rank=0, local_world_size=1, node=0, num_nodes=1)

    @classmethod
    def simulated(cls, rank: int, world_size: int, ranks_per_node: int) -> Topology:
        if ranks_per_node < 1 or world_size % ranks_per_node:
            raise ValueError(f"world_size {world_size} is not a multiple of ranks_per_node {ranks_per_node}")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=rank % ranks_per_node,
            local_world_size=ranks_per_node,
            node=rank // ranks_per_node,
            num_nodes=world_size // ranks_per_node,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, ranks_per_node: int | None = None) -> Topology:
        env = os.environ if env is None else env
        rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
        simulated = ranks_per_node or int(env.get(SIMULATED_RANKS_PER_NODE) or 0)
        if simulated:
            return cls.simulated(rank, world, simulated)
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        return cls(
            rank=rank,
            world_size=world,
            local_rank=int(env.get("LOCAL_RANK", rank % local_world)),
            local_world_size=local_world,
            node=int(env.get("GROUP_RANK", rank // local_world)),
            num_nodes=world // local_world,
        )

    def node_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def node_ranks(self, node: int) -> list[int]:
        return [node * self.local_world_size + r for r in range(self.local_world_size)]

    def peer_ranks(self, local_rank: int) -> list[int]:
        """The ranks with this local rank, one per node."""
        return [n * self.local_world_size + local_rank for n in range(self.num_nodes)]


@dataclass
class CommStats:
    """Bytes this rank sent, by purpose, to its own node (intra) and to other nodes (inter)."""

    intra: Counter = field(default_factory=Counter)
    inter: Counter = field(default_factory=Counter)
    inter_node_aware: Counter = field(default_factory=Counter)  # broadcasts crossing each node boundary once

    def reset(self) -> None:
        for counter in (self.intra, self.inter, self.inter_node_aware):
            counter.clear()

    def as_dict(self) -> dict[str, dict]:
        return {"intra": dict(self.intra), "inter": dict(self.inter), "inter_node_aware": dict(self.inter_node_aware)}


@dataclass
class CountedGroup:
    """A process group (``handle=None``: the default one) whose collectives count their bytes."""

    ranks: list[int]  # global ranks of the members, in group order
    topology: Topology
    stats: CommStats
    handle: dist.ProcessGroup | None = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        return self.ranks.index(self.topology.rank)

    def all_to_all(
        self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int], purpose: str
    ) -> torch.Tensor:
        """``send`` holds member j's chunk at position j; returns the chunks received, in member order."""
        if self.size == 1:
            return send
        recv = send.new_empty(sum(recv_sizes))
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.handle)
        for j, numel in enumerate(send_sizes):
            if j != self.index:
                self._count(purpose, self.ranks[j], numel * send.element_size())
        return recv

    def broadcast(self, tensor: torch.Tensor, src_index: int, purpose: str) -> None:
        if self.size == 1:
            return
        dist.broadcast(tensor, src=self.ranks[src_index], group=self.handle)
        if src_index == self.index:
            nbytes = tensor.numel() * tensor.element_size()
            for r in self.ranks:
                if r != self.topology.rank:
                    self._count(purpose, r, nbytes, node_aware=False)
            remote_nodes = {self.topology.node_of(r) for r in self.ranks} - {self.topology.node}
            self.stats.inter_node_aware[purpose] += nbytes * len(remote_nodes)

    def all_reduce(self, tensor: torch.Tensor, purpose: str) -> None:
        """Sum over the members, in place."""
        if self.size == 1:
            return
        dist.all_reduce(tensor, group=self.handle)
        nbytes, g = tensor.numel() * tensor.element_size(), self.size
        for r in self.ranks:
            if r != self.topology.rank:
                self._count(purpose, r, 2 * nbytes // g)

    def _count(self, purpose: str, receiver: int, nbytes: int, node_aware: bool = True) -> None:
        if self.topology.node_of(receiver) == self.topology.node:
            self.stats.intra[purpose] += nbytes
        else:
            self.stats.inter[purpose] += nbytes
            if node_aware:
                self.stats.inter_node_aware[purpose] += nbytes


@dataclass
class ProcessGroups:
    world: CountedGroup
    node: CountedGroup  # the ranks of this rank's node
    peers: CountedGroup  # the ranks with this rank's local rank, one per node


def build_groups(topology: Topology, stats: CommStats) -> ProcessGroups:
    """Collective when distributed: every rank creates every node and peer group, in the same order."""
    world = CountedGroup(list(range(topology.world_size)), topology, stats)
    if topology.world_size == 1:
        return ProcessGroups(world=world, node=world, peers=world)
    if not dist.is_initialized() or dist.get_world_size() != topology.world_size:
        raise RuntimeError(f"{topology} needs an initialized default process group of the same size")
    node = peers = None
    for n in range(topology.num_nodes):
        handle = dist.new_group(topology.node_ranks(n))
        if n == topology.node:
            node = CountedGroup(topology.node_ranks(n), topology, stats, handle)
    for r in range(topology.local_world_size):
        handle = dist.new_group(topology.peer_ranks(r))
        if r == topology.local_rank:
            peers = CountedGroup(topology.peer_ranks(r), topology, stats, handle)
    # topology.node < num_nodes and local_rank < local_world_size, so both loops matched once
    assert node is not None and peers is not None, f"{topology} names no node or peer group of its own"
    return ProcessGroups(world=world, node=node, peers=peers)
