"""Shared harness of the peer benchmarks: command line, threads, the timed training loop,
memory measurements and the JSON record.

A peer is one of gradscope's models as PyTorch users run it (transformers' own model, or a
plain PyTorch implementation of the same math), trained with the textbook loop

    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    loss.backward()
    optimizer.step()

so that gradscope's step time and memory can be read beside what PyTorch itself does with
the same LibTorch, the same thread count and the same configuration.

The model scripts (hf_peer.py, llama_peer.py) build the model and the batch; everything
else lives here.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch


# ---------------------------------------------------------------------------------------
# Command line


def make_parser(description, peer_defaults, presets=True):
    """The options every peer takes. peer_defaults: {"batch": ..., "seq": ... or None}.
    presets: whether the peer picks its size by --preset (otherwise from a file of its own)."""
    p = argparse.ArgumentParser(description=description)
    if presets:
        p.add_argument("--preset", choices=["tiny", "small"], default="tiny",
                       help="gradscope preset to match (default: tiny)")
    p.add_argument("--batch", type=int, default=peer_defaults["batch"],
                   help="batch size in samples (default: %(default)s, as gradscope)")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps (default: 10)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed optimizer steps before the timed ones (default: 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op and inter-op threads; MKL's follow (default: 1)")
    p.add_argument("--optimizer", choices=["adam", "adamw", "sgd"], default="adam",
                   help="torch.optim.Adam, AdamW or SGD (default: adam)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: gradscope's, 1e-3 for adam and adamw, 1e-2 "
                   "for sgd)")
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="AdamW's decoupled weight decay (default: 0, as gradscope's; "
                   "torch.optim.AdamW's own default is 0.01)")
    p.add_argument("--momentum", type=float, default=0.0,
                   help="SGD momentum (default: 0, as gradscope)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: 0)")
    p.add_argument("--json", metavar="OUT", default=None, help="write the result record here")
    p.add_argument("--no-memory-profile", action="store_true",
                   help="skip the separate, untimed step that measures peak tensor bytes")
    return p


def default_lr(optimizer):
    # gradscope's defaults for the transformer models (`gradscope list`).
    return {"adam": 1e-3, "adamw": 1e-3, "sgd": 1e-2}[optimizer]


# ---------------------------------------------------------------------------------------
# Threads


def set_threads(threads):
    """Sets intra-op and inter-op threads, as gradscope's --threads does for the first; MKL,
    the wheel's BLAS, takes its threads from the same OpenMP pool. Must run before any
    parallel work (inter-op threads can only be set once, before first use). Returns MKL's
    thread count now in force, or None without MKL."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass  # already set or already used; the record echoes what is in force
    for line in torch.__config__.parallel_info().splitlines():
        if line.strip().startswith("mkl_get_max_threads()"):
            return int(line.split(":")[1])
    return None


# ---------------------------------------------------------------------------------------
# Memory


