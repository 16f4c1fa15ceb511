#!/usr/bin/python3
"""Peer benchmark: torchvision's VisionTransformer at the size of gradscope's ViT presets,
trained in a plain PyTorch loop.

Run with Debian's Python (the one with python3-torch and python3-torchvision):

    /usr/bin/python3 bench/peers/vit_peer.py --preset small --batch 8 --threads 1 \
        --steps 10 --json vit-peer.json

How it matches gradscope's ViT (src/gradscope/models/vit.cpp):
- Same sizes (image, patch, hidden, layers, heads, MLP, 10 classes) and the same 3-channel
  input: gradscope replicates Fashion-MNIST's grey channel to 3 before the patch
  convolution, so torchvision's default conv_proj (3 -> hidden) is the same layer, and the
  parameter count is equal, tensor for tensor (torchvision packs q, k, v into one in_proj
  matrix; gradscope keeps three, same numbers of weights and biases).
- Pre-norm blocks, exact GELU, learned class token and positions, LayerNorm epsilon 1e-12
  (ViT's; torchvision's default is 1e-6, so it is passed in), dropout 0.1 after the position
  embeddings, after the GELU, after fc2 and after attention, as in gradscope's preset.
- Not matched: initialisation (torchvision's own: truncated-normal patch projection,
  zero-initialised head, so the first loss is exactly ln 10), and the order in which
  dropout masks are drawn. Neither changes the work of a step.

Dimension legend: B batch, H = W image size, K classes.
"""

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchvision.models import VisionTransformer  # noqa: E402

import peer_common  # noqa: E402

# gradscope's vit_preset() (src/gradscope/models/vit.cpp), in Hugging Face ViTConfig names.
SHARED = {
    "num_channels": 3,
    "layer_norm_eps": 1e-12,
    "qkv_bias": True,
    "hidden_act": "gelu",
    "hidden_dropout": 0.1,
    "attention_dropout": 0.0,
    "num_labels": 10,
}
PRESETS = {
    "tiny": {"image_size": 28, "patch_size": 7, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128},
    "small": {"image_size": 32, "patch_size": 4, "hidden_size": 192, "num_hidden_layers": 6,
              "num_attention_heads": 3, "intermediate_size": 768},
}


def arch_for(preset, dropout=None):
    arch = dict(SHARED, **PRESETS[preset])
    if dropout is not None:
        arch["hidden_dropout"] = dropout
    patches = (arch["image_size"] // arch["patch_size"]) ** 2
    arch["seq_len"] = patches + 1  # with the class token
    return arch


def count_params(arch):
    """gradscope's vit_count_params(), for the check against the built model."""
    C, I, P = arch["hidden_size"], arch["intermediate_size"], arch["patch_size"]
    T, K = arch["seq_len"], arch["num_labels"]
    patch = arch["num_channels"] * P * P * C + C
    layer = (4 * C * C + 4 * C) + (2 * C * I + I + C) + 4 * C  # attention, MLP, 2 norms
    return patch + C + T * C + arch["num_hidden_layers"] * layer + 2 * C + (C + 1) * K


def forward_flops_per_image(arch):
    """gradscope's vision_forward_flops_per_image() plus the head: 2 FLOPs per multiply-add,
    matmuls, the patch convolution, attention scores and weighted sums over T x T."""
    C, I, P = arch["hidden_size"], arch["intermediate_size"], arch["patch_size"]
    T = arch["seq_len"]
    N = T - 1
    patch = 2.0 * N * arch["num_channels"] * P * P * C
    layer = 2.0 * T * (4 * C * C + 2 * C * I) + 2.0 * 2.0 * T * T * C
    head = 2.0 * C * arch["num_labels"]
    return patch + arch["num_hidden_layers"] * layer + head


def build(args):
    arch = arch_for(args.preset, args.dropout)
    gen = torch.Generator().manual_seed(args.seed)

    # One batch, made once before the loop: the data pipeline's cost is not what is compared
    # (gradscope times its data phase separately). Normal noise has the statistics of
    # normalized pixels; the labels are uniform over the classes.
    B, H = args.batch, arch["image_size"]
    images = torch.randn(B, arch["num_channels"], H, H, generator=gen)  # (B, 3, H, W)
    labels = torch.randint(0, arch["num_labels"], (B,), generator=gen)  # (B)
    args.mark_baseline()

    torch.manual_seed(args.seed)  # torchvision initialises from the default generator
    model = VisionTransformer(
        image_size=arch["image_size"],
        patch_size=arch["patch_size"],
        num_layers=arch["num_hidden_layers"],
        num_heads=arch["num_attention_heads"],
        hidden_dim=arch["hidden_size"],
        mlp_dim=arch["intermediate_size"],
        dropout=arch["hidden_dropout"],
        attention_dropout=arch["attention_dropout"],
        num_classes=arch["num_labels"],
        norm_layer=functools.partial(nn.LayerNorm, eps=arch["layer_norm_eps"]),
    )
    if arch["num_channels"] != 3:
        # torchvision's patch projection is fixed at 3 input channels.
        model.conv_proj = nn.Conv2d(arch["num_channels"], arch["hidden_size"],
                                    kernel_size=arch["patch_size"], stride=arch["patch_size"])
    n = sum(p.numel() for p in model.parameters())
    expected = count_params(arch)
    if n != expected:
        sys.exit(f"error: torchvision ViT has {n:,} parameters, gradscope's count is "
                 f"{expected:,}")

    def loss_fn(m):
        logits = m(images)                      # (B, K)
        return F.cross_entropy(logits, labels)  # mean over the batch, as gradscope

    return {
        "model": model,
        "loss_fn": loss_fn,
        "inputs": [images, labels],
        "config": arch,
        "seq_len": arch["seq_len"],
        "num_classes": arch["num_labels"],
        # 3 x forward (backward = 2 x forward), gradscope's convention.
        "flops_per_step": 3.0 * forward_flops_per_image(arch) * B,
    }


def main():
    parser = peer_common.make_parser(
        "Train torchvision's VisionTransformer at a gradscope ViT preset and time the steps.",
        {"batch": 8})
    parser.add_argument("--dropout", type=float, default=None,
                        help="dropout probability (default: the preset's, 0.1)")
    args = parser.parse_args()
    peer_common.run(args, "torchvision-vit", build)


if __name__ == "__main__":
    main()
