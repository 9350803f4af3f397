"""Distributed Muon: both sharding modes equal single-process torch.optim.Muon + AdamW.

One gloo run of 2 simulated nodes x 2 ranks does every distributed scenario (process start-up is
the slow part); the single-process reference runs in the test process, on the mean gradient of the
same four per-rank batches.
"""

import copy
import multiprocessing as mp
import socket
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer.muon import (
    DistributedMuon,
    MuonConfig,
    assign_owners,
    choose_mode,
    split_params,
)
from trainer.topology import SIMULATED_RANKS_PER_NODE, Topology

NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE
STEPS, SPLIT = 5, 3  # resume scenarios: SPLIT steps, checkpoint, the rest in another mode
CONFIG = MuonConfig(lr=0.02, adamw_lr=0.01, adamw_params=("out.weight",))
CLIP = 0.05  # well under the gradients' norm, so clipping acts on every step
ATOL, RTOL = 0.0, 0.0  # the same sums in the same order on one thread: the same bits (see the reference)


class SmallNet(nn.Module):
    """Matrices of three shapes for Muon, a head kept on AdamW by name, biases, a LayerNorm, an embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 16)
        self.inp = nn.Linear(12, 16)
        self.hidden = nn.Linear(16, 40)
        self.norm = nn.LayerNorm(40)
        self.hidden2 = nn.Linear(40, 24, bias=False)
        self.out = nn.Linear(24, 3)

    def forward(self, tokens, x):
        h = torch.tanh(self.embed(tokens).sum(1) + self.inp(x))
        return self.out(torch.tanh(self.hidden2(self.norm(torch.relu(self.hidden(h))))))


def make_model(seed: int = 0) -> SmallNet:
    torch.manual_seed(seed)
    return SmallNet()


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens, x, y = (
        torch.randint(0, 10, (8, 3), generator=g),
        torch.randn(8, 12, generator=g),
        torch.randn(8, 3, generator=g),
    )
    return nn.functional.mse_loss(model(tokens, x), y)


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# -- the distributed run ------------------------------------------------------------------------


def train_rank(model, opt, steps, rank):
    for step in steps:
        opt.zero_grad()
        loss_of(model, step, rank).backward()
        opt.step()


def momentum_held(model, opt) -> list[str]:
    return [n for n, p in model.named_parameters() if "momentum_buffer" in opt.state.get(p, {})]


def rank_main(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    topo = Topology.simulated(rank, WORLD, RANKS_PER_NODE)
    results = {"auto": DistributedMuon(make_model(), CONFIG, topo).mode}
    for mode in ("global", "node_local"):
        model = make_model()
        opt = DistributedMuon(model, replace(CONFIG, mode=mode), topo)
        train_rank(model, opt, range(STEPS - 1), rank)
        opt.comm_stats.reset()
        train_rank(model, opt, [STEPS - 1], rank)
        results[mode] = {
            "params": params_of(model),
            "stats": opt.comm_stats.as_dict(),
            "state_dict": opt.state_dict(),
            "momentum_held": momentum_held(model, opt),
            "owned": opt.owned_param_names,
        }

        model = make_model()
        opt = DistributedMuon(model, replace(CONFIG, mode=mode, max_grad_norm=CLIP), topo)
        train_rank(model, opt, range(STEPS), rank)
        results[f"clip_{mode}"] = {"params": params_of(model), "grad_norm": opt.grad_norm}

    for ranks_per_node in (1, WORLD):  # the same processes as 4 nodes of one rank, and as one node
        for mode in ("global", "node_local"):
            model = make_model()
            opt = DistributedMuon(model, replace(CONFIG, mode=mode), Topology.simulated(rank, WORLD, ranks_per_node))
            train_rank(model, opt, range(STEPS), rank)
            results[f"{mode}_{ranks_per_node}_per_node"] = params_of(model)

    for first, then in (("global", "node_local"), ("node_local", "global")):
        model = make_model()
        opt = DistributedMuon(model, replace(CONFIG, mode=first), topo)
        train_rank(model, opt, range(SPLIT), rank)
        checkpoint = {"model": params_of(model), "optimizer": copy.deepcopy(opt.state_dict())}
        resumed = make_model(seed=99)  # a different init: everything must come from the checkpoint
        resumed.load_state_dict(checkpoint["model"])
        opt = DistributedMuon(resumed, replace(CONFIG, mode=then), topo)
        opt.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
        results[f"{first}->{then}_held"] = (momentum_held(resumed, opt), opt.owned_param_names)
        train_rank(resumed, opt, range(SPLIT, STEPS), rank)
        results[f"{first}->{then}"] = params_of(resumed)
        results[f"checkpoint_{first}"] = checkpoint
    # the trainer checkpoints through DCP's state-dict functions (FQN keys; a fake step fills an empty state)
    model = make_model()
    opt = DistributedMuon(model, replace(CONFIG, mode="global"), topo)
    train_rank(model, opt, range(SPLIT), rank)
    model_sd, optim_sd = copy.deepcopy(get_state_dict(model, opt))
    resumed = make_model(seed=99)
    opt = DistributedMuon(resumed, replace(CONFIG, mode="node_local"), topo)
    set_state_dict(resumed, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
    train_rank(resumed, opt, range(SPLIT, STEPS), rank)
    results["dcp global->node_local"] = params_of(resumed)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("muon")
    ctx, port = mp.get_context("spawn"), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, str(out))) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0] * WORLD
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# -- the single-process reference ---------------------------------------------------------------
# The optimizer sums the ranks' gradients in a fixed order: a global-mode owner in rank order,
# everything else node by node (each node's ranks in order, then the node sums, which gloo adds as
# a + b for two nodes). The reference sums in the same order, on one thread as the ranks do, so the
# runs must agree bit for bit.
# Where gloo picks the order (an all-reduce among 4 ranks) or the norm is computed another way
# (clipping), bf16 Newton-Schulz turns last-bit differences of the mean gradient into bf16-sized
# differences of the update: there the tolerance is LOOSE, still 10x below what one rank's gradient
# missing from the mean does (see test_loose_tolerance_still_sees_a_lost_gradient).
SEQUENTIAL, BY_NODE = "sequential", "by_node"
MUON_ORDER = {"global": SEQUENTIAL, "node_local": BY_NODE}  # on 2 nodes x 2 ranks
LOOSE = 1e-3


@contextmanager
def one_thread():
    """As the ranks run: a kernel's result may depend on how many threads split its reductions."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def set_mean_grads(
    model: nn.Module, step: int, muon_order: str, adamw_order: str = BY_NODE, ranks: range = range(WORLD)
) -> None:
    """p.grad = the sum of the ranks' gradients, in the given order, over WORLD."""
    per_rank = []
    for rank in ranks:
        model.zero_grad()
        with one_thread():
            loss_of(model, step, rank).backward()
        per_rank.append({n: p.grad.clone() for n, p in model.named_parameters()})
    on_muon = {n for n, _ in split_params(model, CONFIG.adamw_params)[0]}
    for name, p in model.named_parameters():
        order = muon_order if name in on_muon else adamw_order
        p.grad = ordered_sum([g[name] for g in per_rank], order) / WORLD


