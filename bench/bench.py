#!/usr/bin/env python3
"""gradscope's benchmarks: `make bench` runs them all and writes bench/results.md.

Every comparison is a ratio measured side by side: the two sides of a pair run one after the
other, the order alternating from pair to pair, so that drift in the machine's speed hits
both alike. The table gives min / median / max over the pairs, the target, and whether the
median meets it. Benchmarks are not tests: nothing here fails the build.

  transformers gradscope's Llama, ViT and ModernBERT against Hugging Face transformers' own
               models at the same architecture (bench/peers/hf_peer.py), sdpa and written-out
               attention on both sides, AdamW: step time and peak tensor memory, ours / theirs
  peers        gradscope's Llama against a plain PyTorch Llama with the same math
               (bench/peers/llama_peer.py): step time and peak tensor memory, ours / peer; the
               step time also against the peer run with gradscope's heap settings (freed memory
               kept in the heap)
  limit        achieved FLOP/s of the Llama `small` step against the fp32 GEMM peak that
               `gradscope probe` measures in the same run, and where the rest goes by phase;
               the same with --projections packed, --loss chunked and both, run interleaved
               with the plain step (model FLOPs: 3 x the forward's, whatever is recomputed);
               the step's matrix products timed alone against a square one (gemm_shapes.py)
  attention    --attention sdpa against math: the Llama and ViT `small` steps' time and peak
  checkpoint   checkpointing's step time against standard
  accumulation peak memory of 4 accumulated micro-batches against one micro-batch alone, with
               a gradient buffer (Adam) and without one (SGD with momentum stepped in backward)
  sampler      step time with the sampler thread and phase timing on against both off
  timeline     step time with every timed step on the memory timeline against none, and
               the timeline file's bytes per step
  ranks        the Llama `small` step of 2 ranks (--shard ddp) against 1 rank at the same
               per-rank batch, one thread per rank; zero2 and fsdp at 2 ranks against ddp; the
               communication per step and the share of it overlapped with backward; fsdp's
               blocks reduce-scattered against all-reduced (step time)
  distributed  the same sharded steps (--shard ddp, zero1, zero2, fsdp at 2 ranks) against
               torch.distributed's DDP, ZeroRedundancyOptimizer and FSDP2, from the same
               weights on the same samples: step time, peak memory per rank, the losses
  collectives  Gloo's reduce-scatter against its all-reduce alone (time and bytes on the
               loopback), on the tensor sizes the sharded steps reduce
  grid         the study's whole grid (240 runs, 3 seeds) at the tiny presets, wall time

  bench/bench.py [--pairs N] [--threads T] [--only transformers,peers,...] [--out FILE]

Run with the project environment's Python (`make bench` does: .venv/bin/python), whose torch
is the one gradscope is built against.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable  # the project environment's (make bench): the pinned torch


def table_text(text, limit=200):
    """Outside text (a run's error line) as a Markdown table cell: one line, no cell breaks,
    no markup, at most `limit` characters."""
    text = " ".join(str(text).split())
    text = text.replace("|", "/").replace("<", "(").replace(">", ")").replace("`", "'")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def log(*args):
    print("bench:", *args, file=sys.stderr, flush=True)


def data_set_bytes(record):
    """Bytes of CPU tensors the run's data set holds (0 when not measured)."""
    return ((record.get("estimate") or {}).get("data_bytes") or 0)


def training_peak(record):
    """The run's peak allocated bytes without its resident data set."""
    return record["memory"]["peak_bytes"] - data_set_bytes(record)


class Failed:
    """A run that did not end ok, and why (the last line of its error output)."""

    def __init__(self, reason):
        self.reason = reason


class Bench:
    def __init__(self, args):
        self.args = args
        self.gs = os.path.join(ROOT, args.gradscope)
        self.tmp = tempfile.mkdtemp(prefix="gradscope-bench-")
        self.rows = []      # result rows for the table
        self.details = {}   # benchmark -> Markdown paragraph under the table
        self.raw = {}       # everything measured, for results.json
        self.counter = 0

    # ---- running things ----

    def gradscope(self, *flags):
        """One `gradscope run` with flags; returns its record."""
        self.counter += 1
        out = os.path.join(self.tmp, f"run-{self.counter}.json")
        cmd = [self.gs, "run", "--threads", str(self.args.threads), "--no-db", "--quiet",
               "--eval-batches", "1", "--json", out, *flags]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            record = json.load(f)
        self.env = record.get("env", {})
        if record["status"] != "ok":
            raise RuntimeError(f"{' '.join(cmd)} ended {record['status']}")
        return record

    def try_gradscope(self, *flags, threads=None):
        """As gradscope(), but a run that fails returns a Failed (with the reason) instead of
        raising, so that one failing configuration does not end the benchmark. `threads`
        overrides --threads for this run (for each rank of a run with several)."""
        self.counter += 1
        out = os.path.join(self.tmp, f"run-{self.counter}.json")
        threads = self.args.threads if threads is None else threads
        cmd = [self.gs, "run", "--threads", str(threads), "--no-db", "--quiet",
               "--eval-batches", "1", "--json", out, *flags]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        record = None
        if os.path.exists(out):
            with open(out) as f:
                try:
                    record = json.load(f)
                except json.JSONDecodeError:
                    record = None
        if done.returncode != 0 or record is None or record.get("status") != "ok":
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            errors = [line for line in lines if line.lower().startswith("error")]
            reason = ((errors or lines)[-1] if lines else
                      f"exit {done.returncode}, status {(record or {}).get('status')}")
            log(f"FAILED: {' '.join(cmd)}: {reason}")
            return Failed(reason)
        self.env = record.get("env", {})
        return record

    # gradscope's heap settings (measure/memory.cpp: mallopt M_MMAP_MAX 0 and M_TRIM_THRESHOLD
    # INT_MAX at start-up) as glibc's environment variables, for a peer run that keeps freed
    # memory in its heap too.
    SAME_HEAP = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}

    def try_peer(self, script, *flags, heap=None):
        """One run of a peer script (bench/peers/) with flags; returns its record, or a Failed
        with the last line of its error output."""
        self.counter += 1
        out = os.path.join(self.tmp, f"peer-{self.counter}.json")
        cmd = [PYTHON, os.path.join(ROOT, "bench", "peers", script), "--threads",
               str(self.args.threads), "--json", out, *flags]
        # glibc's defaults unless `heap` says otherwise, whatever the caller's environment sets.
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(heap or {})
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=env)
        if done.returncode != 0 or not os.path.exists(out):
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            reason = lines[-1] if lines else f"exit {done.returncode}"
            log(f"FAILED: {' '.join(cmd)}: {reason}")
            return Failed(reason)
        with open(out) as f:
            return json.load(f)

    def peer(self, script, *flags, heap=None):
        """As try_peer(), but a run that fails ends the benchmark."""
        record = self.try_peer(script, *flags, heap=heap)
        if isinstance(record, Failed):
            raise RuntimeError(f"{script} failed: {record.reason}")
        return record

    def pairs(self, name, first, second, count=None):
        """Runs `count` (default --pairs) interleaved pairs of (first(), second()), alternating
        which goes first."""
        count = count or self.args.pairs
        results = []
        for i in range(count):
            if i % 2 == 0:
                a = first()
                b = second()
            else:
                b = second()
                a = first()
            results.append((a, b))
            log(f"{name}: pair {i + 1}/{count} done")
        return results

    def rounds(self, name, sides, count=None):
        """Like pairs() for more than two sides: `count` rounds, each running every side of
        `sides` (label -> callable) once, the order rotated from round to round and reversed
        every other round, so that no side always runs just before another. Returns one dict
        label -> result per round."""
        count = count or self.args.pairs
        labels = list(sides)
        results = []
        for i in range(count):
            shift = (i // 2) % len(labels)
            order = labels[shift:] + labels[:shift]
            if i % 2:
                order.reverse()
            results.append({label: sides[label]() for label in order})
            log(f"{name}: round {i + 1}/{count} ({', '.join(order)}) done")
        return results

    @staticmethod
    def target_text(target, better):
        if target is None:  # a figure measured for its own sake, with nothing to meet
            return "measured"
        return f"{'<=' if better == 'lower' else '>='} {target:g}"

    def failed_row(self, name, target, reason, better="lower"):
        """A row whose runs failed: reported as such, with the reason, instead of a number."""
        reason = table_text(reason)
        self.rows.append({
            "benchmark": name, "min": None, "median": None, "max": None, "n": 0,
            "target": self.target_text(target, better),
            "met": None if target is None else False, "unit": "ratio",
            "note": f"FAILED: {reason}"})
        log(f"{name}: FAILED: {reason}")

    def row(self, name, ratios, target, better="lower", unit="ratio", note=""):
        """A row of min / median / max over the pairs; `target` None: measured only, nothing
        to meet (its met column reads '-')."""
        ratios = sorted(ratios)
        med = statistics.median(ratios)
        target_text = self.target_text(target, better)
        if target is None:
            met = None
        elif better == "lower":
            met = med <= target
        else:
            met = med >= target
        self.rows.append({
            "benchmark": name, "min": ratios[0], "median": med, "max": ratios[-1],
            "n": len(ratios), "target": target_text, "met": met, "unit": unit, "note": note})
        log(f"{name}: median {med:.4f} (min {ratios[0]:.4f}, max {ratios[-1]:.4f}, "
            f"{len(ratios)} pairs), target {target_text}"
            f"{'' if met is None else ': met' if met else ': missed'}")

    # ---- benchmarks ----

    def transformers(self):
        """gradscope against transformers' own models (bench/transformers_bench.py)."""
        import transformers_bench
        transformers_bench.run(self, Failed, training_peak)

    def peers(self):
        warmup = "2"
        cases = [
            ("Llama small", "llama_peer.py",
             ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128"],
             ["--preset", "small", "--batch", "8", "--seq", "128"], self.args.steps,
             self.args.pairs),
        ]
        for label, script, ours_flags, peer_flags, case_steps, count in cases:
            steps = str(case_steps)

            def peer_run(heap=None, script=script, peer_flags=peer_flags, steps=steps):
                return self.peer(script, *peer_flags, "--optimizer", "adam", "--steps", steps,
                                 "--warmup", warmup, heap=heap)

            # The peer as people run it (glibc's defaults, which map and fault in every large
            # block afresh each step), and with gradscope's heap settings, so that the second
            # ratio compares the implementations and not the kernel's page faults.
            sides = {
                "gradscope": lambda ours_flags=ours_flags, steps=steps: self.gradscope(
                    *ours_flags, "--optimizer", "adam", "--steps", steps,
                    "--warmup-steps", warmup),
                "peer": peer_run,
                "peer, same heap": lambda: peer_run(self.SAME_HEAP)}
            runs = [(r["gradscope"], r["peer"], r["peer, same heap"])
                    for r in self.rounds(f"peers {label}", sides, count)]
            time_ratios = [a["time"]["step_median_s"] / b["step_median_s"] for a, b, _ in runs]
            same_heap_ratios = [a["time"]["step_median_s"] / c["step_median_s"]
                                for a, _, c in runs]
            # gradscope's peak includes what the data set keeps as tensors (measured while
            # loading, the record's estimate.data_bytes); a peer holds one batch of random
            # inputs only.
            mem_ratios = [training_peak(a) / b["peak_tensor_bytes"] for a, b, _ in runs
                          if b.get("peak_tensor_bytes")]
            name = f"{label}, {self.args.threads} thread(s)"
            self.row(f"{name}: step time, gradscope / {runs[0][1]['peer']}", time_ratios, 1.0,
                     note="aim 0.95")
            self.row(f"{name}: step time, gradscope / {runs[0][1]['peer']} with gradscope's "
                     "heap settings", same_heap_ratios, 1.0, note="aim 0.95")
            if mem_ratios:
                self.row(f"{name}: peak tensor memory (without the data set), gradscope / "
                         f"{runs[0][1]['peer']}", mem_ratios, 1.0)
            self.raw[f"peers {name}"] = [
                {"ours_step_median_s": a["time"]["step_median_s"],
                 "peer_step_median_s": b["step_median_s"],
                 "peer_same_heap_step_median_s": c["step_median_s"],
                 "ours_peak_bytes": a["memory"]["peak_bytes"],
                 "ours_data_set_bytes": data_set_bytes(a),
                 "peer_peak_tensor_bytes": b.get("peak_tensor_bytes"),
                 "ours_params": a["params"], "peer_params": b["params"]} for a, b, c in runs]
            if label == "Llama small":
                self.llama_records = [a for a, _, _ in runs]

    def probe(self):
        self.counter += 1
        out = os.path.join(self.tmp, f"probe-{self.counter}.json")
        subprocess.run([self.gs, "probe", "--threads", str(self.args.threads), "--no-db",
                        "--json", out], check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            probe = json.load(f)
        return probe["peak"]["fp32"]

    LLAMA_SMALL = ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128",
                   "--optimizer", "adam"]
    # The plain step and the settings that change how it computes, measured side by side.
    LIMIT_VARIANTS = [
        ("separate, full loss", []),
        ("--projections packed", ["--projections", "packed"]),
        ("--loss chunked", ["--loss", "chunked"]),
        ("packed + chunked", ["--projections", "packed", "--loss", "chunked"]),
    ]

    # Warm-up steps before the limit's timed ones. On the CPU the full loss's first steps are
    # slow while the heap still grows (measured on the 2-core machine: 3.8 s, 2.3 s and, in
    # some runs, 2.2 s for the third step, with 50,000 more page faults, then 1.3 s a step).
    # The record's FLOP/s is the timed steps' mean. Three warm-up steps keep the first steps'
    # growth out of the timed window, but the full loss's heap can still grow once in a later
    # step: the table's last column shows whether the window was steady.
    LIMIT_WARMUP = 3
    # The share of the GEMM peak the plain step should reach, at any thread count.
    LIMIT_TARGET = 0.75

    @staticmethod
    def slowest_over_median(record):
        times = [s["time_s"] for s in record.get("steps", []) if not s.get("warmup")]
        return max(times) / statistics.median(times) if times else float("nan")

    def limit(self):
        # The probe before and after the training runs; the higher is the peak.
        peak_before = self.probe()
        steps = str(self.args.steps)
        warmup = str(self.LIMIT_WARMUP)
        sides = {label: (lambda extra=extra: self.try_gradscope(
                     *self.LLAMA_SMALL, *extra, "--steps", steps, "--warmup-steps", warmup))
                 for label, extra in self.LIMIT_VARIANTS}
        runs = self.rounds("limit", sides)
        peak = max(peak_before, self.probe())
        base_label = self.LIMIT_VARIANTS[0][0]

        def ok(r):
            return not isinstance(r, Failed)

        summary = []
        for label, extra in self.LIMIT_VARIANTS:
            records = [rnd[label] for rnd in runs if ok(rnd[label])]
            failures = [rnd[label] for rnd in runs if not ok(rnd[label])]
            threads = f"{self.args.threads} thread(s)"
            name = (f"Llama small, {threads}: achieved FLOP/s / fp32 GEMM peak (probe)"
                    if not extra else
                    f"Llama small {' '.join(extra)}, {threads}: achieved model FLOP/s / fp32 "
                    "GEMM peak")
            if not records:
                self.failed_row(name, self.LIMIT_TARGET, failures[0].reason, better="higher")
                summary.append((label, None, failures))
                continue
            self.row(name, [r["flops"]["achieved_per_s"] / peak for r in records],
                     self.LIMIT_TARGET,
                     better="higher", unit="fraction",
                     note=f"{len(failures)} run(s) failed" if failures else "")
            if extra:
                ratios = [rnd[label]["time"]["step_median_s"] /
                          rnd[base_label]["time"]["step_median_s"]
                          for rnd in runs if ok(rnd[label]) and ok(rnd[base_label])]
                if ratios:
                    self.row(f"Llama small, {threads}: step time {' '.join(extra)} / "
                             "separate, full loss", ratios, 1.0)
            summary.append((label, records, failures))

        # Where the time goes in the plain step: per phase, its share of the step and the
        # FLOP/s it reaches (forward 1/3 and backward 2/3 of the step's FLOPs).
        base = summary[0][1]
        lines = []
        raw = {"peak_flops_per_s": [peak_before, peak]}
        if base:
            raw["fractions"] = [r["flops"]["achieved_per_s"] / peak for r in base]
            r = base[len(base) // 2]
            t = r["time"]
            n = t["timed_steps"]
            per_step = r["flops"]["per_step"]
            phases = [("data", t["data_s"], 0.0), ("forward", t["forward_s"], per_step / 3),
                      ("backward", t["backward_s"], 2 * per_step / 3),
                      ("optimizer", t["optimizer_s"], 0.0)]
            total = sum(s for _, s, _ in phases)
            lines = [f"Llama small (batch 8 x 128 tokens, {r['params']:,} parameters), one run: "
                     f"{per_step / 1e9:.1f} GFLOP per step, fp32 GEMM peak {peak / 1e9:.1f} "
                     f"GFLOP/s ({self.args.threads} thread(s)).", "",
                     "| phase | time per step | share | FLOP/s | of peak |",
                     "|---|---|---|---|---|"]
            for name, seconds, flops in phases:
                per = seconds / n
                rate = flops / per if flops and per > 0 else None
                lines.append(f"| {name} | {1e3 * per:.1f} ms | {100 * seconds / total:.1f}% | "
                             f"{'%.1f G' % (rate / 1e9) if rate else '-'} | "
                             f"{'%.0f%%' % (100 * rate / peak) if rate else '-'} |")
            lines.append("")
            raw["phases"] = {name: s / n for name, s, _ in phases}
        # The variants side by side, medians over the rounds. FLOP/s counts the model's FLOPs
        # (3 x the forward's), the same for every variant, which all compute the same matrix
        # products (the chunked loss takes the head's gradients in forward, so its forward is
        # longer and its backward shorter).
        lines += [f"The step's variants, run interleaved ({self.args.pairs} rounds; medians), "
                  f"{self.args.steps} timed steps after {self.LIMIT_WARMUP} warm-up steps. "
                  "FLOP/s counts model FLOPs, 3 x the forward's, the same for every variant; "
                  "the chunked loss takes the head's gradients in forward (its forward is longer, "
                  "its backward shorter). Of peak: the record's model FLOP/s (the mean over "
                  "the timed steps) over the peak; of peak, median step: the FLOPs of a step "
                  "over the median step's time, over the peak. Slowest / median: the slowest "
                  "timed step over the median one, near 1 when the timed window was steady.", "",
                  "| variant | step | forward | backward | model FLOP/s | of peak | of peak, median "
                  "step | peak memory | slowest / median step |",
                  "|---|---|---|---|---|---|---|---|---|"]
        raw_variants = {}
        for label, records, failures in summary:
            if not records:
                lines.append(f"| {label} | failed: {table_text(failures[0].reason)} | | | | | "
                             "| | |")
                raw_variants[label] = {"failed": [f.reason for f in failures]}
                continue
            med = lambda key: statistics.median(key(r) for r in records)  # noqa: E731
            step = med(lambda r: r["time"]["step_median_s"])
            fwd = med(lambda r: r["time"]["forward_s"] / r["time"]["timed_steps"])
            bwd = med(lambda r: r["time"]["backward_s"] / r["time"]["timed_steps"])
            rate = med(lambda r: r["flops"]["achieved_per_s"])
            mem = med(lambda r: r["memory"]["peak_bytes"])
            steadiness = med(self.slowest_over_median)
            # The model FLOP/s of the median timed step: what a step reaches when no step of
            # the window is slowed by something else (the record's FLOP/s is the mean).
            median_rate = med(lambda r: r["flops"]["per_step"] / r["time"]["step_median_s"])
            lines.append(f"| {label} | {1e3 * step:.0f} ms | {1e3 * fwd:.0f} ms | "
                         f"{1e3 * bwd:.0f} ms | {rate / 1e9:.1f} G | {100 * rate / peak:.0f}% | "
                         f"{100 * median_rate / peak:.0f}% | {mem / 2**20:.0f} MiB | "
                         f"{steadiness:.2f} |")
            raw_variants[label] = [
                {"step_median_s": r["time"]["step_median_s"],
                 "forward_s": r["time"]["forward_s"], "backward_s": r["time"]["backward_s"],
                 "timed_steps": r["time"]["timed_steps"],
                 "achieved_per_s": r["flops"]["achieved_per_s"],
                 "slowest_over_median_step": self.slowest_over_median(r),
                 "peak_bytes": r["memory"]["peak_bytes"]} for r in records]
        shapes_lines, shapes_raw = self.gemm_shapes(base)
        lines += shapes_lines
        self.details[f"limit, {self.args.threads} thread(s)"] = "\n".join(lines)
        self.raw[f"limit, {self.args.threads} thread(s)"] = {**raw, "variants": raw_variants,
                                                              "products": shapes_raw}

    def gemm_shapes(self, base):
        """The step's matrix products timed alone beside a square one (bench/gemm_shapes.py):
        which fall short of a square product's rate, and how much of the step they take."""
        flags = dict(zip(self.LLAMA_SMALL[::2], self.LLAMA_SMALL[1::2]))
        rows = int(flags["--batch"]) * int(flags["--seq"])
        done = subprocess.run([PYTHON, os.path.join(ROOT, "bench", "gemm_shapes.py"),
                               "--gradscope", self.gs, "--model", flags["--model"],
                               "--preset", flags["--preset"], "--rows", str(rows),
                               "--threads", str(self.args.threads)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.strip()]
            reason = errors[-1] if errors else f"exit {done.returncode}"
            return ["", f"The step's products: failed ({table_text(reason, 120)})."], None
        r = json.loads(done.stdout)
        square = r["square"]
        lines = ["", f"The step's matrix products alone ([gemm_shapes.py](gemm_shapes.py)): "
                 f"each timed with torch.mm into a buffer, {self.args.threads} thread(s), in "
                 f"rounds interleaved with a square {square['size']} x {square['size']} fp32 "
                 f"product (best {square['best_per_s'] / 1e9:.1f}, median "
                 f"{square['median_per_s'] / 1e9:.1f} GFLOP/s). Of square: the product's "
                 "median FLOP/s over the square's best. Layers' products of one shape are "
                 "counted once per layer.", "",
                 "| weight | product | m x k x n | count | median FLOP/s | of square |",
                 "|---|---|---|---|---|---|"]
        for p in r["products"]:
            lines.append(f"| {table_text(p['weight'])} | {table_text(p['product'])} | "
                         f"{p['m']} x {p['k']} x "
                         f"{p['n']} | {p['count']} | {p['median_per_s'] / 1e9:.1f} G | "
                         f"{100 * p['median_per_s'] / square['best_per_s']:.0f}% |")
        products_s = r["products_s_at_median"]
        if base:
            step = statistics.median(x["time"]["step_median_s"] for x in base)
            lines += ["", f"The step's {r['products_flops'] / 1e9:.1f} GFLOP of products at "
                      f"these median rates: {1e3 * products_s:.0f} ms "
                      f"({r['products_flops'] / products_s / 1e9:.1f} GFLOP/s, "
                      f"{100 * r['products_flops'] / products_s / square['best_per_s']:.0f}% "
                      f"of the square's best). The plain step's median above, measured in "
                      f"other processes minutes apart: {1e3 * step:.0f} ms; the difference, "
                      f"{1e3 * (step - products_s):.0f} ms "
                      f"({100 * (step - products_s) / step:.0f}%), is what the step spends "
                      "outside these products (the loss's softmax, norms, attention, "
                      "activations, the data and the optimizer), to the machine's noise "
                      "between the two measurements."]
        return lines, r

    # --attention sdpa against math: the step and its peak, side by side, on the two models
    # whose attention differs most in shape (the Llama's causal grouped-query attention over
    # 128 positions, ViT's bidirectional attention over 65 patches).
    ATTENTION_CASES = [
        ("Llama small", ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128",
                         "--optimizer", "adam"], 1),
        ("ViT small", ["--model", "vit", "--preset", "small", "--batch", "8",
                       "--optimizer", "adam"], 3),
    ]

    def attention(self):
        lines = ["Attention: `--attention sdpa` (LibTorch's fused kernel) against `--attention "
                 f"math` (written out), {self.args.threads} thread(s), {self.args.steps} timed "
                 "steps after 2 warm-up steps (ViT: three times the steps and the pairs), pairs "
                 "interleaved; medians.", "",
                 "| model | step, sdpa | step, math | peak, sdpa | peak, math | activations, "
                 "sdpa | activations, math |", "|---|---|---|---|---|---|---|"]
        raw = {}
        for label, flags, scale in self.ATTENTION_CASES:
            steps = str(scale * self.args.steps)
            run = lambda path, flags=flags, steps=steps: self.try_gradscope(  # noqa: E731
                *flags, "--attention", path, "--steps", steps, "--warmup-steps", "2")
            runs = self.pairs(f"attention {label}", lambda: run("sdpa"), lambda: run("math"),
                              scale * self.args.pairs)
            good = [(a, b) for a, b in runs
                    if not isinstance(a, Failed) and not isinstance(b, Failed)]
            name = f"{label}, {self.args.threads} thread(s): step time, --attention sdpa / math"
            mem_name = (f"{label}, {self.args.threads} thread(s): peak memory, --attention sdpa "
                        "/ math")
            if not good:
                reason = next(r.reason for pair in runs for r in pair if isinstance(r, Failed))
                self.failed_row(name, None, reason)
                self.failed_row(mem_name, None, reason)
                continue
            self.row(name, [a["time"]["step_median_s"] / b["time"]["step_median_s"]
                            for a, b in good], None)
            self.row(mem_name, [a["memory"]["peak_bytes"] / b["memory"]["peak_bytes"]
                                for a, b in good], None)
            med = lambda side, key: statistics.median(  # noqa: E731
                key(pair[side]) for pair in good)
            step = lambda r: r["time"]["step_median_s"]  # noqa: E731
            peak = lambda r: r["memory"]["peak_bytes"]  # noqa: E731
            act = lambda r: r["memory"]["activations_peak_bytes"]  # noqa: E731
            lines.append(f"| {label} | {1e3 * med(0, step):.0f} ms | {1e3 * med(1, step):.0f} ms "
                         f"| {med(0, peak) / 2**20:.1f} MiB | {med(1, peak) / 2**20:.1f} MiB | "
                         f"{med(0, act) / 2**20:.1f} MiB | {med(1, act) / 2**20:.1f} MiB |")
            raw[label] = [{"sdpa_step_median_s": step(a), "math_step_median_s": step(b),
                           "sdpa_peak_bytes": peak(a), "math_peak_bytes": peak(b),
                           "sdpa_activations_peak_bytes": act(a),
                           "math_activations_peak_bytes": act(b)} for a, b in good]
        self.details[f"attention, {self.args.threads} thread(s)"] = "\n".join(lines)
        self.raw[f"attention, {self.args.threads} thread(s)"] = raw

    def collectives(self):
        # Gloo's reduce-scatter against its all-reduce on the tensor sizes zero2 and fsdp
        # reduce, two processes of the environment's torch.distributed (the Gloo that
        # gradscope links): the collectives alone, beside `ranks`, which measures fsdp's step
        # with either.
        self.counter += 1
        out = os.path.join(self.tmp, f"collectives-{self.counter}.json")
        done = subprocess.run([PYTHON, os.path.join(ROOT, "bench", "peers", "collectives_peer.py"),
                               "--rounds", str(self.args.pairs), "--json", out],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0 or not os.path.exists(out):
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            self.failed_row("Gloo, 2 ranks: reduce-scatter / all-reduce time", None,
                            lines[-1] if lines else f"exit {done.returncode}")
            return
        with open(out) as f:
            result = json.load(f)
        lines = ["Collectives: Gloo's reduce-scatter (`reduce_scatter_tensor`) against its "
                 "all-reduce, 2 processes on this machine's loopback, 1 thread each, "
                 f"{result['rounds']} interleaved rounds (medians). Sent: the loopback "
                 "interface's bytes during the collective, both ranks together.", "",
                 "| tensor | all-reduce | reduce-scatter | sent, all-reduce | sent, "
                 "reduce-scatter |", "|---|---|---|---|---|"]
        for case in result["cases"]:
            mib = case["bytes"] / 2**20
            # No target: a measurement of the collectives alone (`ranks` decides fsdp's
            # default from the step).
            self.row(f"Gloo, 2 ranks, {mib:.0f} MiB: reduce-scatter / all-reduce time",
                     [rs / ar for rs, ar in zip(case["reduce_scatter_s"], case["allreduce_s"])],
                     None)
            lines.append(
                f"| {mib:.0f} MiB | {1e3 * statistics.median(case['allreduce_s']):.1f} ms | "
                f"{1e3 * statistics.median(case['reduce_scatter_s']):.1f} ms | "
                f"{statistics.median(case['allreduce_sent']) / 2**20:.1f} MiB | "
                f"{statistics.median(case['reduce_scatter_sent']) / 2**20:.1f} MiB |")
        self.details["collectives"] = "\n".join(lines)
        self.raw["collectives"] = result

    def checkpoint(self):
        base = ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128",
                "--optimizer", "adam", "--steps", str(self.args.steps), "--warmup-steps", "1"]
        runs = self.pairs("checkpoint",
                          lambda: self.gradscope(*base, "--strategy", "checkpoint"),
                          lambda: self.gradscope(*base, "--strategy", "standard"))
        self.row(f"Llama small, {self.args.threads} thread(s): checkpoint / standard step time",
                 [a["time"]["step_median_s"] / b["time"]["step_median_s"] for a, b in runs], 1.35)
        self.raw["checkpoint"] = [[a["time"]["step_median_s"], b["time"]["step_median_s"],
                                   a["memory"]["peak_bytes"], b["memory"]["peak_bytes"]]
                                  for a, b in runs]

    def accumulation(self):
        base = ["--model", "llama", "--preset", "small", "--seq", "128", "--batch", "2",
                "--steps", "2", "--warmup-steps", "1"]
        adam = ["--optimizer", "adam"]
        # Peak memory is counted exactly by the allocator: one pair per repetition is plenty.
        count = max(1, min(3, self.args.pairs))
        runs = [(self.gradscope(*base, *adam, "--strategy", "accumulation", "--accum-steps", "4"),
                 self.gradscope(*base, *adam, "--strategy", "standard"))
                for _ in range(count)]
        self.row("Llama small: accumulation k=4 peak / one micro-batch (2) peak",
                 [a["memory"]["peak_bytes"] / b["memory"]["peak_bytes"] for a, b in runs], 1.05)
        self.raw["accumulation"] = [[a["memory"]["peak_bytes"], b["memory"]["peak_bytes"]]
                                    for a, b in runs]
        # Without a gradient buffer: each parameter's gradient is folded into the optimizer's
        # state as backward produces it, against one micro-batch with the same optimizer.
        sgd = ["--optimizer", "sgd", "--opt", "momentum=0.9"]
        name = ("Llama small: accumulation k=4 without a gradient buffer (SGD momentum 0.9, "
                "optimizer step in backward) peak / one micro-batch (2) peak")
        fused = [(self.try_gradscope(*base, *sgd, "--accum-steps", "4", "--optimizer-step",
                                     "in-backward"),
                  self.try_gradscope(*base, *sgd)) for _ in range(count)]
        good = [(a, b) for a, b in fused if not isinstance(a, Failed) and
                not isinstance(b, Failed)]
        if good:
            self.row(name, [a["memory"]["peak_bytes"] / b["memory"]["peak_bytes"]
                            for a, b in good], 1.05)
        else:
            self.failed_row(name, 1.05, next(r.reason for pair in fused for r in pair
                                             if isinstance(r, Failed)))
        self.raw["accumulation without a gradient buffer"] = [
            [x.reason if isinstance(x, Failed) else x["memory"]["peak_bytes"] for x in pair]
            for pair in fused]

    def timeline(self):
        """The memory timeline's cost: the Llama small step with every timed step recorded
        (--memory-timeline, --memory-steps over the whole timed window) against none, and the
        file's bytes per recorded step."""
        steps = self.args.steps
        base = ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128",
                "--optimizer", "adam", "--steps", str(steps), "--warmup-steps", "1"]
        sizes = []

        def on():
            path = os.path.join(self.tmp, f"timeline-{self.counter + 1}.bin")
            record = self.gradscope(*base, "--memory-timeline", path,
                                    "--memory-steps", f"2-{steps + 1}")
            sizes.append(os.path.getsize(path) / steps)
            os.remove(path)
            return record

        runs = self.pairs("timeline", on, lambda: self.gradscope(*base))
        self.row(f"Llama small, {self.args.threads} thread(s): step time with every step on the "
                 "memory timeline / without",
                 [a["time"]["step_median_s"] / b["time"]["step_median_s"] for a, b in runs], 1.10)
        self.details["timeline"] = (
            f"The memory timeline's file: {min(sizes) / 2**20:.2f} to {max(sizes) / 2**20:.2f} "
            f"MiB per recorded step of the Llama small (batch 8, sequence 128).")
        self.raw["timeline"] = [[a["time"]["step_median_s"], b["time"]["step_median_s"], size]
                                for (a, b), size in zip(runs, sizes)]

    def sampler(self):
        base = ["--model", "vit", "--preset", "small", "--batch", "8", "--steps", "20",
                "--warmup-steps", "2"]
        runs = self.pairs("sampler",
                          lambda: self.gradscope(*base, "--sample-period", "0.1"),
                          lambda: self.gradscope(*base, "--sample-period", "0",
                                                 "--no-phase-timing"))
        self.row(f"ViT small, {self.args.threads} thread(s): step time with sampler (100 ms) and "
                 "phase timing / without",
                 [a["time"]["step_median_s"] / b["time"]["step_median_s"] for a, b in runs], 1.02)
        busy = [a["sampler"]["busy_s"] / a["time"]["total_s"] for a, _ in runs]
        self.details["sampler"] = (
            f"The sampler's own measured cost (`sampler.busy_s` over the timed time): "
            f"{100 * min(busy):.3f}% to {100 * max(busy):.3f}%.")

    # The Llama small step at one micro-batch per rank, on one rank and on two. --nproc 2 runs
    # the ranks as child processes of the gradscope process, on one core each.
    RANKS_PRESET = "small"
    RANKS_BATCH = 2
    RANKS_SEQ = 128
    RANKS_BASE = ["--model", "llama", "--preset", RANKS_PRESET, "--batch", str(RANKS_BATCH),
                  "--seq", str(RANKS_SEQ), "--optimizer", "adam", "--steps", "3",
                  "--warmup-steps", "1"]
    RANKS_SIDES = [
        ("1 rank, ddp", ["--nproc", "1", "--shard", "ddp"]),
        ("2 ranks, ddp", ["--nproc", "2", "--shard", "ddp"]),
        ("2 ranks, zero2", ["--nproc", "2", "--shard", "zero2"]),
        ("2 ranks, fsdp", ["--nproc", "2", "--shard", "fsdp"]),
        ("2 ranks, fsdp, reduce-scatter",
         ["--nproc", "2", "--shard", "fsdp", "--grad-reduce", "reduce-scatter"]),
    ]
    # fsdp's blocks reduced both ways: c10d's reduce-scatter against gradscope's all-reduce.
    RANKS_REDUCE = ("2 ranks, fsdp, reduce-scatter", "2 ranks, fsdp")

    def ranks(self):
        # One thread per rank whatever --threads says: 2 ranks fill a 2-core machine, and
        # 1 rank takes one of its cores. Short runs (3 timed steps after 1 warm-up) keep
        # the five sides within about 5 minutes at 5 rounds.
        sides = {label: (lambda extra=extra: self.try_gradscope(
                     *self.RANKS_BASE, *extra, threads=1))
                 for label, extra in self.RANKS_SIDES}
        runs = self.rounds("ranks", sides)
        one, ddp = self.RANKS_SIDES[0][0], self.RANKS_SIDES[1][0]
        prefix = (f"Llama {self.RANKS_PRESET}, batch {self.RANKS_BATCH} x {self.RANKS_SEQ} per "
                  f"rank, 1 thread each")

        def ok(r):
            return not isinstance(r, Failed)

        def step(r):
            return r["time"]["step_median_s"]

        def first_failure(*labels):
            return next(rnd[label].reason for rnd in runs for label in labels
                        if not ok(rnd[label]))

        # 2 ranks against 1 at the same per-rank batch: the step time, and the throughput
        # against twice one rank's (tokens per step double with the ranks).
        both = [rnd for rnd in runs if ok(rnd[one]) and ok(rnd[ddp])]
        name = f"{prefix}: step time, 2 ranks / 1 rank (--shard ddp)"
        eff_name = (f"{prefix}: scaling efficiency, tokens/s of 2 ranks / (2 x tokens/s of "
                    f"1 rank) (--shard ddp)")
        if both:
            self.row(name, [step(rnd[ddp]) / step(rnd[one]) for rnd in both], None)
            self.row(eff_name, [rnd[ddp]["throughput"]["tokens_per_s"] /
                                (2 * rnd[one]["throughput"]["tokens_per_s"]) for rnd in both],
                     None, unit="fraction")
        else:
            reason = first_failure(one, ddp)
            self.failed_row(name, None, reason)
            self.failed_row(eff_name, None, reason)
        for label, extra in self.RANKS_SIDES[2:]:
            flags = " ".join(extra[2:])
            name = f"{prefix}: step time at 2 ranks, {flags} / ddp"
            good = [rnd for rnd in runs if ok(rnd[label]) and ok(rnd[ddp])]
            if good:
                self.row(name, [step(rnd[label]) / step(rnd[ddp]) for rnd in good], None)
            else:
                self.failed_row(name, None, first_failure(label, ddp))
        # fsdp both ways, side by side. No target: fsdp would reduce-scatter by default if
        # every pair were below 0.97 (the noise between these sides is a few percent). The bytes are not compared here: gradscope counts
        # Gloo's reduce-scatter as the all-reduce it runs, and `collectives` measures the
        # loopback's bytes of both.
        scatter, whole = self.RANKS_REDUCE
        good = [rnd for rnd in runs if ok(rnd[scatter]) and ok(rnd[whole])]
        name = f"{prefix}: --shard fsdp step time, --grad-reduce reduce-scatter / all-reduce"
        if good:
            self.row(name, [step(rnd[scatter]) / step(rnd[whole]) for rnd in good], None)
        else:
            self.failed_row(name, None, first_failure(scatter, whole))

        # Each side's figures, medians over the rounds. The record's "distributed" part holds
        # every rank's: comm_s (waiting on collectives over the timed steps), overlapped_share
        # and bytes_sent_per_step; the communication is the mean over the ranks.
        def figures(r):
            ranks = (r.get("distributed") or {}).get("ranks") or []
            t = r["time"]
            n = t["timed_steps"]

            def mean(key):
                values = [k[key] for k in ranks if k.get(key) is not None]
                return statistics.mean(values) if values else None

            comm = mean("comm_s")
            comm = None if comm is None else comm / n
            return {"step_median_s": step(r), "tokens_per_s": r["throughput"]["tokens_per_s"],
                    "forward_per_step_s": None if t["forward_s"] is None else t["forward_s"] / n,
                    "backward_per_step_s": (None if t["backward_s"] is None else
                                            t["backward_s"] / n),
                    "comm_per_step_s": comm,
                    "comm_share": None if comm is None else comm / step(r),
                    "overlapped_share": mean("overlapped_share"),
                    "bytes_sent_per_step": ranks[0].get("bytes_sent_per_step") if ranks else None,
                    "peak_bytes_per_rank": max((k["peak_bytes"] for k in ranks),
                                               default=r["memory"]["peak_bytes"]),
                    "timed_steps": n, "ranks": ranks}

        lines = [f"Ranks: the Llama {self.RANKS_PRESET} step (Adam, micro-batch "
                 f"{self.RANKS_BATCH} x {self.RANKS_SEQ} tokens per rank, one thread per rank, "
                 f"3 timed steps after 1 warm-up), the {len(self.RANKS_SIDES)} sides run "
                 "interleaved "
                 f"({len(runs)} rounds; medians). Forward and backward: rank 0's, per timed "
                 "step, without the wait on collectives. Communication: that wait per timed "
                 "step (the record's `distributed.ranks[*].comm_s` over `time.timed_steps`), "
                 "the mean over the ranks, and its share of the step; overlapped: of the "
                 "gradients all-reduced, the share whose bucket had finished when backward "
                 "ended (mean over the ranks); sent: rank 0's bytes per step by the ring "
                 "algorithms' volume.", "",
                 "| side | step | forward | backward | communication per step | of the step | "
                 "overlapped | sent per step | tokens/s | peak memory per rank |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        raw = {}
        for label, _ in self.RANKS_SIDES:
            records = [rnd[label] for rnd in runs if ok(rnd[label])]
            failures = [rnd[label].reason for rnd in runs if not ok(rnd[label])]
            if not records:
                lines.append(f"| {label} | failed: {table_text(failures[0])} | | | | | | | | |")
                raw[label] = {"failed": failures}
                continue
            figs = [figures(r) for r in records]

            def med(key):
                values = [f[key] for f in figs if f[key] is not None]
                return statistics.median(values) if values else None

            def cell(key, scale, form):
                value = med(key)
                return "-" if value is None else form % (scale * value)

            cells = [cell("step_median_s", 1e3, "%.0f ms"),
                     cell("forward_per_step_s", 1e3, "%.0f ms"),
                     cell("backward_per_step_s", 1e3, "%.0f ms"),
                     cell("comm_per_step_s", 1e3, "%.0f ms"), cell("comm_share", 100, "%.0f%%"),
                     cell("overlapped_share", 100, "%.0f%%"),
                     cell("bytes_sent_per_step", 2**-20, "%.1f MiB"),
                     cell("tokens_per_s", 1, "%.0f"),
                     cell("peak_bytes_per_rank", 2**-20, "%.0f MiB")]
            lines.append(f"| {label} | {' | '.join(cells)} |")
            raw[label] = {"runs": figs, "failed": failures}
        self.details["ranks"] = "\n".join(lines)
        self.raw["ranks"] = raw

    def distributed(self):
        # gradscope's sharded steps (--nproc 2 --shard MODE) against torch.distributed's
        # counterparts (bench/peers/dist_peer.py): transformers' Llama small loaded from the
        # weights gradscope wrote, trained on gradscope's samples with AdamW, 2 ranks on Gloo
        # with one thread each, 2 x 128 tokens per rank. torch runs as people run it (glibc's
        # heap defaults) and with gradscope's heap settings, as in `peers`; the twelve sides
        # run interleaved.
        sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
        import dist_peer
        script = os.path.join(ROOT, "bench", "peers", "dist_peer.py")
        folder, warmup, steps = os.path.join(self.tmp, "distributed"), 2, 4
        prefix = "Llama small, 2 ranks, batch 2 x 128 per rank, 1 thread each"

        def peer(*flags, heap=None):  # dist_peer.py's record, or Failed with its last error
            self.counter += 1
            out = os.path.join(self.tmp, f"dist-{self.counter}.json")
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
            done = subprocess.run([PYTHON, script, *flags, "--json", out],
                                  env={**env, **(heap or {})}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            if done.returncode == 0 and os.path.exists(out):
                with open(out) as f:
                    return json.load(f)
            return Failed(lines[-1] if lines else f"exit {done.returncode}")

        done = subprocess.run([PYTHON, script, "prepare", "--gradscope", self.gs, "--dir",
                               folder, "--samples",
                               str(dist_peer.WORLD * dist_peer.BATCH * max(10, warmup + steps))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            for mode in dist_peer.MODES:
                self.failed_row(f"{prefix}: --shard {mode} step time, gradscope / torch", 1.0,
                                lines[-1] if lines else f"exit {done.returncode}")
            return
        weights = os.path.join(folder, "weights")
        sides = {}
        for mode in dist_peer.MODES:
            sides[f"gradscope {mode}"] = lambda mode=mode: self.try_gradscope(
                *dist_peer.gradscope_flags(weights, mode, steps, warmup), threads=1)
            for label, heap in (("torch", None), ("torch, same heap", self.SAME_HEAP)):
                sides[f"{label} {mode}"] = lambda mode=mode, heap=heap: peer(
                    "train", "--dir", folder, "--mode", mode, "--warmup", str(warmup),
                    "--steps", str(steps), heap=heap)
        runs = self.rounds("distributed", sides)
        check = peer("check", "--gradscope", self.gs, "--dir", folder, "--steps", "10")
        lines = [f"Distributed: gradscope's `--nproc 2 --shard MODE` against torch.distributed"
                 f" ({prefix}; AdamW at gradscope's defaults; {steps} timed steps after "
                 f"{warmup} warm-up, {len(runs)} interleaved rounds, medians). Peak: the most "
                 "live tensor bytes of the busiest rank. Losses: 10 steps from the same "
                 "weights on the same samples, the largest relative difference of a step's "
                 "loss ([peers/dist_peer.py](peers/dist_peer.py)).", "",
                 "| mode | torch.distributed | step, gradscope | step, torch | step, torch with"
                 " gradscope's heap | peak, gradscope | peak, torch | losses |",
                 "|---|---|---|---|---|---|---|---|"]
        raw = {"check": check if isinstance(check, dict) else check.reason}
        for mode in dist_peer.MODES:
            name = f"{prefix}: --shard {mode}"
            ours = [r[f"gradscope {mode}"] for r in runs]
            theirs = [r[f"torch {mode}"] for r in runs]
            same = [r[f"torch, same heap {mode}"] for r in runs]
            good = [(a, b, c) for a, b, c in zip(ours, theirs, same)
                    if not any(isinstance(x, Failed) for x in (a, b, c))]
            raw[mode] = [[x.reason if isinstance(x, Failed) else x for x in sides_]
                         for sides_ in zip(ours, theirs, same)]
            if not good:
                reason = next(x.reason for x in ours + theirs + same if isinstance(x, Failed))
                self.failed_row(f"{name} step time, gradscope / torch", 1.0, reason)
                lines.append(f"| {mode} | failed: {table_text(reason)} | | | | | | |")
                continue
            step = [(a["time"]["step_median_s"], b["step_median_s"], c["step_median_s"])
                    for a, b, c in good]
            peak = [(max(k["peak_bytes"] for k in a["distributed"]["ranks"]) -
                     data_set_bytes(a), max(b["peak_tensor_bytes_per_rank"]))
                    for a, b, _ in good]
            self.row(f"{name} step time, gradscope / torch", [a / b for a, b, _ in step], 1.0)
            self.row(f"{name} step time, gradscope / torch with gradscope's heap settings",
                     [a / c for a, _, c in step], 1.0)
            self.row(f"{name} peak memory per rank, gradscope / torch",
                     [a / b for a, b in peak], 1.0)
            if isinstance(check, Failed):
                losses = f"check failed: {table_text(check.reason, 80)}"
            else:
                rel = check["modes"][mode]["max_relative"]
                losses = (f"{rel:.1e} ({'within' if rel <= check['tolerance'] else 'over'} "
                          f"{check['tolerance']:g})")
            med = [statistics.median(x) for x in zip(*step)] + [
                statistics.median(x) / 2**20 for x in zip(*peak)]
            lines.append(f"| {mode} | {table_text(good[0][1]['what'])} | {1e3 * med[0]:.0f} ms | "
                         f"{1e3 * med[1]:.0f} ms | {1e3 * med[2]:.0f} ms | {med[3]:.0f} MiB | "
                         f"{med[4]:.0f} MiB | {losses} |")
        self.details["distributed"] = "\n".join(lines)
        self.raw["distributed"] = raw

    def grid(self):
        db = os.path.join(self.tmp, "grid.db")
        started = time.monotonic()
        subprocess.run([self.gs, "sweep", os.path.join(ROOT, "configs", "sweeps", "study-tiny.toml"),
                        "--db", db], check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - started
        out = subprocess.run(["sqlite3", db, "SELECT status, count(*) FROM runs GROUP BY status"],
                             check=True, capture_output=True, text=True).stdout.strip()
        runs = sum(int(line.split("|")[1]) for line in out.splitlines() if "|" in line)
        # The target: 10 seconds a run (the grid is 240 runs of 50 steps since it has 3 seeds).
        self.row(f"the study's grid at tiny presets ({runs} runs): wall minutes", [wall / 60],
                 runs * 10 / 60,
                 unit="minutes", note=out.replace("\n", ", ").replace("|", " "))
        self.raw["grid"] = {"wall_s": wall, "statuses": out}

    # ---- output ----

    def machine(self):
        cpu = "unknown"
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        cpu = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        env = getattr(self, "env", {})
        try:
            import torch
            torch_version = torch.__version__
        except ImportError:
            torch_version = "not installed"
        return (f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} "
                f"{platform.release()}; gradscope {env.get('gradscope', '?')} (commit "
                f"{env.get('git_commit', '?')}) on LibTorch {env.get('libtorch', '?')}; "
                f"Python peers on PyTorch {torch_version}; the same threads on both sides of a "
                f"comparison (each row names them)")

    def write(self, started):
        rows = self.rows
        if self.args.merge and os.path.exists(os.path.splitext(self.args.out)[0] + ".json"):
            # Keep the earlier rows of benchmarks not rerun this time; a row measured again
            # takes its earlier place in the table, a new one goes at the end. self.rows keeps
            # this run's rows only, so that writing again after the next benchmark merges them
            # once.
            with open(os.path.splitext(self.args.out)[0] + ".json") as f:
                earlier = json.load(f)
            now = {r["benchmark"]: r for r in self.rows}
            old_names = {r["benchmark"] for r in earlier["rows"]}
            rows = ([now.get(r["benchmark"], r) for r in earlier["rows"]] +
                    [r for r in self.rows if r["benchmark"] not in old_names])
            self.raw = {**earlier.get("raw", {}), **self.raw}
            old = earlier.get("details", {})
            if isinstance(old, list):
                old = {f"earlier-{i}": d for i, d in enumerate(old)}
            self.details = {**old, **self.details}
        lines = ["# gradscope benchmarks", "",
                 f"Written by `bench/bench.py` on {started:%Y-%m-%d} (last run: "
                 f"{' '.join(sys.argv[1:]) or 'the defaults'}). Each row's pairs ran interleaved; "
                 f"the pairs column counts them.", "",
                 f"Machine: {self.machine()}.", "",
                 "| benchmark | min | median | max | pairs | target | met |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["median"] is None:  # every run failed
                lines.append(f"| {r['benchmark']} | - | - | - | 0 | {r['target']} | "
                             f"{'-' if r['met'] is None else 'no'} ({r['note']}) |")
                continue
            lines.append(f"| {r['benchmark']} | {r['min']:.3f} | {r['median']:.3f} | "
                         f"{r['max']:.3f} | {r['n']} | {r['target']}"
                         f"{' (' + r['note'] + ')' if r['note'] else ''} | "
                         f"{'-' if r['met'] is None else 'yes' if r['met'] else 'no'} |")
        for d in self.details.values():
            lines += ["", d]
        text = "\n".join(lines) + "\n"
        with open(self.args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(self.args.out)[0] + ".json", "w") as f:
            json.dump({"rows": rows, "raw": self.raw, "details": self.details}, f, indent=1)
        print(text)


# Every benchmark, in the order `make bench` runs them: a method of Bench each.
BENCHMARKS = ["transformers", "peers", "limit", "attention", "checkpoint", "accumulation",
              "sampler", "timeline", "ranks", "distributed", "collectives", "grid"]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5, help="interleaved pairs per comparison")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--threads", type=int, default=1, help="threads on both sides")
    p.add_argument("--only", default=",".join(BENCHMARKS),
                   help="comma-separated benchmarks to run")
    p.add_argument("--gradscope", default="build/gradscope", help="the binary, from the root")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results.md"))
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of benchmarks not run this time from the earlier results")
    args = p.parse_args()
    unknown = [name for name in args.only.split(",") if name not in BENCHMARKS]
    if unknown:
        p.error(f"--only: no benchmark {', '.join(map(repr, unknown))} (there are "
                f"{', '.join(BENCHMARKS)})")
    if args.pairs < 1 or args.steps < 1 or args.threads < 1:
        p.error("--pairs, --steps and --threads must be at least 1")
    bench = Bench(args)
    started = datetime.datetime.now()
    try:
        for name in args.only.split(","):
            log(f"--- {name}")
            getattr(bench, name)()
            # After each benchmark, so that a later failure loses nothing measured.
            bench.write(started)
            args.merge = True
    finally:
        # The runs' records and saved weights (the distributed benchmark's alone are a
        # quarter of a gigabyte): what was measured is in results.md and results.json.
        shutil.rmtree(bench.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
