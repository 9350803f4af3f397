"""Muon sharding: global (owners among all ranks) against node-local (owners inside each node).

`python -m benchmarks muon [--quick | --tiny]`

Simulated nodes on this machine: nodes x ranks gloo processes (default 2x8 = 16, then 4x2; --quick
2x4, then 4x2; --tiny 2x2 only, a one-block model, one step), every k consecutive ranks one node
(``Topology.simulated``). The same model and the
same gradients (synthetic, fixed per rank) in both modes; per mode, warm-up steps then measured
``DistributedMuon.step()`` calls, each after a barrier. Measured per step:
  - step time: wall time of step(), the slowest rank's, median and mean over the steps;
  - arithmetic: CPU time of each rank's main thread during step() (gloo moves bytes on its own threads);
  - bytes sent within and across nodes, summed over ranks (byte model: trainer/topology.py). The
    Muon matrices' bytes are what the strategies differ in (``traffic_ratio``); the AdamW parameters'
    hierarchical all-reduce is the same in both and is shown apart.

gloo on one machine does not model a slow fabric: every "node" shares the loopback interface and
the same cores, so the measured step times show CPU contention, not links. The fabric model
projects a step as the slowest rank's arithmetic + intra_bytes / B_intra + inter_bytes / B_inter,
with B_intra = 450 GB/s per direction (NVLink-class: H100/H200 NVLink 4, 900 GB/s both ways) and
B_inter = B_intra / 10 (about one 400 Gb/s NIC per GPU); bandwidth only (no latency, no overlap).
It is shown twice: with this CPU's measured arithmetic, and with GPU arithmetic (the Newton-Schulz
FLOPs of the rank's matrices at an assumed 400 TFLOP/s of bf16).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

from ._cli import add_size_flags, size_of

B_INTRA = 450e9
B_INTER = B_INTRA / 10
GPU_FLOPS = 400e12
TARGET_RATIO, PUBLISHED_RATIO = 8.0, 7.6
MODES = ("global", "node_local")
MUON = ("muon_grad_reduce", "muon_update_gather")
ADAMW = ("adamw_grad_reduce",)


def make_model(width: int, blocks: int, vocab: int):
    """Transformer-shaped parameters (attention and MLP matrices, norms, biases, an embedding); no
    forward: the benchmark feeds synthetic gradients."""
    import torch
    from torch import nn

    def block():
        return nn.ModuleDict(
            {
                "norm1": nn.LayerNorm(width),
                "qkv": nn.Linear(width, 3 * width),
                "proj": nn.Linear(width, width),
                "norm2": nn.LayerNorm(width),
                "fc1": nn.Linear(width, 4 * width),
                "fc2": nn.Linear(4 * width, width),
            }
        )

    torch.manual_seed(0)
    return nn.ModuleDict(
        {
            "embed": nn.Embedding(vocab, width),
            "blocks": nn.ModuleList(block() for _ in range(blocks)),
            "norm": nn.LayerNorm(width),
        }
    )


def rank_main(
    rank: int, world: int, ranks_per_node: int, port: int, shape: tuple, steps: int, warmup: int, out
) -> None:
    import torch
    import torch.distributed as dist

    from trainer.muon import DistributedMuon, MuonConfig
    from trainer.topology import Topology

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    topology = Topology.simulated(rank, world, ranks_per_node)
    result, finals = {}, {}
    for mode in MODES:
        model = make_model(*shape)
        opt = DistributedMuon(model, MuonConfig(lr=0.02, mode=mode), topology)
        params = list(model.parameters())
        gen = torch.Generator().manual_seed(1 + rank)
        grads = [torch.randn(p.shape, generator=gen) * 1e-2 for p in params]
        walls, cpus = [], []
        for i in range(warmup + steps):
            if i == warmup:
                opt.comm_stats.reset()
            for p, g in zip(params, grads):
                p.grad = g.clone()
            dist.barrier()
            t, c = time.perf_counter(), time.thread_time()
            opt.step()
            if i >= warmup:
                walls.append(time.perf_counter() - t)
                cpus.append(time.thread_time() - c)
        result[mode] = {"wall": walls, "cpu": cpus, "stats": opt.comm_stats.as_dict()}
        finals[mode] = [p.detach().clone() for p in params]
    result["max_param_diff"] = max((a - b).abs().max().item() for a, b in zip(*finals.values()))
    out.put((rank, result))
    dist.destroy_process_group()


def run(nodes: int, ranks_per_node: int, shape: tuple, steps: int, warmup: int) -> list[dict]:
    world = nodes * ranks_per_node
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(r, world, ranks_per_node, port, shape, steps, warmup, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"rank process failed with exit code {p.exitcode}")
    return [got[r] for r in range(world)]


def ns_flops(rows: int, cols: int, ns_steps: int = 5) -> float:
    """Newton-Schulz FLOPs on an a x b matrix (a <= b): X X^T, then (gram)(gram), then (update) X."""
    a, b = min(rows, cols), max(rows, cols)
    return ns_steps * 2 * (a * a * b + a * a * a + a * a * b)


def summarize(ranks: list[dict], nodes: int, ranks_per_node: int, shape: tuple, steps: int) -> dict:
    from trainer.muon import assign_owners, split_params

    muon, _ = split_params(make_model(*shape))
    shapes = [tuple(p.shape) for _, p in muon]
    world = nodes * ranks_per_node
    summary = {
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "world_size": world,
        "max_param_diff_global_vs_local": max(r["max_param_diff"] for r in ranks),
    }

    def per_step(mode, kind, purposes, rank=None):
        chosen = ranks if rank is None else [ranks[rank]]
        return round(sum(r[mode]["stats"][kind].get(p, 0) for r in chosen for p in purposes) / steps)

    for mode in MODES:
        owners = world if mode == "global" else ranks_per_node
        owner_of = assign_owners([a * b for a, b in shapes], owners)
        projected_cpu, projected_gpu = [], []
        for rank, r in enumerate(ranks):
            comm = (
                per_step(mode, "intra", MUON + ADAMW, rank) / B_INTRA
                + per_step(mode, "inter", MUON + ADAMW, rank) / B_INTER
            )
            flops = sum(ns_flops(*s) for s, o in zip(shapes, owner_of) if o == rank % owners)
            projected_cpu.append(statistics.mean(r[mode]["cpu"]) + comm)
            projected_gpu.append(flops / GPU_FLOPS + comm)
        walls = [max(r[mode]["wall"][i] for r in ranks) for i in range(steps)]
        summary[mode] = {
            "inter_node_bytes": per_step(mode, "inter", MUON),
            "inter_node_bytes_node_aware": per_step(mode, "inter_node_aware", MUON),
            "intra_node_bytes": per_step(mode, "intra", MUON),
            "adamw_inter_node_bytes": per_step(mode, "inter", ADAMW),
            "adamw_intra_node_bytes": per_step(mode, "intra", ADAMW),
            "step_s_median": statistics.median(walls),
            "step_s_mean": statistics.mean(walls),
            "arithmetic_cpu_s_max_rank": max(statistics.mean(r[mode]["cpu"]) for r in ranks),
            "projected_step_s_cpu_arithmetic": max(projected_cpu),
            "projected_step_s_gpu_arithmetic": max(projected_gpu),
        }
    g, loc = summary["global"], summary["node_local"]
    summary["traffic_ratio"] = g["inter_node_bytes"] / loc["inter_node_bytes"]
    summary["traffic_ratio_with_adamw"] = (g["inter_node_bytes"] + g["adamw_inter_node_bytes"]) / (
        loc["inter_node_bytes"] + loc["adamw_inter_node_bytes"]
    )
    summary["traffic_ratio_node_aware"] = g["inter_node_bytes_node_aware"] / loc["inter_node_bytes_node_aware"]
    for kind in ("cpu", "gpu"):
        key = f"projected_step_s_{kind}_arithmetic"
        summary[f"projected_speedup_{kind}_arithmetic"] = g[key] / loc[key]
    return summary


def print_table(s: dict) -> None:
    g, loc = s["global"], s["node_local"]

    def row(name, a, b, ratio="", note=""):
        print(f"  {name:<44}{a:>14}{b:>14}{ratio:>9}   {note}")

    def mb(x):
        return f"{x / 1e6:.2f} MB"

    def ms(x):
        return f"{x * 1e3:.2f} ms"

    print(f"\n{s['nodes']} nodes x {s['ranks_per_node']} ranks ({s['world_size']} gloo processes), per step:")
    row("", "global", "node_local", "ratio")

    def both(name, fmt, key, ratio="", note=""):  # one figure of both modes
        row(name, fmt(g[key]), fmt(loc[key]), ratio, note)

    both(
        "Muon inter-node bytes",
        mb,
        "inter_node_bytes",
        f"{s['traffic_ratio']:.2f}x",
        f"target >= {TARGET_RATIO:.0f}x (published {PUBLISHED_RATIO}x)",
    )
    row(
        "  with the AdamW all-reduce (same in both)",
        mb(g["inter_node_bytes"] + g["adamw_inter_node_bytes"]),
        mb(loc["inter_node_bytes"] + loc["adamw_inter_node_bytes"]),
        f"{s['traffic_ratio_with_adamw']:.2f}x",
    )
    both(
        "  if broadcasts crossed each node once",
        mb,
        "inter_node_bytes_node_aware",
        f"{s['traffic_ratio_node_aware']:.2f}x",
        "node-aware routing",
    )
    both("Muon intra-node bytes", mb, "intra_node_bytes")
    for stat, note in (("median", "one machine: not a fabric"), ("mean", "")):
        key = f"step_s_{stat}"
        both(f"step, measured on gloo ({stat})", ms, key, f"{g[key] / loc[key]:.2f}x", note)
    both("arithmetic, slowest rank (CPU time)", ms, "arithmetic_cpu_s_max_rank")
    for kind, what in (("cpu", "this CPU's arithmetic"), ("gpu", "GPU arithmetic")):
        ratio = f"{s[f'projected_speedup_{kind}_arithmetic']:.2f}x"
        both(f"projected step, {what}", ms, f"projected_step_s_{kind}_arithmetic", ratio, "fabric model")
    print(
        f"  final parameters, global vs node_local: max |diff| {s['max_param_diff_global_vs_local']:.2e} (the modes sum "
        "the ranks' gradients in different orders; bf16 Newton-Schulz shows those last-bit differences)"
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks muon", description=__doc__.split("\n")[0])
    add_size_flags(ap, quick="2x4 and 4x2 ranks, a smaller model, fewer steps")
    ap.add_argument("--topologies", help="nodes x ranks, comma-separated (default 2x8,4x2; quick 2x4,4x2; tiny 2x2)")
    ap.add_argument("--steps", type=int, help="measured steps per mode (default 8, quick 4, tiny 1)")
    args = ap.parse_args(argv)
    size = size_of(args)
    topologies = [
        tuple(int(n) for n in t.split("x"))
        for t in (args.topologies or {"full": "2x8,4x2", "quick": "2x4,4x2", "tiny": "2x2"}[size]).split(",")
    ]
    # width, blocks, vocabulary; measured and warm-up steps per mode
    shape = {"full": (256, 8, 1024), "quick": (128, 4, 512), "tiny": (32, 1, 64)}[size]
    steps = args.steps or {"full": 8, "quick": 4, "tiny": 1}[size]
    warmup = 1 if size == "tiny" else 2

    from trainer.muon import split_params

    muon, adamw = split_params(make_model(*shape))
    n_muon, n_adamw = sum(p.numel() for _, p in muon), sum(p.numel() for _, p in adamw)
    print(
        f"muon benchmark ({size}; {os.cpu_count()} cores): width {shape[0]}, "
        f"{shape[1]} blocks: {(n_muon + n_adamw) / 1e6:.2f}M parameters, {n_muon / 1e6:.2f}M in {len(muon)} "
        f"Muon matrices; {warmup} warm-up + {steps} measured steps per mode",
        flush=True,
    )
    runs = []
    for nodes, ranks_per_node in topologies:
        t = time.perf_counter()
        runs.append(summarize(run(nodes, ranks_per_node, shape, steps, warmup), nodes, ranks_per_node, shape, steps))
        print(f"  {nodes}x{ranks_per_node} done in {time.perf_counter() - t:.0f} s", flush=True)
    for s in runs:
        print_table(s)
    print(
        f"\nfabric model: B_intra {B_INTRA / 1e9:.0f} GB/s, B_inter {B_INTER / 1e9:.0f} GB/s per rank and direction, "
        f"GPU {GPU_FLOPS / 1e12:.0f} TFLOP/s bf16; bandwidth only, no latency, no overlap."
    )
    print(
        "gloo on one machine does not model a slow fabric: all ranks share loopback and "
        f"{os.cpu_count()} cores, so measured step times show CPU contention; only the projection models links."
    )

    main_run = runs[0]
    g, loc = main_run["global"], main_run["node_local"]

    def both(name: str, key: str, digits: int | None = None) -> dict:  # one figure of both modes
        if digits is None:
            return {f"{name}_global": g[key], f"{name}_local": loc[key]}
        return {f"{name}_global": round(g[key], digits), f"{name}_local": round(loc[key], digits)}

    result = {
        "topology": {"nodes": main_run["nodes"], "ranks_per_node": main_run["ranks_per_node"]},
        **both("inter_node_bytes", "inter_node_bytes"),
        **{k: round(main_run[k], 3) for k in ("traffic_ratio", "traffic_ratio_with_adamw", "traffic_ratio_node_aware")},
        **both("intra_node_bytes", "intra_node_bytes"),
        **both("step_s", "step_s_median", 5),
        **both("step_s_mean", "step_s_mean", 5),
        **both("projected_step_s", "projected_step_s_gpu_arithmetic"),
        "projected_speedup": round(main_run["projected_speedup_gpu_arithmetic"], 3),
        "projected_speedup_cpu_arithmetic": round(main_run["projected_speedup_cpu_arithmetic"], 3),
        "fabric": {"b_intra_Bps": B_INTRA, "b_inter_Bps": B_INTER, "gpu_flops": GPU_FLOPS},
        "model": {
            "width": shape[0],
            "blocks": shape[1],
            "vocab": shape[2],
            "muon_params": n_muon,
            "adamw_params": n_adamw,
        },
        "runs": runs,
        "steps": steps,
        "cores": os.cpu_count(),
        "size": size,
        "quick": args.quick,
    }
    result["targets_met"] = {"traffic_ratio": result["traffic_ratio"] >= TARGET_RATIO}
    print(json.dumps(result))
    return 0
