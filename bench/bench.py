#!/usr/bin/python3
"""gradscope's benchmarks: `make bench` runs them all and writes bench/results.md.

Every comparison is a ratio measured side by side: the two sides of a pair run one after the
other, the order alternating from pair to pair, so that drift in the machine's speed hits
both alike. The table gives min / median / max over the pairs, the target, and whether the
median meets it. Benchmarks are not tests: nothing here fails the build.

  peers        gradscope's ViT and Llama against PyTorch peers (bench/peers/): step time and
               peak tensor memory, ours / peer
  limit        achieved FLOP/s of the Llama `small` step against the fp32 GEMM peak that
               `gradscope probe` measures in the same run, and where the rest goes by phase
  checkpoint   checkpointing's step time against standard
  accumulation peak memory of 4 accumulated micro-batches against one micro-batch alone
  sampler      step time with the sampler thread and phase timing on against both off
  grid         the study's whole grid (240 runs, 3 seeds) at the tiny presets, wall time

  bench/bench.py [--pairs N] [--threads T] [--only peers,limit,...] [--out bench/results.md]

Needs Debian's python3-torch and python3-torchvision for the peers
(`scripts/install-deps.sh bench`). Run with /usr/bin/python3.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"


def log(*args):
    print("bench:", *args, file=sys.stderr, flush=True)


def data_set_bytes(record):
    """Bytes of CPU tensors the run's data set holds (0 when not measured)."""
    return ((record.get("estimate") or {}).get("data_bytes") or 0)


