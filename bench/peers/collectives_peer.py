#!/usr/bin/env python3
"""Gloo's reduce-scatter against its all-reduce, as gradscope's sharded steps would use them.

Two processes of this torch (its Gloo is the one gradscope links) meet on 127.0.0.1 and, in
interleaved rounds, all-reduce a float32 tensor and reduce-scatter the same tensor into a half
of it, for each size: gradscope's default bucket (--bucket-size 25 MiB, zero2's unit), 8 MiB (about one
block of the small Llama, fsdp's unit) and 1 MiB. For
each call: the wall time (both ranks waited for) and the bytes the loopback interface carried
(/proc/net/dev: both ranks together, with the few bytes of two barriers around the call, and
anything else on this machine's loopback meanwhile, so run it on a quiet machine).

    .venv/bin/python bench/peers/collectives_peer.py --rounds 5 --json out.json

A reduce-scatter sends (N-1)/N of the tensor per rank in a ring, an all-reduce twice that; the
bytes column shows which of the two the library actually does.
"""

import argparse
import datetime
import json
import multiprocessing
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

SIZES = [25 << 20, 8 << 20, 1 << 20]  # bytes: the default bucket (zero2), a block (fsdp), less
# reduce_scatter_tensor's newer name, where this torch has it.
reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def loopback_bytes():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])  # received bytes: what was sent on loopback
    raise RuntimeError("no loopback interface in /proc/net/dev")


def rank_main(rank, port, rounds, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    cases = []
    for size in SIZES:
        n = size // 4
        x = torch.ones(n)
        half = torch.empty(n // 2)
        calls = {"allreduce": lambda: dist.all_reduce(x),
                 "reduce_scatter": lambda: reduce_scatter(half, x)}
        calls["allreduce"]()  # connections and buffers made before timing
        calls["reduce_scatter"]()
        case = {"bytes": size, "allreduce_s": [], "reduce_scatter_s": [],
                "allreduce_sent": [], "reduce_scatter_sent": []}
        for i in range(rounds):
            order = ["allreduce", "reduce_scatter"] if i % 2 == 0 else ["reduce_scatter",
                                                                        "allreduce"]
            for name in order:
                dist.barrier()
                sent = loopback_bytes()
                dist.barrier()  # neither rank sends before rank 0 has read the counter
                start = time.perf_counter()
                calls[name]()
                dist.barrier()
                case[name + "_s"].append(time.perf_counter() - start)
                case[name + "_sent"].append(loopback_bytes() - sent)
        cases.append(case)
    if rank == 0:
        queue.put(cases)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", required=True, help="where to write the result")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    queue = multiprocessing.Queue()
    port = free_port()
    procs = [multiprocessing.Process(target=rank_main, args=(r, port, args.rounds, queue),
                                     daemon=True) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        cases = queue.get(timeout=600)
    except Exception:
        for proc in procs:
            proc.terminate()
        raise SystemExit("the ranks did not finish (a rank died or hung)")
    for proc in procs:
        proc.join(timeout=60)
        if proc.exitcode != 0:
            raise SystemExit(f"a rank exited with {proc.exitcode}")
    result = {"torch": torch.__version__, "rounds": args.rounds, "cases": cases}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    for c in cases:
        print(f"{c['bytes'] >> 20} MiB: all-reduce {statistics.median(c['allreduce_s']) * 1e3:.1f}"
              f" ms, {statistics.median(c['allreduce_sent']) / 2**20:.1f} MiB sent; reduce-scatter "
              f"{statistics.median(c['reduce_scatter_s']) * 1e3:.1f} ms, "
              f"{statistics.median(c['reduce_scatter_sent']) / 2**20:.1f} MiB sent")


if __name__ == "__main__":
    main()
