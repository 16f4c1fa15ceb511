"""The `transformers` benchmark of bench/bench.py: gradscope's Llama, ViT and ModernBERT at
`small` against Hugging Face transformers' own models (LlamaForCausalLM,
ViTForImageClassification, ModernBertForMaskedLM) at exactly the same architecture, trained
by bench/peers/hf_peer.py: step time and peak tensor memory, pairs interleaved.

Each model is compared twice: gradscope's --attention sdpa against transformers' "sdpa"
(both scaled_dot_product_attention), and --attention math against "eager" (both written
out). Both sides train with AdamW at gradscope's defaults (lr 1e-3, betas 0.9 and 0.999, eps
1e-8, weight decay 0: torch.optim.AdamW is given 0, its own default being 0.01), at the same
threads, batch and sequence length.
"""

import os
import statistics
import subprocess

# gradscope's --attention against transformers' attn_implementation doing the same.
ATTENTION = [("sdpa", "sdpa"), ("math", "eager")]
# label, gradscope's flags for the model (batch and sequence as the peer gets them; the rest
# reaches the peer through the config.json gradscope writes), how many times the steps and
# pairs (a ViT small step is ten times shorter than a Llama small step and as noisy in
# absolute terms), and the attention pairs compared.
CASES = [
    ("Llama small", ["--model", "llama", "--preset", "small", "--batch", "8", "--seq", "128"], 1,
     ATTENTION),
    ("ViT small", ["--model", "vit", "--preset", "small", "--batch", "8"], 3, ATTENTION),
    ("ModernBERT small", ["--model", "modernbert", "--preset", "small", "--batch", "8",
                          "--seq", "128"], 1, ATTENTION),
]
# AdamW with gradscope's defaults, given explicitly to both sides.
ADAMW = ["--optimizer", "adamw", "--lr", "0.001", "--weight-decay", "0"]
WARMUP = "2"
TIME_TARGET = 0.9    # gradscope's step time / transformers'
MEMORY_TARGET = 1.0  # gradscope's peak tensor memory / transformers'


def architecture(bench, label, flags, failed_type):
    """gradscope's own description of the model: one step with --save-weights, whose folder
    holds the config.json transformers builds from, and whose record has the parameter count.
    Returns (config path, parameter count) or the Failed run."""
    folder = os.path.join(bench.tmp, f"architecture-{label.replace(' ', '-')}")
    record = bench.try_gradscope(*flags, *ADAMW, "--steps", "1", "--warmup-steps", "0",
                                 "--save-weights", folder)
    if isinstance(record, failed_type):
        return record
    return os.path.join(folder, "config.json"), record["params"]


def peak_batch(bench, label, ours, flags, steps, failed_type):
    """For ModernBERT, the batch of the step at which gradscope's peak falls, as `gradscope
    outputs` writes it, for the peer to profile its memory on (--batch-file): ModernBERT's
    batches differ in their number of masked targets, hence in the size of the loss head's
    logits, and gradscope's peak is that of its largest, so the peer's peak is taken at the
    same targets (its timed steps train on a random batch at the masking rate, as gradscope's
    median step is one of typical targets). Returns the file's path, None for Llama and ViT
    (their batches all have the same targets), or the Failed run."""
    if "modernbert" not in flags:
        return None
    probe = bench.try_gradscope(*flags, *ADAMW, "--attention", ours, "--steps", steps,
                                "--warmup-steps", WARMUP)
    if isinstance(probe, failed_type):
        return probe
    step = probe["memory"].get("peak_step")
    if not isinstance(step, int) or step < 1:
        # The peak fell between steps (evaluation, saving): no step's batch decides it.
        return failed_type(f"gradscope's peak fell outside a step (peak_step {step!r})")
    path = os.path.join(bench.tmp, f"batch-{label.replace(' ', '-')}-{ours}.st")
    cmd = [bench.gs, "outputs", "--threads", str(bench.args.threads), *flags,
           "--attention", ours, "--step", str(step), "--out", path]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return failed_type(lines[-1] if lines else f"gradscope outputs: exit {done.returncode}")
    return path


def peer_flags(flags):
    """The gradscope flags the peer takes as they are (batch, sequence length)."""
    out = []
    for name in ("--batch", "--seq"):
        if name in flags:
            out += [name, flags[flags.index(name) + 1]]
    return out


def batch_text(record):
    """The batch of a gradscope run, as its record says: samples, and tokens a sample for a
    text model."""
    config = record["config"]
    if config["model"] == "vit":
        return f"{config['batch']} images"
    return f"{config['batch']} x {config['seq_len']} tokens"


