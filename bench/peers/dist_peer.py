#!/usr/bin/env python3
"""torch.distributed's sharded training beside gradscope's `--nproc 2 --shard MODE`: the Llama
`small` preset as transformers' LlamaForCausalLM, loaded from the weights gradscope wrote,
trained on the samples gradscope trains on, two ranks on Gloo with one thread each.

    dist_peer.py prepare --gradscope build/gradscope --dir D --samples 40
        gradscope writes D/weights (`run --save-weights`: config.json, model.safetensors) and
        the first 40 samples of its training stream (`outputs --init-from D/weights`); their
        input_ids and targets are kept in D/batch.safetensors (outputs also computes the
        logits of every sample: about 5 GB of memory for 40)
    dist_peer.py train --dir D --mode zero2 --warmup 2 --steps 4 --json out.json
        trains 2 ranks with torch.distributed's counterpart of gradscope's mode and writes
        rank 0's step times, every rank's peak tensor bytes and the losses
    dist_peer.py check --gradscope build/gradscope --dir D --steps 10 [--modes ddp,zero2]
        the loss of every step of both sides, 10 steps from the same weights (no warm-up),
        and their largest relative difference; exit 1 when it exceeds --tolerance

The counterparts (gradscope's modes: docs/distributed.md):
    ddp    torch.nn.parallel.DistributedDataParallel
    zero1  ZeroRedundancyOptimizer(AdamW) under DistributedDataParallel
    zero2  FSDP2 fully_shard(reshard_after_forward=False) on every decoder layer and the root:
           gradients and optimizer state sharded, parameters kept whole between forward and
           backward (FSDP1's SHARD_GRAD_OP with --fsdp-api 1)
    fsdp   FSDP2 fully_shard on every decoder layer and the root (FSDP1's FULL_SHARD)
Both FSDP APIs run on Gloo and the CPU in torch 2.13 (FSDP1 only given device_id=cpu: without
it, it looks for an accelerator and refuses). ZeroRedundancyOptimizer assigns whole parameters
to ranks, not gradscope's equal slices of the flat space: the tied embedding, 12.9 M of the
17.6 M parameters, is one rank's, so its two ranks hold unequal optimizer state.

A step is gradscope's: rank r of step s reads samples [s N b + r b, s N b + (r + 1) b) of the
stream (N ranks, micro-batch b; Session::step_batches). The ranks sum their target counts
before backward and each backprops its summed loss x N / that count, so that the wrappers'
mean over ranks is the gradient of the global batch's mean per-target loss, as gradscope's.
The step's loss is the global batch's. `train` takes the samples again from the first when
its steps need more than `prepare` wrote (the step time does not depend on them); `check`
refuses to. AdamW as gradscope's defaults: lr 1e-3, betas
(0.9, 0.999), eps 1e-8, weight decay 0 (gradscope's --weight-decay default, not torch's 0.01),
a constant rate, no clipping; fused (fused=True), as gradscope's step.

Memory: the profiler's allocator events (profile_memory) from before the model is loaded to
the end of the warm-up steps; the running sum is every live CPU tensor of the rank (what
gradscope's per-rank peak counts), and its peak is taken from the wrap onwards. The
parameters are copied into the allocator right after loading, so that weights mapped from the
file count as gradscope's do. The warm-up steps run under the profiler (untimed); the timed
steps do not.
"""

import argparse
import contextlib
import datetime
import json
import math
import multiprocessing
import os
import queue as queue_module
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ["ddp", "zero1", "zero2", "fsdp"]
WORLD = 2
BATCH = 2      # samples per rank and micro-batch, as bench.py's ranks benchmark
SEQ = 128
LR = 1e-3      # gradscope's AdamW defaults for the Llama (docs/optimizers.md)
BETAS = (0.9, 0.999)
EPS = 1e-8


