"""Muon for the hidden 2-D matrices, AdamW for the rest, with the Muon work sharded across ranks.

The math is torch's: the owner of a matrix steps it with a ``torch.optim.Muon`` over the matrices it
owns, and every rank steps the other parameters with one ``torch.optim.AdamW``, both on the mean
gradient over all ranks.

Which parameters: 2-D parameters go to Muon, except embedding tables (rows are looked up, not a
linear map to orthogonalize) and names matching ``MuonConfig.adamw_params`` (fnmatch patterns; the
output head, typically). Biases, norms, embeddings and conv kernels go to AdamW.

The optimizer owns the gradient reduction, so the strategies differ in exactly the traffic they
cause. Do not wrap the model in DDP (the gradients would be reduced twice); gradient accumulation
is plain repeated backward() before one step(). The constructor broadcasts rank 0's optimized
parameters to every rank, as DDP does (buffers such as BatchNorm statistics are not synchronized).

  AdamW parameters, every mode: one flat buffer averaged by a hierarchical all-reduce: reduce-scatter
    inside the node (all-to-all, local sum), all-reduce of each chunk across nodes among the ranks
    of the same local rank, gather inside the node.
  Muon matrices, "global": whole matrices get owners among all W ranks (largest first to the least
    loaded, deterministic). One all-to-all over all ranks sends each gradient to its owner, which
    sums them in rank order and steps; each owner broadcasts its updated matrices to all ranks.
  Muon matrices, "node_local": the same assignment among the R ranks of a node, on every node. An
    all-to-all inside the node sends each gradient to its local owner; the owners' partial sums are
    all-reduced across nodes among same-local-rank peers (the only inter-node traffic); every node
    steps the same matrices identically; owners broadcast inside the node.
  "auto": node_local when num_nodes >= node_local_min_nodes, else global. One process: plain Muon + AdamW.

Momentum buffers live on a matrix's owners only. ``state_dict()`` is a collective (every rank calls
it): it gathers the buffers, so it has torch's layout (Muon matrices first, then the AdamW
parameters) and the same content whatever the mode and world size; ``load_state_dict`` keeps what
this rank owns. In distributed modes a gradient missing on a rank counts as zeros (every rank must
send every parameter). After step() a Muon matrix's ``.grad`` is the mean gradient on its owners only.
Clip with ``max_grad_norm``, not clip_grad_norm_ before step(): there the gradients are this rank's.
Bytes sent are counted in ``comm_stats`` (model in trainer/topology.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.topology import (
    CommStats,
    CountedGroup,
    ProcessGroups,
    Topology,
    build_groups,
)

MODES = ("auto", "global", "node_local")


@dataclass(frozen=True)
class MuonConfig:
    """Hyperparameters (torch's defaults) and the sharding strategy."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    adjust_lr_fn: str | None = None
    adamw_lr: float = 1e-3
    adamw_betas: tuple[float, float] = (0.9, 0.999)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 1e-2
    adamw_params: tuple[str, ...] = ()  # fnmatch patterns of 2-D parameters kept on AdamW
    max_grad_norm: float | None = None  # clip the mean gradient's total norm, as clip_grad_norm_ would
    mode: str = "auto"
    # With one node both strategies are the same. From two nodes on, global sharding sends every rank's
    # gradients and every updated matrix across the fabric (about R times node-local's inter-node bytes)
    # only to spread the Newton-Schulz work over N times more ranks; with inter-node links ~10x slower than
    # NVLink the bytes cost more than that arithmetic. Raise it where the fabric is fast for the matrices.
    node_local_min_nodes: int = 2


def split_params(
    model: nn.Module, adamw_params: tuple[str, ...] = ()
) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """(Muon, AdamW) lists of (name, parameter) for the trainable parameters of ``model``."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
    muon: list[tuple[str, torch.Tensor]] = []
    adamw: list[tuple[str, torch.Tensor]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        hidden_matrix = p.ndim == 2 and id(p) not in tables and not any(fnmatch(name, pat) for pat in adamw_params)
        (muon if hidden_matrix else adamw).append((name, p))
    return muon, adamw


def assign_owners(numels: list[int], owners: int) -> list[int]:
    """Owner index per matrix: largest first, each to the least-loaded owner (lowest index on ties)."""
    load, owner_of = [0] * owners, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        j = min(range(owners), key=lambda j: (load[j], j))
        owner_of[i], load[j] = j, load[j] + numels[i]
    return owner_of


def choose_mode(mode: str, num_nodes: int, world_size: int, node_local_min_nodes: int = 2) -> str:
    """Resolve ``mode`` to "single", "global" or "node_local" for this topology."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if world_size == 1:
        return "single"
    if mode == "auto":
        return "node_local" if num_nodes >= node_local_min_nodes else "global"
    return mode


@dataclass
class ShardPlan:
    """Which member of ``owners`` steps each Muon matrix."""

    owners: CountedGroup  # all ranks (global) or the node's ranks (node_local)
    peers: CountedGroup | None  # node_local: sums the owners' partial gradients across nodes
    owner_of: list[int]
    numels: list[int]

    def owned_by(self, j: int) -> list[int]:
        return [i for i, o in enumerate(self.owner_of) if o == j]

    def shard_numel(self, j: int) -> int:
        return sum(self.numels[i] for i in self.owned_by(j))

    @property
    def mine(self) -> list[int]:
        return self.owned_by(self.owners.index)


class DistributedMuon(torch.optim.Optimizer):
    """Muon + AdamW over ``model``'s trainable parameters: param_groups are [Muon's, AdamW's].

    Construct it on every rank at the same time (it creates process groups). ``topology``: default
    from torchrun's environment when a process group is initialized, else a single process.
    """

    def __init__(
        self,
        model: nn.Module,
        config: MuonConfig = MuonConfig(),
        topology: Topology | None = None,
        groups: ProcessGroups | None = None,
    ):
        if topology is None:
            topology = Topology.from_env() if dist.is_available() and dist.is_initialized() else Topology.single()
        self.config, self.topology = config, topology
        self.mode = choose_mode(config.mode, topology.num_nodes, topology.world_size, config.node_local_min_nodes)
        self.comm_stats = groups.world.stats if groups else CommStats()
        self.groups = groups or build_groups(topology, self.comm_stats)
        self.grad_norm: float | None = None  # total norm of the last step's mean gradient, when clipping

        muon, adamw = split_params(model, config.adamw_params)
        self.muon_param_names, self.adamw_param_names = [n for n, _ in muon], [n for n, _ in adamw]
        self._muon_params, self._adamw_params = [p for _, p in muon], [p for _, p in adamw]
        for kind, params in (("Muon", self._muon_params), ("AdamW", self._adamw_params)):
            if len({(p.dtype, p.device) for p in params}) > 1:
                raise ValueError(f"the {kind} parameters must share one dtype and device")
        muon_kwargs: dict[str, Any] = {  # torch.optim.Muon's keyword arguments, of several types
            "lr": config.lr,
            "weight_decay": config.weight_decay,
            "momentum": config.momentum,
            "nesterov": config.nesterov,
            "ns_steps": config.ns_steps,
            "adjust_lr_fn": config.adjust_lr_fn,
        }
        param_groups = []
        if muon:  # a Muon over all matrices gives the group its full set of keys (and checks they are 2-D)
            param_groups.append({**torch.optim.Muon(self._muon_params, **muon_kwargs).param_groups[0], "kind": "muon"})
        self._adamw = None
        if adamw:
            self._adamw = torch.optim.AdamW(
                self._adamw_params,
                lr=config.adamw_lr,
                betas=config.adamw_betas,
                eps=config.adamw_eps,
                weight_decay=config.adamw_weight_decay,
            )
            param_groups.append(self._adamw.param_groups[0])  # shared: a scheduler's lr reaches AdamW
            param_groups[-1]["kind"] = "adamw"
        super().__init__(param_groups, defaults={})

        self._plan = self._make_plan()
        mine = [self._muon_params[i] for i in self._plan.mine]
        self._muon = torch.optim.Muon(mine, **muon_kwargs) if mine else None
        self._link_inner_optimizers()
        if topology.world_size > 1:
            self._broadcast_from_rank0(self._muon_params)
            self._broadcast_from_rank0(self._adamw_params)

    @property
    def owned_param_names(self) -> list[str]:
        """The Muon matrices this rank steps (and keeps momentum for)."""
        return [self.muon_param_names[i] for i in self._plan.mine]

    def _make_plan(self) -> ShardPlan:
        numels = [p.numel() for p in self._muon_params]
        if self.mode == "node_local":
            owners, peers = self.groups.node, self.groups.peers
        else:
            owners, peers = self.groups.world, None
        return ShardPlan(owners, peers, assign_owners(numels, owners.size), numels)

    def _link_inner_optimizers(self) -> None:
        """The inner optimizers keep their state in ours and AdamW reads our group's hyperparameters."""
        if self._adamw is not None:
            self._adamw.__setstate__({"state": self.state, "param_groups": [self.param_groups[-1]]})
        if self._muon is not None:
            self._muon.state = self.state

    # -- the step ----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.topology.world_size > 1:
            if self._adamw_params:
                self._mean_adamw_grads()
            if self._muon_params:
                self._mean_muon_grads_on_owners()
        if self.config.max_grad_norm is not None:
            self._clip_grads(self.config.max_grad_norm)
        if self._adamw is not None:
            self._adamw.step()
        if self._muon is not None:
            self._muon.param_groups[0].update({k: v for k, v in self.param_groups[0].items() if k != "params"})
            self._muon.step()
        if self.topology.world_size > 1 and self._muon_params:
            self._share_updated_matrices()
        return loss

    def _mean_adamw_grads(self) -> None:
        flat = torch.cat([_grad_or_zeros(p).reshape(-1) for p in self._adamw_params])
        node, peers, purpose = self.groups.node, self.groups.peers, "adamw_grad_reduce"
        bounds = [flat.numel() * j // node.size for j in range(node.size + 1)]
        sizes = [bounds[j + 1] - bounds[j] for j in range(node.size)]
        mine = _sum_rows(node.all_to_all(flat, sizes, [sizes[node.index]] * node.size, purpose), node.size)
        peers.all_reduce(mine, purpose)
        mine /= self.topology.world_size
        mean = torch.empty_like(flat)
        for j in range(node.size):
            piece = mean[bounds[j] : bounds[j + 1]]
            if j == node.index:
                piece.copy_(mine)
            if sizes[j]:
                node.broadcast(piece, j, purpose)
        _set_grads(self._adamw_params, mean)

    def _mean_muon_grads_on_owners(self) -> None:
        plan, purpose = self._plan, "muon_grad_reduce"
        g = plan.owners
        order = [i for j in range(g.size) for i in plan.owned_by(j)]
        send = torch.cat([_grad_or_zeros(self._muon_params[i]).reshape(-1) for i in order])
        sizes = [plan.shard_numel(j) for j in range(g.size)]
        received = g.all_to_all(send, sizes, [sizes[g.index]] * g.size, purpose)
        if not sizes[g.index]:
            return
        mine = _sum_rows(received, g.size)
        if plan.peers is not None:
            plan.peers.all_reduce(mine, purpose)
        mine /= self.topology.world_size
        _set_grads([self._muon_params[i] for i in plan.mine], mine)

    def _clip_grads(self, max_norm: float) -> None:
        """torch.nn.utils.clip_grad_norm_ over the mean gradient, whose Muon part is spread over the owners."""
        owned = [p.grad for p in (self._muon_params[i] for i in self._plan.mine) if p.grad is not None]
        replicated = [p.grad for p in self._adamw_params if p.grad is not None]
        sq = [torch.linalg.vector_norm(t).square() for t in owned]
        owned_sq = torch.stack(sq).sum() if sq else torch.zeros((), device=self._device())
        self._plan.owners.all_reduce(owned_sq, "grad_norm")
        norms = [torch.linalg.vector_norm(t) for t in replicated]
        total = (owned_sq + torch.stack(norms).square().sum() if norms else owned_sq).sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for t in owned + replicated:
            t.mul_(coef)
        self.grad_norm = total.item()

    def _share_updated_matrices(self) -> None:
        plan = self._plan
        g = plan.owners
        for j in range(g.size):
            owned = [self._muon_params[i] for i in plan.owned_by(j)]
            if not owned:
                continue
            if j == g.index:
                g.broadcast(torch.cat([p.reshape(-1) for p in owned]), j, "muon_update_gather")
            else:
                flat = owned[0].new_empty(plan.shard_numel(j))
                g.broadcast(flat, j, "muon_update_gather")
                _copy_into(owned, flat)

    def _broadcast_from_rank0(self, params: list[torch.Tensor]) -> None:
        if params:
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            self.groups.world.broadcast(flat, 0, "setup")
            _copy_into(params, flat)

    def _device(self) -> torch.device:
        return (self._muon_params or self._adamw_params)[0].device

    # -- checkpoints -------------------------------------------------------------------------

    def state_dict(self):
        """Collective: every rank must call it. The same content whatever the mode and world size."""
        gathered = self._gather_momentum() if self.topology.world_size > 1 else {}
        for p, buf in gathered.items():
            self.state[p] = {"momentum_buffer": buf}
        try:
            sd = super().state_dict()
        finally:
            for p in gathered:
                del self.state[p]
        sd["state"] = dict(sorted(sd["state"].items()))
        return sd

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        mine = set(self._plan.mine)
        for i, p in enumerate(self._muon_params):
            if i not in mine:
                self.state.pop(p, None)
        self._link_inner_optimizers()

    def _gather_momentum(self) -> dict[torch.Tensor, torch.Tensor]:
        """The momentum buffers of the matrices other members of the owners' group own."""
        plan, purpose, gathered = self._plan, "state_dict", {}
        g = plan.owners
        for j in range(g.size):
            owned = [self._muon_params[i] for i in plan.owned_by(j)]
            if not owned:
                continue
            has = [int("momentum_buffer" in self.state.get(p, {})) for p in owned]
            flags = torch.tensor(has, dtype=torch.uint8, device=self._device())
            g.broadcast(flags, j, purpose)
            present = [p for p, f in zip(owned, flags.tolist()) if f]
            if not present:
                continue
            if j == g.index:
                g.broadcast(torch.cat([self.state[p]["momentum_buffer"].reshape(-1) for p in present]), j, purpose)
            else:
                flat = present[0].new_empty(sum(p.numel() for p in present))
                g.broadcast(flat, j, purpose)
                offset = 0
                for p in present:
                    gathered[p] = flat[offset : offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
        return gathered


def _grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _sum_rows(received: torch.Tensor, rows: int) -> torch.Tensor:
    """Sum of the members' equal chunks, in member order (a fixed order: the same bits on every run)."""
    chunks = received.view(rows, -1)
    total = chunks[0].clone()
    for chunk in chunks[1:]:
        total += chunk
    return total


def _copy_into(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for t in tensors:
        t.data.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def _set_grads(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        piece = flat[offset : offset + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = piece.clone()
        else:
            p.grad.copy_(piece)
        offset += p.numel()