def ordered_sum(grads: list[torch.Tensor], order: str) -> torch.Tensor:
    size = len(grads) if order == SEQUENTIAL else RANKS_PER_NODE
    partial = []
    for first in range(0, len(grads), size):
        total = grads[first].clone()
        for g in grads[first + 1 : first + size]:
            total += g
        partial.append(total)
    total = partial[0]
    for p in partial[1:]:
        total = total + p
    return total


def torch_optimizers(model: nn.Module, config: MuonConfig):
    muon, adamw = split_params(model, config.adamw_params)
    return (
        torch.optim.Muon(
            [p for _, p in muon],
            lr=config.lr,
            weight_decay=config.weight_decay,
            momentum=config.momentum,
            nesterov=config.nesterov,
        ),
        torch.optim.AdamW(
            [p for _, p in adamw],
            lr=config.adamw_lr,
            betas=config.adamw_betas,
            eps=config.adamw_eps,
            weight_decay=config.adamw_weight_decay,
        ),
    )


def reference(
    muon_orders: list[str], adamw_order: str = BY_NODE, clip: float | None = None, ranks: range = range(WORLD)
):
    """torch.optim.Muon + AdamW on the mean gradient; step i's Muon gradients summed in muon_orders[i]."""
    model = make_model()
    opts = torch_optimizers(model, CONFIG)
    for step, muon_order in enumerate(muon_orders):
        set_mean_grads(model, step, muon_order, adamw_order, ranks)
        if clip is not None:
            nn.utils.clip_grad_norm_(list(model.parameters()), clip)
        with one_thread():
            for opt in opts:
                opt.step()
    return params_of(model), opts


def assert_params_close(got: dict, want: dict, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=atol, rtol=rtol, msg=lambda m, name=name: f"{name}: {m}")


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["global", "node_local"])
def test_mode_matches_single_process_muon_and_replicas_agree(ranks, mode):
    want, _ = reference([MUON_ORDER[mode]] * STEPS)
    moved = max((want[k] - v).abs().max().item() for k, v in params_of(make_model()).items())
    assert moved > 0.05  # the run went somewhere: closeness below means something
    for r in ranks:
        assert_params_close(r[mode]["params"], want)
        for name, value in r[mode]["params"].items():
            assert torch.equal(value, ranks[0][mode]["params"][name])  # replicas are bit-identical


