"""What the peer tests share: running gradscope, the relative difference they report, and a
transformers model run on the batch `gradscope outputs` wrote (in the layout gradscope writes
its logits). Imported by the scripts beside it, which run it with the same Python."""
import subprocess
import sys

import torch
import transformers

SKIP, BAD_INPUT, MISMATCH = 77, 2, 1

# The transformers class of each model gradscope compares.
CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "modernbert": transformers.ModernBertForMaskedLM,
    "vit": transformers.ViTForImageClassification,
}


class Failure(Exception):
    pass


def gradscope(gs, args, what):
    """Runs gradscope; its output on failure. A usage error (2) is bad input for the test."""
    p = subprocess.run([gs] + args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise Failure(f"{what}: gradscope exited {p.returncode}: {' '.join(args)}")
    return p.stdout


def relative(a, b):
    """||a - b|| / ||b|| in float64 (||a - b|| itself when b is zero)."""
    a, b = a.double(), b.double()
    scale = b.norm().item()
    diff = (a - b).norm().item()
    return diff / scale if scale > 0 else diff


def hf_forward(model_name, model, outputs, bf16=False):
    """The transformers model on gradscope's batch (`outputs`, as load_file reads it): its
    logits in the layout gradscope writes them (ModernBERT: the masked positions only, in
    row-major order) and the mean cross-entropy over the same targets (-100 ignored), under
    bfloat16 autocast when `bf16`. Gradients flow unless the caller turns them off."""
    F = torch.nn.functional
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if model_name == "vit":
            logits = model(pixel_values=outputs["batch.images"]).logits  # (B, K)
            targets = outputs["batch.labels"]
        else:
            logits = model(input_ids=outputs["batch.input_ids"]).logits  # (B, T, V)
            targets = outputs["batch.targets"]
            if model_name == "modernbert":
                logits = logits[targets != -100]  # (M, V), row-major
                targets = targets[targets != -100]
            else:
                logits = logits.flatten(0, 1)
                targets = targets.flatten()
    loss = F.cross_entropy(logits.float(), targets, ignore_index=-100)
    return logits, loss