def current_rss_bytes():
    """Resident set size now (not the peak), from /proc; None where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes():
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def live_tensor_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (views and shared storages once)."""
    seen = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer):
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def measure_peak_tensor_bytes(step_fn, live_before):
    """Peak bytes of live CPU tensor storage during one call of step_fn.

    PyTorch has no CPU allocator statistics, but its profiler with profile_memory=True
    records every allocation and free of the CPU allocator (the allocator gradscope replaces
    with its tracking one, so both count the same thing) as "[memory]" events carrying
    signed byte counts. The running sum of these events in time order is the change of live
    bytes since the profiler started; its maximum plus what was live before (`live_before`:
    parameters, optimizer state, the batch) is the step's peak.

    Returns (peak_bytes, detail dict)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step_fn()
    # The raw (Kineto) events keep every allocation as its own event; the aggregated
    # function events fold allocations into the op that made them and lose their order.
    raw = prof.profiler.kineto_results.events()
    memory = [(e.start_ns(), i, e.nbytes()) for i, e in enumerate(raw) if e.name() == "[memory]"]
    memory.sort()  # by time, ties in recording order
    running, highest = 0, 0
    for _, _, nbytes in memory:
        running += nbytes
        highest = max(highest, running)
    detail = {
        "method": "torch.profiler profile_memory: live bytes before the step + max running "
                  "sum of allocator events during one step (zero_grad to optimizer.step)",
        "live_before_bytes": live_before,
        "step_increase_peak_bytes": highest,
        "step_net_bytes": running,
        "allocator_events": len(memory),
    }
    return live_before + highest, detail


# ---------------------------------------------------------------------------------------
# The run


def run(args, peer, build):
    """Runs one peer benchmark.

    build(args) -> dict with
      model      the nn.Module (train mode is set here)
      loss_fn    loss_fn(model) -> scalar mean loss over the batch's targets
      inputs     the tensors of the batch (for the memory baseline)
      config     the architecture echo (Hugging Face names, as gradscope's record)
      flops_per_step  analytical training FLOPs of one step, or None
    build must create the batch before the model (so that baseline_rss_bytes, read by the
    callback `build` receives as args.mark_baseline, counts the data but not the model).
    """
    blas_threads = set_threads(args.threads)
    lr = args.lr if args.lr is not None else default_lr(args.optimizer)
    torch.manual_seed(args.seed)  # dropout masks; weights and data use their own generators

    baseline = {}
    args.mark_baseline = lambda: baseline.setdefault("rss", current_rss_bytes())
    built = build(args)
    model, loss_fn = built["model"], built["loss_fn"]
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)

    # Adam and AdamW fused (one kernel over each parameter), as Hugging Face's Trainer runs
    # AdamW by default with torch >= 2.8 ("adamw_torch_fused") and as gradscope steps them
    # (ATen's fused kernels); torch.optim's default on CPU tensors is a loop of element-wise
    # operations per parameter.
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(params, lr=lr, fused=True)
    elif args.optimizer == "adamw":
        # gradscope's AdamW defaults: betas (0.9, 0.999) and eps 1e-8, LibTorch's.
        optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8,
                                      weight_decay=args.weight_decay, fused=True)
    else:
        optimizer = torch.optim.SGD(params, lr=lr, momentum=args.momentum)

    def train_step(loss_of=loss_fn):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model)
        loss.backward()
        optimizer.step()
        # Read every step, as gradscope records the loss of every step.
        return loss.item()

    losses, step_times = [], []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = train_step()
        elapsed = time.perf_counter() - t0
        losses.append(loss)
        if step >= args.warmup:
            step_times.append(elapsed)
    # Read before the profiled step below, whose bookkeeping would inflate it.
    peak_rss = peak_rss_bytes()

    peak_tensor, peak_detail = None, None
    if args.no_memory_profile:
        peak_detail = {"reason": "skipped (--no-memory-profile)"}
    else:
        if not optimizer.state:  # no step yet (--warmup 0 --steps 0): create the state first
            train_step()
        # Gradients are freed at the start of each step; free them now so that what is live
        # before the profiled step is parameters, optimizer state and the batch.
        optimizer.zero_grad(set_to_none=True)
        # A script may profile another batch than it times (built["profile_batch"]: its
        # tensors and loss), one whose memory is the one to compare.
        profile_inputs, profile_loss = built.get("profile_batch") or (built["inputs"], loss_fn)
        live_before = live_tensor_bytes(
            list(model.parameters()) + list(model.buffers()) +
            list(optimizer_state_tensors(optimizer)) + list(profile_inputs))

        peak_tensor, peak_detail = measure_peak_tensor_bytes(
            lambda: train_step(profile_loss), live_before)

    record = {
        "peer": peer,
        "params": n_params,
        "step_median_s": statistics.median(step_times) if step_times else None,
        "step_min_s": min(step_times) if step_times else None,
        "step_times_s": step_times,
        "losses": losses,
        "first_loss": losses[0] if losses else None,
        "peak_rss_bytes": peak_rss,
        "baseline_rss_bytes": baseline.get("rss"),
        "peak_tensor_bytes": peak_tensor,
        "peak_tensor_detail": peak_detail,
        "params_bytes": live_tensor_bytes(model.parameters()),
        "optimizer_state_bytes": live_tensor_bytes(optimizer_state_tensors(optimizer)),
        "flops_per_step": built.get("flops_per_step"),
        "threads": args.threads,
        "threads_in_force": {"intra_op": torch.get_num_threads(),
                             "inter_op": torch.get_num_interop_threads(),
                             "mkl": blas_threads},
        "torch": torch.__version__,
        "config": {
            "preset": getattr(args, "preset", None),
            "batch": args.batch,
            "seq_len": built.get("seq_len"),
            "attention": getattr(args, "attention", None),
            "steps": args.steps,
            "warmup_steps": args.warmup,
            "optimizer": args.optimizer,
            "lr": lr,
            "momentum": args.momentum if args.optimizer == "sgd" else None,
            "weight_decay": args.weight_decay if args.optimizer == "adamw" else None,
            "seed": args.seed,
            "arch": built["config"],
        },
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")

    def mib(x):
        return "n/a" if x is None else f"{x / 2**20:.1f} MiB"

    median = record["step_median_s"]
    preset = getattr(args, "preset", None)
    print(f"{peer}{' ' + preset if preset else ''}: {n_params:,} params, batch {args.batch}"
          + (f", seq {built['seq_len']}" if built.get("seq_len") else "")
          + f", {args.threads} thread(s): step median "
          + ("n/a" if median is None else f"{median:.4f} s")
          + f" over {len(step_times)} steps, first loss "
          + ("n/a" if not losses else f"{losses[0]:.4f}")
          + (f" (ln {built['num_classes']} = {math.log(built['num_classes']):.4f})"
             if built.get("num_classes") else "")
          + f", peak tensors {mib(peak_tensor)}, peak RSS {mib(peak_rss)}",
          file=sys.stderr)
    return record