def fail(message):
    """Bad input: exit 2 naming it."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def gradscope_flags(weights, mode, steps, warmup):
    """gradscope's side of a comparison, in `run`'s flags."""
    return ["--model", "llama", "--preset", "small", "--init-from", weights,
            "--batch", str(BATCH), "--seq", str(SEQ), "--optimizer", "adamw",
            "--nproc", str(WORLD), "--shard", mode, "--steps", str(steps),
            "--warmup-steps", str(warmup)]


# ---------------------------------------------------------------------------------------
# prepare: the weights and the samples, written by gradscope


def prepare(args):
    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(args.dir, exist_ok=True)
    weights = os.path.join(args.dir, "weights")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run = [args.gradscope, "run", "--model", "llama", "--preset", "small", "--steps", "1",
               "--warmup-steps", "0", "--batch", str(BATCH), "--threads", "1",
               "--eval-batches", "1", "--no-db", "--quiet", "--save-weights", weights,
               "--json", os.path.join(tmp, "run.json")]
        subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
        # The batch file also holds the logits of every sample (40 x 128 x 50304 floats):
        # only the inputs and targets are kept.
        out = os.path.join(tmp, "outputs.safetensors")
        subprocess.run([args.gradscope, "outputs", "--model", "llama", "--preset", "small",
                        "--init-from", weights, "--batch", str(args.samples), "--seq", str(SEQ),
                        "--threads", "1", "--out", out], check=True, stdout=subprocess.DEVNULL)
        tensors = load_file(out)
        batch = {"input_ids": tensors["batch.input_ids"].contiguous(),
                 "targets": tensors["batch.targets"].contiguous()}
        del tensors
    for name, t in batch.items():
        if t.dtype != torch.int64 or tuple(t.shape) != (args.samples, SEQ):
            fail(f"gradscope outputs wrote batch.{name} as {t.dtype} {tuple(t.shape)}, not "
                 f"int64 ({args.samples}, {SEQ})")
    save_file(batch, os.path.join(args.dir, "batch.safetensors"))
    print(f"{weights}: gradscope's weights; {args.dir}/batch.safetensors: "
          f"{args.samples} samples x {SEQ} tokens", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------
# train: one rank


def load_model(weights):
    """LlamaForCausalLM from gradscope's folder, its config without gradscope's own key."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with open(os.path.join(weights, "config.json")) as f:
        config = json.load(f)
    config.pop("gradscope", None)
    config = LlamaConfig(**config)
    # scaled_dot_product_attention, as gradscope's default on the CPU without dropout.
    config._attn_implementation = "sdpa"
    import torch

    model = LlamaForCausalLM.from_pretrained(weights, config=config, dtype=torch.float32)
    for p in model.parameters():  # into the allocator, where gradscope's weights live
        p.data = p.data.clone()
    model.train()
    return model