def run(bench, failed_type, training_peak):
    """Adds the rows, a table of the medians under them, and the raw figures to `bench`.
    failed_type: bench.py's Failed; training_peak(record): gradscope's peak without its data
    set's bytes, the rule of the `peers` benchmark."""
    threads = f"{bench.args.threads} thread(s)"
    lines = [f"transformers: gradscope against Hugging Face transformers' own models at the "
             f"same architecture (bench/peers/hf_peer.py), {threads}, AdamW, "
             f"{bench.args.steps} timed steps after {WARMUP} warm-up steps (ViT: three times the "
             "steps and the pairs), pairs interleaved; medians. Peak: tensor memory, gradscope's "
             "without its data set's bytes. ViT's dropout is the preset's on both sides, at the "
             "same places. ModernBERT: the peer's memory is profiled on the batch of the step at "
             "which gradscope's peak fell (`gradscope outputs --step`), so both peaks are taken "
             "at the same masked targets; its timed steps train on a random batch at the "
             "masking rate.", "",
             "| model | batch | attention, gradscope / transformers | step, gradscope | step, "
             "transformers | peak, gradscope | peak, transformers |",
             "|---|---|---|---|---|---|---|"]
    raw = {}
    for label, flags, scale, attention in CASES:
        steps = str(scale * bench.args.steps)
        arch = architecture(bench, label, flags, failed_type)
        for ours, theirs in attention:
            name = f"{label}, {threads}, --attention {ours} / transformers {theirs}"
            time_name = f"{name}: step time, gradscope / transformers"
            mem_name = f"{name}: peak tensor memory (without the data set), gradscope / " \
                "transformers"
            if isinstance(arch, failed_type):
                bench.failed_row(time_name, TIME_TARGET, arch.reason)
                bench.failed_row(mem_name, MEMORY_TARGET, arch.reason)
                continue
            config, params = arch
            batch_file = peak_batch(bench, label, ours, flags, steps, failed_type)
            if isinstance(batch_file, failed_type):
                bench.failed_row(time_name, TIME_TARGET, batch_file.reason)
                bench.failed_row(mem_name, MEMORY_TARGET, batch_file.reason)
                continue
            given = ["--batch-file", batch_file] if batch_file else []

            def gradscope_run(ours=ours, steps=steps, flags=flags):
                return bench.try_gradscope(*flags, *ADAMW, "--attention", ours,
                                           "--steps", steps, "--warmup-steps", WARMUP)

            def peer_run(theirs=theirs, steps=steps, flags=flags, config=config, params=params,
                         given=given):
                return bench.try_peer("hf_peer.py", "--config", config, "--params", str(params),
                                      *peer_flags(flags), *given, *ADAMW, "--attention", theirs,
                                      "--steps", steps, "--warmup", WARMUP)

            runs = bench.pairs(f"transformers {label} {ours}/{theirs}", gradscope_run, peer_run,
                               scale * bench.args.pairs)
            good = [(a, b) for a, b in runs
                    if not isinstance(a, failed_type) and not isinstance(b, failed_type)]
            if not good:
                reason = next(r.reason for pair in runs for r in pair
                              if isinstance(r, failed_type))
                bench.failed_row(time_name, TIME_TARGET, reason)
                bench.failed_row(mem_name, MEMORY_TARGET, reason)
                continue
            step = lambda a, b: (a["time"]["step_median_s"], b["step_median_s"])  # noqa: E731
            peak = lambda a, b: (training_peak(a), b["peak_tensor_bytes"])  # noqa: E731
            note = f"{len(runs) - len(good)} pair(s) failed" if len(good) < len(runs) else ""
            bench.row(time_name, [x / y for x, y in (step(a, b) for a, b in good)], TIME_TARGET,
                      note=note)
            # The ratio's three decimals hide small differences: the bytes go in the note.
            extra = statistics.median(x - y for x, y in (peak(a, b) for a, b in good))
            extra = (f"gradscope {extra / 2**20:+.2f} MiB" if abs(extra) >= 2**20 else
                     f"gradscope {extra / 2**10:+.1f} KiB")
            bench.row(mem_name, [x / y for x, y in (peak(a, b) for a, b in good)],
                      MEMORY_TARGET, note="; ".join(n for n in (extra, note) if n))
            med = lambda f, side: statistics.median(f(a, b)[side] for a, b in good)  # noqa: E731
            lines.append(f"| {label} | {batch_text(good[0][0])} | {ours} / {theirs} | "
                         f"{1e3 * med(step, 0):.0f} ms | "
                         f"{1e3 * med(step, 1):.0f} ms | {med(peak, 0) / 2**20:.1f} MiB | "
                         f"{med(peak, 1) / 2**20:.1f} MiB |")
            raw[name] = [{"ours_step_median_s": step(a, b)[0],
                          "peer_step_median_s": step(a, b)[1],
                          "ours_peak_bytes": a["memory"]["peak_bytes"],
                          "ours_training_peak_bytes": peak(a, b)[0],
                          "peer_peak_tensor_bytes": peak(a, b)[1],
                          "ours_params": a["params"], "peer_params": b["params"],
                          "peer": b["peer"]} for a, b in good]
    bench.details[f"transformers, {threads}"] = "\n".join(lines)
    bench.raw[f"transformers, {threads}"] = raw
