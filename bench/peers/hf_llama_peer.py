#!/usr/bin/env python3
"""Peer benchmark on a GPU: Hugging Face transformers' LlamaForCausalLM at the size of
gradscope's Llama presets (`paper` is Llama-3.2-1B's config.json; no weights are needed),
trained in the textbook loop, so that gradscope's step on the same GPU can be read beside
the one most people run.

    python3 bench/peers/hf_llama_peer.py train --preset paper --batch 4 --seq 2048 \
        --steps 10 --json hf-llama.json

Same settings as `gradscope run --model llama --preset paper --dtype bf16 --optimizer adamw
--weight-decay 0`: float32 parameters, gradients and optimizer state (the master weights),
matrix products under bfloat16 autocast; torch.optim.AdamW fused (lr 1e-3, betas 0.9/0.999, eps
1e-8, weight decay 0; fused as gradscope's step and Hugging Face's Trainer run it); next-token
cross-entropy over `seq` positions of windows of seq + 1 tokens. The batch is uniform random
tokens (the step's cost does not depend on them).
Reported: tokens per second over the timed steps (each step's end synchronised) and the
peak of allocated CUDA memory over warm-up and timed steps (torch.cuda.max_memory_allocated,
what gradscope's record calls memory.peak_bytes on CUDA).

    python3 bench/peers/hf_llama_peer.py loss --weights DIR --text FILE --seq 64 \
        --gradscope-eval eval.json

loads a folder gradscope wrote (`gradscope run ... --save-weights DIR`) with
LlamaForCausalLM.from_pretrained and computes what `gradscope eval --text FILE` computes on
it: the mean next-token loss over windows of seq + 1 tokens stepped by seq (the last partial
window dropped) of the file's tokens, for a model with gradscope's byte tokenizer (the tiny
preset: each UTF-8 byte is its token id). With --gradscope-eval, compares with that eval's
loss_nats and exits 1 when they differ by more than --tolerance.

Needs torch and transformers (the GPU machine's python3 has both).
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The architecture of gradscope's presets, in LlamaConfig's names (shared values and the
# tiny and small sizes are llama_peer.py's; paper is gradscope's llama_preset("paper"),
# itself meta-llama/Llama-3.2-1B's config.json).
from llama_peer import PRESETS, SHARED  # noqa: E402

PAPER = {"vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
         "seq_len": 2048}


def llama_config(preset):
    from transformers import LlamaConfig

    sizes = dict(PAPER if preset == "paper" else PRESETS[preset])
    seq = sizes.pop("seq_len")
    return LlamaConfig(max_position_embeddings=max(seq, 8192), **SHARED, **sizes), seq


def train(args):
    from transformers import LlamaForCausalLM

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device")
    torch.manual_seed(args.seed)
    config, preset_seq = llama_config(args.preset)
    seq = args.seq or preset_seq
    device = torch.device(args.device)
    # transformers' "sdpa" calls scaled_dot_product_attention, as gradscope's --attention sdpa;
    # "eager" writes it out, as gradscope's --attention math.
    config._attn_implementation = args.attention
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.float32)
    attention = getattr(model.config, "_attn_implementation", args.attention)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=args.weight_decay, fused=True)
    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    autocast = args.dtype == "bf16"

    def batch():
        tokens = torch.randint(0, config.vocab_size, (args.batch, seq + 1), generator=generator)
        tokens = tokens.to(device)
        return tokens[:, :-1], tokens[:, 1:]

    def step():
        inputs, targets = batch()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=inputs).logits
        # As transformers' own loss does: the logits in float32 for the cross-entropy.
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses = []
    for _ in range(args.warmup):
        losses.append(float(step()))
    sync()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    total = sum(times)
    tokens = args.batch * seq * args.steps
    record = {
        "peer": "transformers.LlamaForCausalLM",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "attention": attention,
        "preset": args.preset, "batch": args.batch, "seq": seq, "dtype": args.dtype,
        "optimizer": "adamw", "lr": args.lr, "weight_decay": args.weight_decay,
        "parameters": params, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "step_median_s": sorted(times)[len(times) // 2] if times else None,
        "tokens_per_s": tokens / total if total > 0 else None,
        "peak_allocated_bytes":
            torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "losses": losses,
    }
    print(json.dumps({k: v for k, v in record.items() if k != "losses"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if all(math.isfinite(x) for x in losses) else 1


def loss(args):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(args.weights, torch_dtype=torch.float32)
    model.eval()
    with open(args.text, "rb") as f:
        ids = list(f.read())
    if model.config.vocab_size < 256:
        sys.exit("error: not a byte-tokenizer model (vocabulary under 256)")
    windows = [ids[i:i + args.seq + 1] for i in range(0, len(ids) - args.seq, args.seq)]
    windows = [w for w in windows if len(w) == args.seq + 1]
    if not windows:
        sys.exit("error: the text is shorter than one window")
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), args.batch):
            chunk = torch.tensor(windows[i:i + args.batch], dtype=torch.long)
            logits = model(input_ids=chunk[:, :-1]).logits.float()
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           chunk[:, 1:].reshape(-1), reduction="sum"))
            count += chunk[:, 1:].numel()
    mean = total / count
    result = {"windows": len(windows), "tokens": count, "loss_nats": mean}
    status = 0
    if args.gradscope_eval:
        with open(args.gradscope_eval) as f:
            theirs = json.load(f)["loss_nats"]
        result["gradscope_loss_nats"] = theirs
        result["difference"] = abs(mean - theirs)
        status = 0 if abs(mean - theirs) <= args.tolerance else 1
    print(json.dumps(result, indent=1))
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="time the training step")
    t.add_argument("--preset", choices=["tiny", "small", "paper"], default="paper")
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--seq", type=int, default=0, help="default: the preset's")
    t.add_argument("--steps", type=int, default=10, help="timed steps")
    t.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    t.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--device", default="cuda")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                   help="transformers' attention implementation (default: sdpa)")
    t.add_argument("--json", default=None)
    e = sub.add_parser("loss", help="the loss of a folder gradscope wrote, as gradscope eval")
    e.add_argument("--weights", required=True)
    e.add_argument("--text", required=True)
    e.add_argument("--seq", type=int, required=True)
    e.add_argument("--batch", type=int, default=8)
    e.add_argument("--gradscope-eval", default=None)
    e.add_argument("--tolerance", type=float, default=1e-4)
    args = p.parse_args()
    for name in ("batch", "steps", "seq"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 0:
            sys.exit(f"error: --{name} must not be negative")
    sys.exit(train(args) if args.command == "train" else loss(args))


if __name__ == "__main__":
    main()
