#!/usr/bin/env python3
"""gradscope's memory estimate beside the estimators people use, and the measured peak.

    .venv/bin/python bench/estimators.py [--gradscope build/gradscope] [--max-flops 1e12]

For Llama, ModernBERT, ViT and NanoVLM at the small and paper presets (Adam, batch 8,
standard strategy, fp32), prints one Markdown table row per model and preset with:

- gradscope's estimate: `gradscope estimate --model M --preset P --optimizer adam --batch 8
  --json F`: its peak (the largest of its phases) and the parts it names: parameters,
  gradients, optimizer state and the activations saved for backward;
- accelerate's: `calculate_maximum_sizes` (accelerate.utils) on the transformers model of the
  config.json gradscope writes, built on the meta device (`torch.device("meta")`: shapes
  without data), and `accelerate estimate-memory`'s "Training using Adam" figure for
  float32, `max(estimate_training_usage(total, "float32").values())`. That command builds a
  Hub model with `AutoModel.from_config` under `init_empty_weights()`; a second table gives
  accelerate's figures for the model built that way and for the class under
  `init_empty_weights()` (the base model has no task head; a tied head may come untied);
- DeepSpeed's ZeRO-2 and ZeRO-3 model-state estimates for one GPU without offload
  (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`), when the
  interpreter can import deepspeed (it is not in the project's environment; see
  docs/metrics.md, "Beside accelerate and DeepSpeed", for a temporary one);
- the measured peak (the run record's memory.peak_bytes) of a 3-step run (`gradscope run ...
  --steps 3 --warmup-steps 1 --eval-batches 1`), and each estimate's distance from it,
  estimate / measured - 1. Every small preset is measured; a paper preset only when its
  estimated peak fits in half of this machine's available memory and its estimated FLOPs per
  step are at most --max-flops, else the cell says which of the two stopped it.

The config.json of a small preset is the one its measured run writes (`--save-weights`, which
happens after the record's memory is taken). No command writes one without training, so a
paper preset's is built here from `gradscope list --json`, by the rules of
src/gradscope/models/hf_config.cpp; the builder is checked against every small preset's
written config and the script stops when they differ. NanoVLM has no transformers class: it
is counted as transformers' SigLIP vision tower, a Llama decoder and its projection (a linear
map without bias), which is nanoVLM's own layout; the parameter count of every model built is
checked against gradscope's.

Runs one gradscope process at a time. Exit 2 on bad arguments, 1 when a run or a check fails.
"""

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = ("llama", "modernbert", "vit", "nanovlm")
PRESETS = ("small", "paper")
BATCH = 8
MEASURE_ARGS = ["--steps", "3", "--warmup-steps", "1", "--eval-batches", "1", "--quiet",
                "--no-db"]

# config.json as gradscope's hf_config writes it: (architecture key, published key) pairs,
# fixed values, and the published class.
LLAMA_KEYS = [(k, k) for k in (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
    "rope_scaling", "tie_word_embeddings", "attention_bias", "mlp_bias", "attention_dropout",
    "initializer_range")]
MODERNBERT_KEYS = [(k, k) for k in (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "global_attn_every_n_layers", "local_attention", "global_rope_theta",
    "local_rope_theta", "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "decoder_bias",
    "attention_dropout", "initializer_range")]
VIT_KEYS = [(k, k) for k in (
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "image_size", "patch_size", "num_channels", "layer_norm_eps",
    "qkv_bias", "hidden_act", "initializer_range")] + [
    ("hidden_dropout", "hidden_dropout_prob"),
    ("attention_dropout", "attention_probs_dropout_prob")]
NANOVLM_KEYS = [
    ("vision_hidden_size", "vit_hidden_dim"), ("vision_intermediate_size", "vit_inter_dim"),
    ("patch_size", "vit_patch_size"), ("image_size", "vit_img_size"),
    ("vision_num_attention_heads", "vit_n_heads"),
    ("vision_num_hidden_layers", "vit_n_blocks"), ("vision_layer_norm_eps", "vit_ln_eps"),
    ("hidden_size", "lm_hidden_dim"), ("intermediate_size", "lm_inter_dim"),
    ("rms_norm_eps", "lm_rms_eps"), ("rope_theta", "lm_re_base"),
    ("vocab_size", "lm_vocab_size"), ("num_attention_heads", "lm_n_heads"),
    ("num_key_value_heads", "lm_n_kv_heads"), ("num_hidden_layers", "lm_n_blocks"),
    ("tie_word_embeddings", "lm_tie_weights"),
    ("pixel_shuffle_factor", "mp_pixel_shuffle_factor")]
