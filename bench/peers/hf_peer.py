#!/usr/bin/env python3
"""Peer benchmark: Hugging Face transformers' own models (LlamaForCausalLM,
ViTForImageClassification, ModernBertForMaskedLM) at exactly the architecture of a gradscope
run, trained on the CPU in the textbook loop of peer_common.py, so that gradscope's step can be
read beside the one most people run.

The architecture is the config.json gradscope writes (`gradscope run ... --steps 1
--save-weights DIR`), its "gradscope" key dropped (that key gives the sequence length and
ModernBERT's masking rate); the model is built from it with random weights, and the script
refuses to run (exit 2) unless its parameter count is the --params given, gradscope's count
(the run record's `params`):

    build/gradscope run --model vit --preset small --steps 1 --warmup-steps 0 --no-db \\
        --quiet --save-weights /tmp/vit --json /tmp/vit.json
    params=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["params"])' < /tmp/vit.json)
    .venv/bin/python bench/peers/hf_peer.py --config /tmp/vit/config.json --params "$params" \\
        --batch 8 --optimizer adamw --attention sdpa --threads 1 --steps 10 --json vit-hf.json

--attention sdpa is transformers' "sdpa" implementation (scaled_dot_product_attention, as
gradscope's --attention sdpa), eager its written-out one (as gradscope's --attention math).
One batch of random inputs is made once before the loop (the memory may be profiled on the
batch of a gradscope step instead, --batch-file); how each model's batch, loss and dropout
match gradscope's is in
bench/peers/README.md ("How the peers match gradscope").
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import peer_common  # noqa: E402

# model_type -> the transformers class gradscope's config.json names in "architectures".
CLASSES = {"llama": "LlamaForCausalLM", "vit": "ViTForImageClassification",
           "modernbert": "ModernBertForMaskedLM"}


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def read_config(path):
    """The Hugging Face config gradscope wrote, and its "gradscope" key apart."""
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"--config {path!r}: {e}")
    if not isinstance(config, dict) or config.get("model_type") not in CLASSES:
        fail(f"--config {path!r}: model_type must be one of {', '.join(CLASSES)}")
    ours = config.pop("gradscope", None) or {}
    if not isinstance(ours, dict):
        fail(f"--config {path!r}: its \"gradscope\" key is not an object")
    return config, ours


def positive_int(value, what):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        fail(f"{what} must be a positive whole number, not {value!r}")
    return value


def read_batch_file(path, B, T, V):
    """batch.input_ids and batch.targets of a `gradscope outputs` file, both (B, T) int64: ids
    in [0, V), targets too or -100 (no loss taken there)."""
    from safetensors import SafetensorError, safe_open
    tensors = {}
    try:
        with safe_open(path, "pt") as f:  # the two tensors alone, not the logits and gradients
            for name in ("batch.input_ids", "batch.targets"):
                if name in f.keys():
                    tensors[name] = f.get_tensor(name)
    except (OSError, SafetensorError) as e:
        fail(f"--batch-file {path!r}: {e}")
    out = []
    for name in ("batch.input_ids", "batch.targets"):
        t = tensors.get(name)
        if t is None or t.dtype != torch.int64 or tuple(t.shape) != (B, T):
            fail(f"--batch-file {path!r}: {name} must be int64 of shape ({B}, {T}) "
                 f"(--batch and --seq), not {None if t is None else (t.dtype, tuple(t.shape))}")
        valid = (t >= 0) & (t < V)
        if name == "batch.targets":
            valid |= t == -100
        if not valid.all():
            fail(f"--batch-file {path!r}: {name} holds ids outside [0, {V})")
        out.append(t.contiguous())
    return out


def make_batch(kind, config, ours, args, gen):
    """The batch's tensors, the model's loss on them, the sequence length, and the batch of
    --batch-file (its tensors and loss) for the profiled step, or None."""
    B = positive_int(args.batch, "--batch")
    if kind == "vit":
        if args.batch_file:
            fail("--batch-file is for Llama and ModernBERT: ViT's batches are all alike")
        H = positive_int(config.get("image_size"), "the config's image_size")
        C = positive_int(config.get("num_channels"), "the config's num_channels")
        K = positive_int(len(config.get("id2label") or {}) or config.get("num_labels"),
                         "the config's number of labels")
        images = torch.randn(B, C, H, H, generator=gen)  # (B, 3, H, W)
        labels = torch.randint(0, K, (B,), generator=gen)  # (B)
        T = (H // config["patch_size"]) ** 2 + 1
        return [images, labels], (lambda m: m(pixel_values=images, labels=labels).loss), T, None
    T = positive_int(args.seq or ours.get("seq_len"), "--seq (or the config's seq_len)")
    V = positive_int(config.get("vocab_size"), "the config's vocab_size")
    if kind == "llama":
        window = torch.randint(0, V, (B, T + 1), generator=gen)  # (B, T + 1)
        inputs, targets = window[:, :-1].contiguous(), window[:, 1:].contiguous()  # (B, T)
        del window
    else:
        rate = ours.get("mlm_probability", 0.3)
        if not isinstance(rate, (int, float)) or not 0 < rate < 1:
            fail(f"the config's mlm_probability must be between 0 and 1, not {rate!r}")
        # Random tokens and a random selection at gradscope's rate: its data also puts [MASK]
        # in most selected positions, which changes the tokens, not the work.
        inputs = torch.randint(0, V, (B, T), generator=gen)     # (B, T)
        selected = torch.rand(B, T, generator=gen) < rate       # (B, T)
        selected[0, 0] = True  # at least one target
        targets = torch.where(selected, inputs, torch.full_like(inputs, -100))  # (B, T)
    profile = None
    if args.batch_file:
        given = read_batch_file(args.batch_file, B, T, V)
        if not (given[1] != -100).any():
            fail(f"--batch-file {args.batch_file!r}: no position is in the loss")
        profile = (given, text_loss(kind, V, *given))
    return [inputs, targets], text_loss(kind, V, inputs, targets), T, profile


def text_loss(kind, V, inputs, targets):
    """The loss of Llama or ModernBERT on one batch, as a function of the model."""
    if kind == "llama":
        def llama_loss(m):
            logits = m(input_ids=inputs).logits  # (B, T, V)
            # As transformers' causal-LM loss (the logits in float32, the mean over targets),
            # but over all T positions, as gradscope's: transformers' would drop the last one.
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

        return llama_loss
    return lambda m: m(input_ids=inputs, labels=targets).loss


def build(args):
    import transformers

    config_dict, ours = args.hf_config
    kind = config_dict["model_type"]
    gen = torch.Generator().manual_seed(args.seed)
    inputs, loss_fn, seq_len, profile_batch = make_batch(kind, config_dict, ours, args, gen)
    args.mark_baseline()

    if kind == "llama":
        config_dict["use_cache"] = False  # as training scripts set it; gradscope keeps none
    if kind == "modernbert":
        # The head on the selected positions only, as gradscope's head.
        config_dict["sparse_prediction"] = True
    config_dict.pop("architectures", None)
    config = transformers.AutoConfig.for_model(**config_dict)
    cls = getattr(transformers, CLASSES[kind])
    torch.manual_seed(args.seed)  # transformers initialises from the default generator
    model = cls._from_config(config, attn_implementation=args.attention,
                             dtype=torch.float32)
    in_force = getattr(model.config, "_attn_implementation", None)
    if in_force != args.attention:
        fail(f"transformers runs attention {in_force!r}, not --attention {args.attention}")
    n = sum(p.numel() for p in model.parameters())
    if n != args.params:
        fail(f"transformers' {CLASSES[kind]} from {args.config!r} has {n:,} parameters, "
             f"gradscope's run has {args.params:,} (--params): not the same architecture")
    arch = model.config.to_dict()
    arch["seq_len"] = seq_len
    return {
        "model": model,
        "loss_fn": loss_fn,
        "inputs": inputs,
        "profile_batch": profile_batch,
        "config": arch,
        "seq_len": seq_len,
        "num_classes": config_dict.get("num_labels") if kind == "vit" else None,
        "flops_per_step": None,  # the same architecture's: gradscope's record has them
    }


def main():
    parser = peer_common.make_parser(
        "Train transformers' Llama, ViT or ModernBERT at the architecture of a gradscope run "
        "(its config.json) and time the steps.", {"batch": 8}, presets=False)
    parser.add_argument("--config", required=True,
                        help="config.json written by gradscope run --save-weights DIR")
    parser.add_argument("--params", type=int, required=True,
                        help="gradscope's parameter count (the run record's params); the "
                        "script refuses to run on any other")
    parser.add_argument("--seq", type=int, default=None,
                        help="sequence length of Llama and ModernBERT (default: the config's)")
    parser.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                        help="transformers' attention implementation (default: sdpa)")
    parser.add_argument("--batch-file", default=None,
                        help="Llama and ModernBERT: profile the memory of a step on the batch "
                        "of this `gradscope outputs` file (batch.input_ids, batch.targets), "
                        "the same targets, hence the same loss head, as gradscope's step on "
                        "it; the timed steps train on random tokens")
    args = parser.parse_args()
    for name in ("batch", "steps", "warmup", "threads"):
        if getattr(args, name) < (1 if name in ("batch", "threads") else 0):
            fail(f"--{name} {getattr(args, name)} is out of range")
    args.hf_config = read_config(args.config)
    peer_common.run(args, f"transformers.{CLASSES[args.hf_config[0]['model_type']]}", build)


if __name__ == "__main__":
    main()