def training_peak(record):
    """The run's peak allocated bytes without its resident data set."""
    return record["memory"]["peak_bytes"] - data_set_bytes(record)


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

    def peer(self, script, *flags):
        self.counter += 1
        out = os.path.join(self.tmp, f"peer-{self.counter}.json")
        cmd = [PYTHON, os.path.join(ROOT, "bench", "peers", script), "--threads",
               str(self.args.threads), "--json", out, *flags]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)

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

    def row(self, name, ratios, target, better="lower", unit="ratio", note=""):
        ratios = sorted(ratios)
        med = statistics.median(ratios)
        if better == "lower":
            met = med <= target
            target_text = f"<= {target:g}"
        else:
            met = med >= target
            target_text = f">= {target:g}"
        self.rows.append({
            "benchmark": name, "min": ratios[0], "median": med, "max": ratios[-1],
            "n": len(ratios), "target": target_text, "met": met, "unit": unit, "note": note})
        log(f"{name}: median {med:.4f} (min {ratios[0]:.4f}, max {ratios[-1]:.4f}, "
            f"{len(ratios)} pairs), target {target_text}: {'met' if met else 'missed'}")

    # ---- benchmarks ----

    def peers(self):
        warmup = "2"
        # A ViT small step is ten times shorter than a Llama small step and as noisy in
        # absolute terms: it gets more steps and three times the pairs.
        cases = [
            ("ViT small", "vit_peer.py",
             ["--model", "vit", "--preset", "small", "--batch", "8"],
             ["--preset", "small", "--batch", "8"], 3 * self.args.steps, 3 * self.args.pairs),
            ("Llama small", "llama_peer.py",
             ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128"],
             ["--preset", "small", "--batch", "8", "--seq", "128"], self.args.steps,
             self.args.pairs),
        ]
        for label, script, ours_flags, peer_flags, case_steps, count in cases:
            steps = str(case_steps)
            runs = self.pairs(
                f"peers {label}",
                lambda: self.gradscope(*ours_flags, "--optimizer", "adam", "--steps", steps,
                                       "--warmup-steps", warmup),
                lambda: self.peer(script, *peer_flags, "--optimizer", "adam", "--steps", steps,
                                  "--warmup", warmup), count)
            time_ratios = [a["time"]["step_median_s"] / b["step_median_s"] for a, b in runs]
            # gradscope's peak includes what the data set keeps as tensors (ViT: the labels of
            # 70,000 images, 560 KB; measured while loading, the record's estimate.data_bytes);
            # a peer holds one batch of random inputs only.
            mem_ratios = [training_peak(a) / b["peak_tensor_bytes"] for a, b in runs
                          if b.get("peak_tensor_bytes")]
            self.row(f"{label}: step time, gradscope / {runs[0][1]['peer']}", time_ratios, 1.0,
                     note="aim 0.95")
            if mem_ratios:
                self.row(f"{label}: peak tensor memory (without the data set), gradscope / "
                         f"{runs[0][1]['peer']}", mem_ratios, 1.0)
            self.raw[f"peers {label}"] = [
                {"ours_step_median_s": a["time"]["step_median_s"],
                 "peer_step_median_s": b["step_median_s"],
                 "ours_peak_bytes": a["memory"]["peak_bytes"],
                 "ours_data_set_bytes": data_set_bytes(a),
                 "peer_peak_tensor_bytes": b.get("peak_tensor_bytes"),
                 "ours_params": a["params"], "peer_params": b["params"]} for a, b in runs]
            if label == "Llama small":
                self.llama_records = [a for a, _ in runs]

    def probe(self):
        self.counter += 1
        out = os.path.join(self.tmp, f"probe-{self.counter}.json")
        subprocess.run([self.gs, "probe", "--threads", str(self.args.threads), "--no-db",
                        "--json", out], check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            probe = json.load(f)
        return probe["peak"]["fp32"]

    def limit(self):
        # The probe before and after the training runs; the higher is the peak.
        peak_before = self.probe()
        records = getattr(self, "llama_records", None) or [
            self.gradscope("--model", "llama", "--preset", "small", "--batch", "8", "--seq",
                           "128", "--optimizer", "adam", "--steps", str(self.args.steps),
                           "--warmup-steps", "2") for _ in range(self.args.pairs)]
        peak = max(peak_before, self.probe())
        fractions = [r["flops"]["achieved_per_s"] / peak for r in records]
        self.row("Llama small: achieved FLOP/s / fp32 GEMM peak (probe)", fractions, 0.70,
                 better="higher", unit="fraction")
        # Where the time goes: per phase, its share of the step and the FLOP/s it reaches
        # (forward 1/3 and backward 2/3 of the step's FLOPs).
        r = records[len(records) // 2]
        t = r["time"]
        n = t["timed_steps"]
        per_step = r["flops"]["per_step"]
        phases = [("data", t["data_s"], 0.0), ("forward", t["forward_s"], per_step / 3),
                  ("backward", t["backward_s"], 2 * per_step / 3),
                  ("optimizer", t["optimizer_s"], 0.0)]
        total = sum(s for _, s, _ in phases)
        lines = [f"Llama small (batch 8 x 128 tokens, {r['params']:,} parameters), one run: "
                 f"{per_step / 1e9:.1f} GFLOP per step, fp32 GEMM peak {peak / 1e9:.1f} GFLOP/s "
                 f"({self.args.threads} thread(s)).", "",
                 "| phase | time per step | share | FLOP/s | of peak |", "|---|---|---|---|---|"]
        for name, seconds, flops in phases:
            per = seconds / n
            rate = flops / per if flops and per > 0 else None
            lines.append(f"| {name} | {1e3 * per:.1f} ms | {100 * seconds / total:.1f}% | "
                         f"{'%.1f G' % (rate / 1e9) if rate else '-'} | "
                         f"{'%.0f%%' % (100 * rate / peak) if rate else '-'} |")
        self.details["limit"] = "\n".join(lines)
        self.raw["limit"] = {"peak_flops_per_s": [peak_before, peak], "fractions": fractions,
                             "phases": {name: s / n for name, s, _ in phases}}

    def checkpoint(self):
        base = ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128",
                "--optimizer", "adam", "--steps", str(self.args.steps), "--warmup-steps", "1"]
        runs = self.pairs("checkpoint",
                          lambda: self.gradscope(*base, "--strategy", "checkpoint"),
                          lambda: self.gradscope(*base, "--strategy", "standard"))
        self.row("Llama small: checkpoint / standard step time",
                 [a["time"]["step_median_s"] / b["time"]["step_median_s"] for a, b in runs], 1.35)
        self.raw["checkpoint"] = [[a["time"]["step_median_s"], b["time"]["step_median_s"],
                                   a["memory"]["peak_bytes"], b["memory"]["peak_bytes"]]
                                  for a, b in runs]

    def accumulation(self):
        base = ["--model", "llama", "--preset", "small", "--seq", "128", "--batch", "2",
                "--optimizer", "adam", "--steps", "2", "--warmup-steps", "1"]
        # Peak memory is counted exactly by the allocator: one pair per repetition is plenty.
        runs = [(self.gradscope(*base, "--strategy", "accumulation", "--accum-steps", "4"),
                 self.gradscope(*base, "--strategy", "standard"))
                for _ in range(max(1, min(3, self.args.pairs)))]
        self.row("Llama small: accumulation k=4 peak / one micro-batch (2) peak",
                 [a["memory"]["peak_bytes"] / b["memory"]["peak_bytes"] for a, b in runs], 1.05)
        self.raw["accumulation"] = [[a["memory"]["peak_bytes"], b["memory"]["peak_bytes"]]
                                    for a, b in runs]

    def sampler(self):
        base = ["--model", "vit", "--preset", "small", "--batch", "8", "--steps", "20",
                "--warmup-steps", "2"]
        runs = self.pairs("sampler",
                          lambda: self.gradscope(*base, "--sample-period", "0.1"),
                          lambda: self.gradscope(*base, "--sample-period", "0",
                                                 "--no-phase-timing"))
        self.row("ViT small: step time with sampler (100 ms) and phase timing / without",
                 [a["time"]["step_median_s"] / b["time"]["step_median_s"] for a, b in runs], 1.02)
        busy = [a["sampler"]["busy_s"] / a["time"]["total_s"] for a, _ in runs]
        self.details["sampler"] = (
            f"The sampler's own measured cost (`sampler.busy_s` over the timed time): "
            f"{100 * min(busy):.3f}% to {100 * max(busy):.3f}%.")

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
                f"Python peers on PyTorch {torch_version}; "
                f"{self.args.threads} thread(s) on both sides")

    def write(self, started):
        if self.args.merge and os.path.exists(os.path.splitext(self.args.out)[0] + ".json"):
            # Keep the earlier rows of benchmarks not rerun this time.
            with open(os.path.splitext(self.args.out)[0] + ".json") as f:
                earlier = json.load(f)
            names = {r["benchmark"] for r in self.rows}
            self.rows = [r for r in earlier["rows"] if r["benchmark"] not in names] + self.rows
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
        for r in self.rows:
            lines.append(f"| {r['benchmark']} | {r['min']:.3f} | {r['median']:.3f} | "
                         f"{r['max']:.3f} | {r['n']} | {r['target']}"
                         f"{' (' + r['note'] + ')' if r['note'] else ''} | "
                         f"{'yes' if r['met'] else 'no'} |")
        for d in self.details.values():
            lines += ["", d]
        text = "\n".join(lines) + "\n"
        with open(self.args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(self.args.out)[0] + ".json", "w") as f:
            json.dump({"rows": self.rows, "raw": self.raw, "details": self.details}, f, indent=1)
        print(text)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5, help="interleaved pairs per comparison")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--threads", type=int, default=1, help="threads on both sides")
    p.add_argument("--only", default="peers,limit,checkpoint,accumulation,sampler,grid",
                   help="comma-separated benchmarks to run")
    p.add_argument("--gradscope", default="build/gradscope", help="the binary, from the root")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results.md"))
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of benchmarks not run this time from the earlier results")
    args = p.parse_args()
    bench = Bench(args)
    started = datetime.datetime.now()
    for name in args.only.split(","):
        log(f"--- {name}")
        getattr(bench, name)()
        # After each benchmark, so that a later failure loses nothing measured.
        bench.write(started)
        args.merge = True


if __name__ == "__main__":
    main()