CONFIG_RULES = {
    "llama": ("LlamaForCausalLM", LLAMA_KEYS, {"hidden_act": "silu", "pretraining_tp": 1}),
    "modernbert": ("ModernBertForMaskedLM", MODERNBERT_KEYS, {
        "hidden_activation": "gelu", "classifier_activation": "gelu",
        "classifier_bias": False, "tie_word_embeddings": True, "pad_token_id": None}),
    "vit": ("ViTForImageClassification", VIT_KEYS, {}),
    "nanovlm": (None, NANOVLM_KEYS, {
        "vit_cls_flag": False, "lm_attn_scaling": 1.0, "lm_use_tokens": False}),
}
# nanoVLM's default for the positions past which it rescales its rotary frequencies.
NANOVLM_DEFAULT_POSITIONS = 8192


class Failure(Exception):
    """A run or a check failed: exit 1 with the message."""


def hf_config(model, arch):
    """The config.json gradscope writes for `arch`, without its "gradscope" object."""
    cls, keys, fixed = CONFIG_RULES[model]
    out = {"architectures": [cls]} if cls else {}
    for key, published in keys:
        if key in arch:
            out[published] = arch[key]
    out.update(fixed)
    seq = arch.get("seq_len")
    if model in ("llama", "modernbert") and seq is not None:
        out["max_position_embeddings"] = seq
    # Llama's is at least its rotary scaling's context, as gradscope writes it.
    original = (arch.get("rope_scaling") or {}).get("original_max_position_embeddings")
    if model == "llama" and seq is not None and original is not None and original > seq:
        out["max_position_embeddings"] = original
    if model == "modernbert" and "hidden_dropout" in arch:
        out["embedding_dropout"] = out["mlp_dropout"] = arch["hidden_dropout"]
    if model == "vit":
        labels = arch["num_labels"]
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    if model == "nanovlm":
        patches = (arch["image_size"] // arch["patch_size"]) ** 2
        image_tokens = patches // arch["pixel_shuffle_factor"] ** 2
        out["lm_max_position_embeddings"] = max(NANOVLM_DEFAULT_POSITIONS,
                                                image_tokens + (seq or 0))
        if seq is not None:
            out["lm_max_length"] = seq
    return out


def run_gradscope(binary, args):
    """Runs gradscope with `args`; its stdout, or Failure naming the command and its error."""
    proc = subprocess.run([binary] + args, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise Failure(f"{binary} {' '.join(args)} exited {proc.returncode}: "
                      + " / ".join(tail))
    return proc.stdout


def read_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Failure(f"{what} {path}: {e}") from e


def gradscope_estimate(binary, model, preset, tmp):
    path = os.path.join(tmp, f"estimate-{model}-{preset}.json")
    run_gradscope(binary, ["estimate", "--model", model, "--preset", preset, "--optimizer",
                           "adam", "--batch", str(BATCH), "--json", path])
    return read_json(path, "gradscope estimate's JSON")["estimate"]


def measure(binary, model, preset, tmp, weights_dir=None):
    """The measured peak of a 3-step run, and the config.json it wrote (with weights_dir)."""
    path = os.path.join(tmp, f"run-{model}-{preset}.json")
    args = ["run", "--model", model, "--preset", preset, "--optimizer", "adam", "--batch",
            str(BATCH)] + MEASURE_ARGS + ["--json", path]
    if weights_dir:
        args += ["--save-weights", weights_dir]
    run_gradscope(binary, args)
    record = read_json(path, "run record")
    if record.get("status") != "ok":
        raise Failure(f"{model} {preset}: run status {record.get('status')!r}, not 'ok'")
    peak = record["memory"]["peak_bytes"]
    config = None
    if weights_dir:
        config = read_json(os.path.join(weights_dir, "config.json"), "written config")
        config.pop("gradscope", None)
    return peak, config


def available_bytes():
    """MemAvailable of /proc/meminfo, in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def build_model(model, config, device="meta", empty_weights=False):
    """The transformers model of `config` on `device` (meta: shapes without data), or under
    accelerate's init_empty_weights(), as `accelerate estimate-memory` builds a Hub model."""
    import torch
    import transformers
    from accelerate import init_empty_weights

    transformers.logging.set_verbosity_error()  # no notes on keys the model ignores
    ctx = init_empty_weights() if empty_weights else torch.device(device)
    with ctx:
        if model == "nanovlm":
            return build_nanovlm(config)
        config = dict(config)
        cls = getattr(transformers, config.pop("architectures")[0])
        hf = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
        return cls._from_config(hf, dtype=torch.float32)


def build_nanovlm(c):
    """nanoVLM's layout in transformers' classes: SigLIP's vision tower (no pooling head),
    the projection from pixel-shuffled patches, and a Llama decoder with its tied head."""
    import torch
    import transformers

    vision = transformers.SiglipVisionConfig(
        hidden_size=c["vit_hidden_dim"], intermediate_size=c["vit_inter_dim"],
        num_hidden_layers=c["vit_n_blocks"], num_attention_heads=c["vit_n_heads"],
        image_size=c["vit_img_size"], patch_size=c["vit_patch_size"],
        layer_norm_eps=c["vit_ln_eps"], vision_use_head=False)
    decoder = transformers.LlamaConfig(
        hidden_size=c["lm_hidden_dim"], intermediate_size=c["lm_inter_dim"],
        num_hidden_layers=c["lm_n_blocks"], num_attention_heads=c["lm_n_heads"],
        num_key_value_heads=c["lm_n_kv_heads"], vocab_size=c["lm_vocab_size"],
        rms_norm_eps=c["lm_rms_eps"], rope_theta=c["lm_re_base"],
        tie_word_embeddings=c["lm_tie_weights"])
    shuffled = c["vit_hidden_dim"] * c["mp_pixel_shuffle_factor"] ** 2

    class NanoVLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vision_encoder = transformers.SiglipVisionModel(vision)
            self.MP = torch.nn.Linear(shuffled, c["lm_hidden_dim"], bias=False)
            self.decoder = transformers.LlamaForCausalLM(decoder)
            # accelerate's "layer": a module of one of these classes is never split.
            self._no_split_modules = sorted(set(self.vision_encoder._no_split_modules)
                                            | set(self.decoder._no_split_modules))

    return NanoVLM()


def parameter_count(module):
    # parameters() yields a tied weight once.
    return sum(p.numel() for p in module.parameters())


def accelerate_figures(module):
    """accelerate's total size, largest layer and estimate-memory's float32 Adam figure."""
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, (largest, names) = calculate_maximum_sizes(module)
    usage = estimate_training_usage(total, "float32")
    return {"total": total, "largest": largest, "largest_names": names,
            "adam": max(usage.values())}


def deepspeed_module():
    """DeepSpeed's ZeRO estimators, or the reason they cannot be imported."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from deepspeed.runtime.zero import stage3
            from deepspeed.runtime.zero import stage_1_and_2
    except Exception as e:  # noqa: BLE001 - any failure to import means "not available"
        return None, f"{type(e).__name__}: {e}"
    return (stage_1_and_2, stage3), None


def deepspeed_figures(ds, module):
    """ZeRO-2 and ZeRO-3 bytes per GPU, one GPU on one node, nothing offloaded.
    DeepSpeed's model_to_params tells tied weights apart by data_ptr(), which is 0 for every
    tensor on the meta device: the total is counted here (parameters() yields a tied weight
    once, as data_ptr() tells it on a real model) and its largest layer (a module's own
    parameters) is DeepSpeed's."""
    stage2, stage3 = ds
    total = parameter_count(module)
    _, largest = stage3.model_to_params(module)
    _, zero2 = stage2.estimate_zero2_model_states_mem_needs(total, 1, 1, cpu_offload=False)
    _, zero3, _ = stage3.estimate_zero3_model_states_mem_needs(
        total, largest, 1, 1, cpu_offload=False, cpu_offload_params=False)
    return {"params": total, "largest_params": largest, "zero2": zero2, "zero3": zero3}


def check_deepspeed_count(ds, model, config, figures):
    """On a model built for real (small presets), DeepSpeed's own count must be the one
    figures were computed from."""
    real = build_model(model, config, device="cpu")
    total, largest = ds[1].model_to_params(real)
    del real
    if (total, largest) != (figures["params"], figures["largest_params"]):
        raise Failure(f"{model}: DeepSpeed counts {total} parameters (largest layer {largest})"
                      f" on the real model, {figures['params']} ({figures['largest_params']})"
                      " on the meta one")


def size(n):
    if n is None:
        return "n/a"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def with_error(estimate, measured):
    if measured is None:
        return size(estimate)
    return f"{size(estimate)} ({100 * (estimate / measured - 1):+.1f}%)"


def paper_gate(est, max_flops):
    """Why a paper preset is not measured here (each reason that holds), or None when it is.
    Half of the available memory is the limit: the process's own memory comes on top of the
    live tensors the estimate predicts, and the machine's other work needs the rest."""
    reasons = []
    free = available_bytes()
    if free is None or est["peak_bytes"] > free / 2:
        reasons.append(f"estimate {size(est['peak_bytes'])} above half of the {size(free)}"
                       " available")
    flops = est["model_flops_per_step"]
    if flops > max_flops:
        reasons.append(f"{flops / 1e12:.1f} TFLOP a step above --max-flops"
                       f" {max_flops / 1e12:.1f} TFLOP")
    return "not measured: " + "; ".join(reasons) if reasons else None


def compare_configs(model, written, built):
    if written == built:
        return
    keys = sorted(k for k in set(written) | set(built) if written.get(k) != built.get(k))
    raise Failure(f"{model}: the config.json built from `gradscope list --json` differs from"
                  f" the one gradscope wrote at {', '.join(keys)}")


def measure_row(args, model, preset, catalogue, ds, tmp):
    """Every figure of one model and preset."""
    entry = catalogue["models"][model]["presets"][preset]
    est = gradscope_estimate(args.gradscope, model, preset, tmp)
    config = hf_config(model, entry["arch"])
    peak, gate = None, None
    if preset == "small":
        weights = os.path.join(tmp, f"weights-{model}-{preset}")
        peak, written = measure(args.gradscope, model, preset, tmp, weights)
        compare_configs(model, written, config)
        config = written
    else:
        gate = paper_gate(est, args.max_flops)
        if gate is None:
            peak, _ = measure(args.gradscope, model, preset, tmp)
    module = build_model(model, config)
    count = parameter_count(module)
    if count != entry["params"]:
        raise Failure(f"{model} {preset}: transformers' model has {count} parameters,"
                      f" gradscope's {entry['params']}")
    row = {"model": model, "preset": preset, "estimate": est, "measured": peak, "gate": gate,
           "accelerate": accelerate_figures(module), "automodel": None,
           "empty_weights": empty_weights_figures(model, config)}
    if ds:
        row["deepspeed"] = deepspeed_figures(ds, module)
        if preset == "small":
            check_deepspeed_count(ds, model, config, row["deepspeed"])
    if model != "nanovlm":
        row["automodel"] = automodel_figures(config)
    return row


def empty_weights_figures(model, config):
    """accelerate's figures for the model built under init_empty_weights(), and whether its
    output embedding (the head) is still the input embedding's tensor there."""
    module = build_model(model, config, empty_weights=True)
    lm = module.decoder if model == "nanovlm" else module
    head = lm.get_output_embeddings()
    tied = head is not None and head.weight is lm.get_input_embeddings().weight
    return {"tied": tied, "head": head is not None, **accelerate_figures(module)}


def automodel_figures(config):
    """What `accelerate estimate-memory` counts for a Hub name: AutoModel.from_config, the
    architecture without its task head (unless the config maps another class)."""
    import torch
    import transformers
    from accelerate import init_empty_weights

    config = dict(config)
    config.pop("architectures")
    hf = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with init_empty_weights():
        module = transformers.AutoModel.from_config(hf, dtype=torch.float32)
    return {"class": type(module).__name__, **accelerate_figures(module)}


def largest_cell(acc):
    names = acc["largest_names"]
    more = f" +{len(names) - 1}" if len(names) > 1 else ""
    return f"{size(acc['total'])} ({size(acc['largest'])}, `{names[0]}`{more})"


def table_lines(rows, with_deepspeed):
    head = ["model", "preset", "measured peak", "gradscope estimate (peak, phase)",
            "parameters", "gradients", "Adam state", "activations (saved)",
            "accelerate: total size (largest layer)", "accelerate: training using Adam"]
    if with_deepspeed:
        head += ["DeepSpeed ZeRO-2, 1 GPU", "DeepSpeed ZeRO-3, 1 GPU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        est, m = r["estimate"], r["measured"]
        cells = [r["model"], r["preset"], size(m) if m is not None else r["gate"],
                 f"{with_error(est['peak_bytes'], m)}, {est['peak_phase']}",
                 size(est["params_bytes"]), size(est["grads_bytes"]),
                 size(est["optimizer_state_bytes"]), size(est["activations_bytes"]),
                 largest_cell(r["accelerate"]), with_error(r["accelerate"]["adam"], m)]
        if with_deepspeed:
            d = r["deepspeed"]
            cells += [with_error(d["zero2"], m), with_error(d["zero3"], m)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def rule_lines(ds, ds_reason):
    """The versions, and what each estimator counts, read from its own functions."""
    from accelerate.commands.estimate import estimate_training_usage

    unit = 1 << 20
    versions = [f"{name} {importlib.metadata.version(name)}" for name in
                ("torch", "transformers", "accelerate") + (("deepspeed",) if ds else ())]
    usage = {k: v / unit for k, v in estimate_training_usage(unit, "float32").items()}
    lines = ["", ", ".join(versions) + ".",
             "accelerate, float32: estimate_training_usage(S, 'float32') gives "
             + ", ".join(f"{k} {v:g} x S" for k, v in usage.items())
             + f"; estimate-memory prints the largest, {max(usage.values()):g} x S, where S"
             " is calculate_maximum_sizes' total (parameters and buffers)."]
    if ds:
        n, layer = 10**6, 10**4
        _, z2 = ds[0].estimate_zero2_model_states_mem_needs(n, 1, 1, cpu_offload=False)
        z3 = [ds[1].estimate_zero3_model_states_mem_needs(
            n, big, 1, 1, cpu_offload=False, cpu_offload_params=False)[1] for big in (0, layer)]
        lines.append(f"DeepSpeed, 1 GPU, no offload: ZeRO-2 {z2 / n:g} bytes a parameter;"
                     f" ZeRO-3 {z3[0] / n:g} bytes a parameter + {(z3[1] - z3[0]) / layer:g}"
                     " bytes a parameter of the largest layer (a module's own parameters).")
    else:
        lines.append(f"DeepSpeed: not available to this interpreter ({ds_reason}).")
    return lines


def build_lines(rows):
    """accelerate's total and Adam figure for the model built three ways: on the meta device
    (the table's), under init_empty_weights(), and as AutoModel under init_empty_weights()
    (what `accelerate estimate-memory` builds for a Hub name)."""
    def cell(figures):
        return f"{size(figures['total'])}, Adam {size(figures['adam'])}"

    lines = ["", "| model | preset | the class, on the meta device (the table's)"
             " | the class, under init_empty_weights() | AutoModel, under init_empty_weights()"
             " (estimate-memory's) |", "|---|---|---:|---:|---:|"]
    for r in rows:
        e, a = r["empty_weights"], r["automodel"]
        untied = "" if e["tied"] or not e["head"] else " (the tied head untied)"
        auto = f"`{a['class']}`: {cell(a)}" if a else "no transformers class"
        lines.append(f"| {r['model']} | {r['preset']} | {cell(r['accelerate'])}"
                     f" | {cell(e)}{untied} | {auto} |")
    return lines


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gradscope", default="build/gradscope", help="the gradscope binary")
    p.add_argument("--max-flops", type=float, default=1e12,
                   help="measure a paper preset only up to this many FLOPs a step (0: none)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated subset")
    args = p.parse_args(argv)
    if not (os.path.isfile(args.gradscope) and os.access(args.gradscope, os.X_OK)):
        p.error(f"--gradscope {args.gradscope!r} is not an executable file")
    if not args.max_flops >= 0:
        p.error(f"--max-flops {args.max_flops!r} must be a number at least 0")
    for name, allowed in (("models", MODELS), ("presets", PRESETS)):
        chosen = getattr(args, name).split(",")
        bad = [c for c in chosen if c not in allowed]
        if bad or not chosen:
            p.error(f"--{name}: {', '.join(map(repr, bad))} not among {', '.join(allowed)}")
        setattr(args, name, [a for a in allowed if a in chosen])
    return args


def main(argv):
    args = parse_args(argv)
    start = time.monotonic()
    catalogue = json.loads(run_gradscope(args.gradscope, ["list", "--json"]))
    ds, ds_reason = deepspeed_module()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gradscope-estimators-") as tmp:
        for model in args.models:
            for preset in args.presets:
                print(f"{model} {preset} ...", file=sys.stderr, flush=True)
                rows.append(measure_row(args, model, preset, catalogue, ds, tmp))
    lines = table_lines(rows, ds is not None) + rule_lines(ds, ds_reason) + build_lines(rows)
    print("\n".join(lines))
    print(f"took {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Failure as e:
        print(f"estimators.py: {e}", file=sys.stderr)
        sys.exit(1)