@pytest.mark.parametrize("mode", ["global", "node_local"])
def test_one_node_of_four_ranks_matches_single_process_muon(ranks, mode):
    want, _ = reference([SEQUENTIAL] * STEPS, SEQUENTIAL)  # one node: every sum in rank order
    for r in ranks:
        assert_params_close(r[f"{mode}_{WORLD}_per_node"], want)


@pytest.mark.parametrize("mode", ["global", "node_local"])
def test_four_nodes_of_one_rank_match_single_process_muon(ranks, mode):
    want, _ = reference([SEQUENTIAL] * STEPS, SEQUENTIAL)  # gloo sums across the 4 nodes in its own order
    for r in ranks:
        assert_params_close(r[f"{mode}_1_per_node"], want, atol=LOOSE, rtol=0)


def test_loose_tolerance_still_sees_a_lost_gradient():
    want, _ = reference([SEQUENTIAL] * STEPS, SEQUENTIAL)
    lost, _ = reference([SEQUENTIAL] * STEPS, SEQUENTIAL, ranks=range(WORLD - 1))
    assert max((want[k] - lost[k]).abs().max().item() for k in want) > 10 * LOOSE


@pytest.mark.parametrize("mode", ["global", "node_local"])
def test_gradient_clipping_matches_clip_grad_norm(ranks, mode):
    want, _ = reference([MUON_ORDER[mode]] * STEPS, clip=CLIP)
    for r in ranks:
        assert_params_close(r[f"clip_{mode}"]["params"], want, atol=LOOSE, rtol=0)
        assert r[f"clip_{mode}"]["grad_norm"] > CLIP


@pytest.mark.parametrize("mode", ["global", "node_local"])
def test_state_dict_is_torchs_whatever_the_mode(ranks, mode):
    _, (muon, adamw) = reference([MUON_ORDER[mode]] * STEPS)
    want_muon, want_adamw = muon.state_dict(), adamw.state_dict()
    n_muon = len(want_muon["state"])
    for r in ranks:
        sd = r[mode]["state_dict"]
        assert list(sd["state"]) == list(range(n_muon + len(want_adamw["state"])))
        for i, s in want_muon["state"].items():
            torch.testing.assert_close(sd["state"][i]["momentum_buffer"], s["momentum_buffer"], atol=ATOL, rtol=RTOL)
        for i, s in want_adamw["state"].items():
            assert sd["state"][n_muon + i].keys() == s.keys()
            for key in s:
                torch.testing.assert_close(sd["state"][n_muon + i][key], s[key], atol=ATOL, rtol=RTOL)
        assert sd["param_groups"] == ranks[0]["global"]["state_dict"]["param_groups"]


@pytest.mark.parametrize("first,then", [("global", "node_local"), ("node_local", "global")])
def test_resume_in_the_other_mode(ranks, first, then):
    want, _ = reference([MUON_ORDER[first]] * SPLIT + [MUON_ORDER[then]] * (STEPS - SPLIT))
    for r in ranks:
        assert_params_close(r[f"{first}->{then}"], want)
        held, owned = r[f"{first}->{then}_held"]
        assert held == owned  # loading keeps only this rank's share of the momentum


def test_momentum_is_sharded(ranks):
    matrices = sorted(n for n, _ in split_params(make_model(), CONFIG.adamw_params)[0])
    held = [r["global"]["momentum_held"] for r in ranks]
    assert sorted(n for names in held for n in names) == matrices  # each matrix on exactly one rank
    for node in range(NODES):
        node_ranks = ranks[node * RANKS_PER_NODE : (node + 1) * RANKS_PER_NODE]
        assert sorted(n for r in node_ranks for n in r["node_local"]["momentum_held"]) == matrices
    for r in ranks:
        for mode in ("global", "node_local"):
            assert r[mode]["momentum_held"] == r[mode]["owned"]


def test_resume_through_dcp_state_dict_functions(ranks):
    want, _ = reference([SEQUENTIAL] * SPLIT + [BY_NODE] * (STEPS - SPLIT))
    for r in ranks:
        assert_params_close(r["dcp global->node_local"], want)


@pytest.mark.parametrize("first", ["global", "node_local"])
def test_resume_a_distributed_checkpoint_in_one_process(ranks, first):
    want, _ = reference([MUON_ORDER[first]] * SPLIT + [SEQUENTIAL] * (STEPS - SPLIT))
    checkpoint = ranks[1][f"checkpoint_{first}"]
    model = make_model(seed=99)
    model.load_state_dict(checkpoint["model"])
    opt = DistributedMuon(model, CONFIG)
    assert opt.mode == "single"
    opt.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
    for step in range(SPLIT, STEPS):
        set_mean_grads(model, step, SEQUENTIAL)
        with one_thread():
            opt.step()
    assert_params_close(params_of(model), want)