def wrap(model, mode, fsdp_api):
    """(model, optimizer, what ran) for gradscope's `mode`."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Fused, as Hugging Face's Trainer and torchtitan run AdamW and as gradscope steps it.
    adamw = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": 0.0, "fused": True}
    if mode == "ddp":
        model = DDP(model)
        return model, torch.optim.AdamW(model.parameters(), **adamw), "DistributedDataParallel"
    if mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        model = DDP(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      **adamw)
        return model, opt, "ZeroRedundancyOptimizer(AdamW) under DistributedDataParallel"
    reshard = mode == "fsdp"
    if fsdp_api == "2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        what = f"FSDP2 fully_shard(reshard_after_forward={reshard}) per decoder layer and root"
        return model, torch.optim.AdamW(model.parameters(), **adamw), what
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    strategy = ShardingStrategy.FULL_SHARD if reshard else ShardingStrategy.SHARD_GRAD_OP
    # device_id: without it, FSDP1 looks for an accelerator and refuses the CPU.
    model = FSDP(model, sharding_strategy=strategy, use_orig_params=True,
                 device_id=torch.device("cpu"),
                 auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
    what = f"FSDP1 {strategy.name} per decoder layer and root"
    return model, torch.optim.AdamW(model.parameters(), **adamw), what


def memory_peak(prof, marker):
    """The most live bytes from the start of `marker` on (running sum of allocator events)."""
    raw = prof.profiler.kineto_results.events()
    starts = [e.start_ns() for e in raw if e.name() == marker]
    memory = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(raw)
                    if e.name() == "[memory]")
    since = starts[0] if starts else 0
    running, highest = 0, 0
    for start, _, nbytes in memory:
        running += nbytes
        if start >= since:
            highest = max(highest, running)
    return highest


def rank_main(rank, port, opts, queue):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank)})
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    prof = None
    if opts["memory"]:
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        prof.start()
    batch = load_file(os.path.join(opts["dir"], "batch.safetensors"))
    model = load_model(os.path.join(opts["dir"], "weights"))
    marker = "dist_peer.train"
    with record_function(marker):
        model, optimizer, what = wrap(model, opts["mode"], opts["fsdp_api"])
    samples = batch["input_ids"].shape[0]

    def step(s):
        first = (s * WORLD * BATCH + rank * BATCH) % samples
        ids = batch["input_ids"][first:first + BATCH]
        targets = batch["targets"][first:first + BATCH]
        optimizer.zero_grad(set_to_none=True)
        count = (targets != -100).sum().reshape(1).double()
        dist.all_reduce(count)  # the global batch's targets, before backward
        logits = model(input_ids=ids).logits
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   ignore_index=-100, reduction="sum")
        # The wrappers average the gradients over the ranks: x WORLD makes it their sum.
        (loss_sum * (WORLD / count.item())).backward()
        optimizer.step()
        total = loss_sum.detach().reshape(1).double()
        dist.all_reduce(total)
        return total.item() / count.item()

    losses, times, peak = [], [], None
    for s in range(opts["warmup"] + opts["steps"]):
        start = time.perf_counter()
        with record_function(marker) if prof is not None else contextlib.nullcontext():
            losses.append(step(s))
        elapsed = time.perf_counter() - start
        if s >= opts["warmup"]:
            times.append(elapsed)
        if prof is not None and s + 1 == opts["warmup"]:
            prof.stop()
            peak = memory_peak(prof, marker)
            prof = None
    if prof is not None:  # no warm-up step: nothing was measured
        prof.stop()
    queue.put({"rank": rank, "what": what, "losses": losses, "step_times_s": times,
               "peak_tensor_bytes": peak})
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_ranks(dir_, mode, steps, warmup, fsdp_api="2", memory=True):
    """Runs the two ranks; returns the record (rank 0's times, every rank's peak)."""
    # One thread per rank, for OpenMP and MKL too, before the ranks import torch.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    opts = {"dir": dir_, "mode": mode, "steps": steps, "warmup": warmup,
            "fsdp_api": fsdp_api, "memory": memory and warmup > 0}
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, opts, queue), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    ranks, deadline = [], time.monotonic() + 1800
    while len(ranks) < WORLD:
        try:
            ranks.append(queue.get(timeout=5))
            continue
        except queue_module.Empty:
            pass
        codes = [p.exitcode for p in procs]
        if any(code not in (None, 0) for code in codes) or time.monotonic() > deadline:
            for p in procs:
                p.terminate()
            raise SystemExit(f"the ranks did not finish (exit codes {codes}; a rank that "
                             "failed printed its error above)")
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise SystemExit(f"a rank exited with {p.exitcode}")
    ranks.sort(key=lambda r: r["rank"])
    import torch
    import transformers

    times = ranks[0]["step_times_s"]
    return {"peer": "torch.distributed", "mode": mode, "what": ranks[0]["what"],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "world": WORLD, "batch": BATCH, "seq": SEQ, "threads_per_rank": 1,
            "warmup_steps": warmup, "timed_steps": steps,
            "step_median_s": statistics.median(times) if times else None,
            "step_times_s": times, "losses": ranks[0]["losses"],
            "peak_tensor_bytes_per_rank": [r["peak_tensor_bytes"] for r in ranks]}


def check_dir(dir_):
    for name in ("weights/config.json", "weights/model.safetensors", "batch.safetensors"):
        if not os.path.isfile(os.path.join(dir_, name)):
            fail(f"--dir {dir_!r} has no {name} (run `dist_peer.py prepare` first)")


def train(args):
    check_dir(args.dir)
    record = train_ranks(args.dir, args.mode, args.steps, args.warmup, args.fsdp_api)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    peaks = ", ".join("-" if p is None else f"{p / 2**20:.1f} MiB"
                      for p in record["peak_tensor_bytes_per_rank"])
    median = record["step_median_s"]
    print(f"{args.mode}: {record['what']}: step median "
          f"{'-' if median is None else f'{median * 1e3:.0f} ms'} over {args.steps} steps, "
          f"peak per rank {peaks}", file=sys.stderr)
    return 0 if all(math.isfinite(x) for x in record["losses"]) else 1


# ---------------------------------------------------------------------------------------
# check: the losses of both sides over the same steps


def gradscope_losses(gradscope, dir_, mode, steps):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [gradscope, "run", *gradscope_flags(os.path.join(dir_, "weights"), mode, steps, 0),
               "--threads", "1", "--eval-batches", "1", "--no-db", "--quiet", "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            record = json.load(f)
    if record.get("status") != "ok":
        raise SystemExit(f"gradscope --shard {mode} ended {record.get('status')}")
    return [s["loss"] for s in record["steps"]]


def check(args):
    check_dir(args.dir)
    from safetensors import safe_open

    with safe_open(os.path.join(args.dir, "batch.safetensors"), "pt") as f:
        samples = f.get_slice("input_ids").get_shape()[0]
    if samples < args.steps * WORLD * BATCH:
        fail(f"--steps {args.steps} needs {args.steps * WORLD * BATCH} samples; "
             f"{args.dir}/batch.safetensors holds {samples} (prepare --samples)")
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            fail(f"--modes: {mode!r} is none of {', '.join(MODES)}")
    result, worst = {"steps": args.steps, "tolerance": args.tolerance, "modes": {}}, 0.0
    for mode in modes:
        ours = gradscope_losses(args.gradscope, args.dir, mode, args.steps)
        theirs = train_ranks(args.dir, mode, args.steps, 0, args.fsdp_api, memory=False)
        if len(ours) != len(theirs["losses"]):
            raise SystemExit(f"{mode}: gradscope recorded {len(ours)} steps, torch "
                             f"{len(theirs['losses'])}")
        rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs["losses"])]
        result["modes"][mode] = {"what": theirs["what"], "gradscope": ours,
                                 "torch": theirs["losses"], "relative": rel,
                                 "max_relative": max(rel)}
        worst = max(worst, max(rel))
        print(f"{mode} ({theirs['what']}): max relative difference {max(rel):.3e}")
        print("  step  gradscope            torch                relative")
        for i, (a, b, r) in enumerate(zip(ours, theirs["losses"], rel)):
            print(f"  {i + 1:4d}  {a:.17g}  {b:.17g}  {r:.2e}")
    result["max_relative"] = worst
    result["agree"] = worst <= args.tolerance
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["agree"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prepare", help="gradscope writes the weights and the samples")
    pre.add_argument("--gradscope", required=True, help="the gradscope binary")
    pre.add_argument("--dir", required=True)
    pre.add_argument("--samples", type=int, default=40,
                     help="samples of the stream (steps x the global batch of 4)")
    t = sub.add_parser("train", help="time torch.distributed's counterpart of a mode")
    c = sub.add_parser("check", help="both sides' losses over the same steps")
    for q in (t, c):
        q.add_argument("--dir", required=True, help="what `prepare` wrote")
        q.add_argument("--steps", type=int, default=10)
        q.add_argument("--fsdp-api", choices=["1", "2"], default="2",
                       help="zero2 and fsdp: FSDP2's fully_shard (default) or FSDP1")
        q.add_argument("--json", default=None)
    t.add_argument("--mode", choices=MODES, required=True)
    t.add_argument("--warmup", type=int, default=2,
                   help="untimed steps before the timed ones; the peak is theirs")
    c.add_argument("--gradscope", required=True, help="the gradscope binary")
    c.add_argument("--modes", default=",".join(MODES))
    c.add_argument("--tolerance", type=float, default=1e-5,
                   help="the largest relative difference of a step's loss")
    args = p.parse_args()
    for name in ("samples", "steps"):
        if getattr(args, name, 1) < 1:
            fail(f"--{name} must be at least 1")
    if getattr(args, "tolerance", 1) <= 0:
        fail("--tolerance must be positive")
    if getattr(args, "warmup", 0) < 0:
        fail("--warmup must not be negative")
    if getattr(args, "gradscope", None) is not None and not os.access(args.gradscope, os.X_OK):
        fail(f"--gradscope {args.gradscope!r} is not an executable file")
    sys.exit({"prepare": prepare, "train": train, "check": check}[args.command](args))


if __name__ == "__main__":
    main()
