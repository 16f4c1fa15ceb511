#!/usr/bin/env python3
"""Peer benchmark: a Vision Transformer in plain torch.nn, with torchvision's structure
(VisionTransformer: nn.MultiheadAttention, pre-norm encoder blocks, class token), at the size of
gradscope's ViT presets, trained in a plain PyTorch loop. (torchvision itself does not import
beside the pinned CPU torch, so the same structure is written out here.)

Run with the project environment's Python (its pinned torch, gradscope's LibTorch):

    .venv/bin/python bench/peers/vit_peer.py --preset small --batch 8 --threads 1 \
        --steps 10 --json vit-peer.json

How it matches gradscope's ViT (src/gradscope/models/vit.cpp):
- Same sizes (image, patch, hidden, layers, heads, MLP, 10 classes) and the same 3-channel
  input: gradscope replicates Fashion-MNIST's grey channel to 3 before the patch
  convolution, so the 3-channel patch projection is the same layer, and the parameter count
  is equal, tensor for tensor (nn.MultiheadAttention packs q, k, v into one in_proj matrix;
  gradscope keeps three, same numbers of weights and biases).
- Pre-norm blocks, exact GELU, learned class token and positions, LayerNorm epsilon 1e-12,
  dropout 0.1 after the position embeddings, after the GELU, after fc2 and after attention,
  as in gradscope's preset; no dropout on the attention weights (nn.MultiheadAttention then
  takes scaled_dot_product_attention, as gradscope's default --attention does).
- Not matched: initialisation (PyTorch's layer defaults, zero class token and normal(0, 0.02)
  positions) and the order in which dropout masks are drawn. Neither changes the work of a
  step.

Dimension legend: B batch, H = W image size, N patches, T = N + 1 tokens, C hidden, K classes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

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
    if dropout is not None:  # as gradscope's --dropout: the hidden states and the attention
        arch["hidden_dropout"] = dropout
        arch["attention_dropout"] = dropout
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


class EncoderBlock(nn.Module):
    """x + dropout(attention(norm(x))), then x + mlp(norm(x)): torchvision's EncoderBlock."""

    def __init__(self, arch):
        super().__init__()
        C, p = arch["hidden_size"], arch["hidden_dropout"]
        eps = arch["layer_norm_eps"]
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.self_attention = nn.MultiheadAttention(C, arch["num_attention_heads"],
                                                    dropout=arch["attention_dropout"],
                                                    batch_first=True)
        self.dropout = nn.Dropout(p)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(C, arch["intermediate_size"]), nn.GELU(),
                                 nn.Dropout(p), nn.Linear(arch["intermediate_size"], C),
                                 nn.Dropout(p))

    def forward(self, x):                               # (B, T, C)
        h = self.ln_1(x)
        h, _ = self.self_attention(h, h, h, need_weights=False)
        x = x + self.dropout(h)
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, arch):
        super().__init__()
        C, P = arch["hidden_size"], arch["patch_size"]
        self.conv_proj = nn.Conv2d(arch["num_channels"], C, kernel_size=P, stride=P)
        self.class_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embedding = nn.Parameter(torch.empty(1, arch["seq_len"], C).normal_(std=0.02))
        self.dropout = nn.Dropout(arch["hidden_dropout"])
        self.layers = nn.Sequential(*[EncoderBlock(arch)
                                      for _ in range(arch["num_hidden_layers"])])
        self.ln = nn.LayerNorm(C, eps=arch["layer_norm_eps"])
        self.head = nn.Linear(C, arch["num_labels"])

    def forward(self, images):                          # (B, 3, H, W)
        x = self.conv_proj(images).flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, T, C)
        x = self.layers(self.dropout(x + self.pos_embedding))
        return self.head(self.ln(x[:, 0]))            # (B, K)


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

    torch.manual_seed(args.seed)  # the layers initialise from the default generator
    model = ViT(arch)
    n = sum(p.numel() for p in model.parameters())
    expected = count_params(arch)
    if n != expected:
        sys.exit(f"error: the peer ViT has {n:,} parameters, gradscope's count is "
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
        "Train a torch.nn ViT (torchvision's structure) at a gradscope ViT preset and time the "
        "steps.",
        {"batch": 8})
    parser.add_argument("--dropout", type=float, default=None,
                        help="dropout probability of the hidden states and the attention "
                        "weights, as gradscope's --dropout (default: the preset's, 0.1 and 0)")
    args = parser.parse_args()
    peer_common.run(args, "pytorch-vit", build)


if __name__ == "__main__":
    main()