def test_inter_node_bytes(ranks):
    muon, adamw = split_params(make_model(), CONFIG.adamw_params)
    muon_bytes = 4 * sum(p.numel() for _, p in muon)
    adamw_bytes = 4 * sum(p.numel() for _, p in adamw)

    def total(mode, kind, purpose):
        return sum(r[mode]["stats"][kind].get(purpose, 0) for r in ranks)

    # node-local: the cross-node all-reduce of the 2-D gradients is all that crosses (2·m·(N-1)/N per member)
    assert total("node_local", "inter", "muon_grad_reduce") == 2 * (NODES - 1) * muon_bytes
    assert total("node_local", "inter", "muon_update_gather") == 0
    # global: every remote rank sends its gradient to the owner, the owner its update to every remote rank
    remote_ranks = WORLD - RANKS_PER_NODE
    assert total("global", "inter", "muon_grad_reduce") == remote_ranks * muon_bytes
    assert total("global", "inter", "muon_update_gather") == remote_ranks * muon_bytes
    assert total("global", "inter_node_aware", "muon_update_gather") == (NODES - 1) * muon_bytes
    # the AdamW parameters travel the same way in both modes
    for kind in ("intra", "inter"):
        assert total("global", kind, "adamw_grad_reduce") == total("node_local", kind, "adamw_grad_reduce") > 0
    assert total("node_local", "inter", "adamw_grad_reduce") == 2 * (NODES - 1) * adamw_bytes

    def inter(mode):
        return sum(sum(r[mode]["stats"]["inter"].values()) for r in ranks)

    assert inter("global") > inter("node_local")


def test_auto_mode_switches_by_node_count(ranks):
    assert all(r["auto"] == "node_local" for r in ranks)
    assert choose_mode("auto", num_nodes=1, world_size=8) == "global"
    assert choose_mode("auto", num_nodes=2, world_size=16) == "node_local"
    assert choose_mode("auto", num_nodes=2, world_size=16, node_local_min_nodes=3) == "global"
    assert choose_mode("node_local", num_nodes=1, world_size=1) == "single"
    with pytest.raises(ValueError):
        choose_mode("hybrid", num_nodes=2, world_size=4)


def test_single_process_is_exactly_torch():
    model = make_model()
    ours = DistributedMuon(model, CONFIG)
    want, _ = reference([SEQUENTIAL] * STEPS)
    for step in range(STEPS):
        set_mean_grads(model, step, SEQUENTIAL)
        with one_thread():
            ours.step()
    for name, value in params_of(model).items():
        assert torch.equal(value, want[name]), name


def test_a_learning_rate_schedule_reaches_both_inner_optimizers():
    def halve_each_step(step):
        return 0.5**step

    model, ref = make_model(), make_model()
    ours = DistributedMuon(model, CONFIG)
    opts = torch_optimizers(ref, CONFIG)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, halve_each_step) for o in (ours, *opts)]
    for step in range(STEPS):
        set_mean_grads(model, step, SEQUENTIAL)
        set_mean_grads(ref, step, SEQUENTIAL)
        with one_thread():
            for opt in (ours, *opts):
                opt.step()
        for schedule in schedules:
            schedule.step()
    for name, value in params_of(model).items():
        assert torch.equal(value, params_of(ref)[name]), name


def test_parameter_split_and_owner_assignment():
    muon, adamw = split_params(make_model(), CONFIG.adamw_params)
    assert [n for n, _ in muon] == ["inp.weight", "hidden.weight", "hidden2.weight"]
    assert "embed.weight" in [n for n, _ in adamw] and "out.weight" in [n for n, _ in adamw]
    assert assign_owners([5, 100, 30, 30, 40], 2) == [0, 0, 1, 1, 1]
    assert assign_owners([10, 10, 10], 4) == [0, 1, 2]  # owner 3 gets nothing


def test_topology_from_env():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    assert Topology.from_env(env) == Topology(
        rank=5, world_size=8, local_rank=1, local_world_size=4, node=1, num_nodes=2
    )
    simulated = Topology.from_env({**env, SIMULATED_RANKS_PER_NODE: "2"})
    assert (simulated.node, simulated.local_rank, simulated.num_nodes) == (2, 1, 4)
    assert simulated.peer_ranks(1) == [1, 3, 5, 7] and simulated.node_ranks(2) == [4, 5]
    with pytest.raises(ValueError):
        Topology.simulated(rank=0, world_size=6, ranks_per_node=4)
