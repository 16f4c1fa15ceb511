#!/usr/bin/env python3
"""Peer benchmark: a plain, readable PyTorch Llama 3 decoder with the same math as
gradscope's (src/gradscope/models/llama.cpp and models/common/layers.cpp), at its tiny and
small presets, trained in a plain PyTorch loop on next-token cross-entropy.

Run with the project environment's Python (its pinned torch, gradscope's LibTorch):

    .venv/bin/python bench/peers/llama_peer.py --preset small --batch 8 --seq 128 \
        --threads 1 --steps 10 --json llama-peer.json

The model, as gradscope computes it:
- token embedding; L pre-norm blocks h = x + attn(rmsnorm(x)), y = h + swiglu(rmsnorm(h));
  a final RMSNorm; the LM head tied to the embedding (one weight used twice); no biases.
- RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * weight, eps 1e-5.
- RoPE in Hugging Face's layout (rotate_half, pairs (j, j + HS/2)), theta 500000, with
  Llama 3 frequency scaling (factor 32, low 1, high 4, original 8192); the tables are
  computed once and reused, as gradscope caches them.
- Grouped-query attention: k and v heads repeated (repeat_kv), then
  scaled_dot_product_attention with is_causal (--attention sdpa, the default, as gradscope's
  default), or attention written out as matmul, scale, causal mask (built on each call),
  softmax, matmul (--attention math, as gradscope's --attention math).
- SwiGLU MLP: down(silu(gate(x)) * up(x)).
- Initialisation as gradscope's: normal(0, 0.02) for the embedding and every linear weight,
  ones for the norms, drawn in module order from a generator seeded with --seed.

Dimension legend: B batch, T sequence positions, C hidden size, V vocabulary, NH query heads,
NKV key/value heads, HS head size, I intermediate size, L layers.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import peer_common  # noqa: E402

# gradscope's llama_preset() (src/gradscope/models/llama.cpp), in Hugging Face LlamaConfig
# names.
SHARED = {
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
}
PRESETS = {
    # bytes tokenizer: 256 bytes + 4 specials = 260, padded to 320.
    "tiny": {"vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 192,
             "seq_len": 64},
    # GPT-2's 50257 tokens padded to 50304.
    "small": {"vocab_size": 50304, "hidden_size": 256, "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 768,
              "seq_len": 128},
}


# ---------------------------------------------------------------------------------------
# Rotary embeddings


def rope_inv_freq(head_size, theta, scaling):
    """The HS/2 inverse frequencies, float32, with Llama 3 scaling (Hugging Face's
    _compute_default_rope_parameters and _compute_llama3_parameters)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.int64).float()
                                / head_size))  # (HS/2)
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are stretched by `factor`, short ones kept, the band between blended.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_tables(inv_freq, seq_len):
    positions = torch.arange(seq_len, dtype=torch.int64).float()  # (T)
    freqs = torch.outer(positions, inv_freq)                       # (T, HS/2)
    emb = torch.cat([freqs, freqs], dim=-1)                        # (T, HS)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x, cos, sin):
    # x (B, NH, T, HS), cos/sin (T, HS) broadcast over (B, NH)
    return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------------------------------
# Modules


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # (..., C) -> (..., C)
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)


def repeat_kv(x, n_rep):
    """(B, NKV, T, HS) -> (B, NKV * n_rep, T, HS), each head repeated n_rep times in a row."""
    if n_rep == 1:
        return x
    b, nkv, t, hs = x.shape
    return x.unsqueeze(2).expand(b, nkv, n_rep, t, hs).reshape(b, nkv * n_rep, t, hs)


# --attention: "sdpa" or "math" (set by build()).
ATTENTION = "sdpa"


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(HS) + causal mask) v, by scaled_dot_product_attention or written
    out, as gradscope's --attention says.
    q (B, NH, T, HS), k/v (B, NKV, T, HS) -> (B, NH, T, HS)"""
    nh, nkv, t = q.shape[1], k.shape[1], q.shape[2]
    k = repeat_kv(k, nh // nkv)  # (B, NH, T, HS)
    v = repeat_kv(v, nh // nkv)
    if ATTENTION == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B,NH,T,T)
    keep = torch.ones(t, t, dtype=torch.bool).tril()  # query t sees keys 0..t
    scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)  # (B, NH, T, HS)


class Attention(nn.Module):
    def __init__(self, c, nh, nkv, hs):
        super().__init__()
        self.nh, self.nkv, self.hs = nh, nkv, hs
        # Registration order is gradscope's (q, k, v, o): the weights are drawn in this order.
        self.q_proj = nn.Linear(c, nh * hs, bias=False)
        self.k_proj = nn.Linear(c, nkv * hs, bias=False)
        self.v_proj = nn.Linear(c, nkv * hs, bias=False)
        self.o_proj = nn.Linear(nh * hs, c, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, C) -> (B, T, C)
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hs).transpose(1, 2)   # (B, NH, T, HS)
        k = self.k_proj(x).view(b, t, self.nkv, self.hs).transpose(1, 2)  # (B, NKV, T, HS)
        v = self.v_proj(x).view(b, t, self.nkv, self.hs).transpose(1, 2)  # (B, NKV, T, HS)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = causal_attention(q, k, v)                                     # (B, NH, T, HS)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nh * self.hs))


class SwiGLU(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.gate_proj = nn.Linear(c, i, bias=False)
        self.up_proj = nn.Linear(c, i, bias=False)
        self.down_proj = nn.Linear(i, c, bias=False)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        c, nh = a["hidden_size"], a["num_attention_heads"]
        self.input_layernorm = RMSNorm(c, a["rms_norm_eps"])
        self.self_attn = Attention(c, nh, a["num_key_value_heads"], c // nh)
        self.post_attention_layernorm = RMSNorm(c, a["rms_norm_eps"])
        self.mlp = SwiGLU(c, a["intermediate_size"])

    def forward(self, x, cos, sin):  # (B, T, C) -> (B, T, C)
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        c = a["hidden_size"]
        self.embed_tokens = nn.Embedding(a["vocab_size"], c)
        self.layers = nn.ModuleList(Block(a) for _ in range(a["num_hidden_layers"]))
        self.norm = RMSNorm(c, a["rms_norm_eps"])
        # Tied LM head: logits use embed_tokens.weight, no separate matrix.
        inv_freq = rope_inv_freq(c // a["num_attention_heads"], a["rope_theta"],
                                 a["rope_scaling"])
        cos, sin = rope_tables(inv_freq, a["seq_len"])
        self.register_buffer("rope_cos", cos, persistent=False)  # (T, HS)
        self.register_buffer("rope_sin", sin, persistent=False)  # (T, HS)

    def init_weights(self, std, seed):
        """normal(0, std) for embedding and linear weights, ones for norms, drawn in module
        order from a generator of its own (gradscope's init_weights_normal)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.normal_(0.0, std, generator=gen)
                elif isinstance(m, RMSNorm):
                    m.weight.fill_(1.0)

    def forward(self, input_ids):  # (B, T) int64 -> (B, T, V)
        t = input_ids.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.embed_tokens(input_ids)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.embed_tokens.weight)  # (B, T, V)


# ---------------------------------------------------------------------------------------
# Counts


def count_params(a):
    """gradscope's llama_count_params() for this configuration (tied, no biases)."""
    c, i, v = a["hidden_size"], a["intermediate_size"], a["vocab_size"]
    hs = c // a["num_attention_heads"]
    q_out, kv_out = a["num_attention_heads"] * hs, a["num_key_value_heads"] * hs
    layer = (c * q_out + 2 * c * kv_out + q_out * c) + 3 * c * i + 2 * c
    return v * c + a["num_hidden_layers"] * layer + c


def forward_flops_per_token(a, seq_len):
    """gradscope's llama_forward_flops_per_token(): 2 FLOPs per multiply-add over the
    matmuls (the tied head counts) plus scores and weighted sums over the full T x T."""
    c, i, v, n_layers = a["hidden_size"], a["intermediate_size"], a["vocab_size"], \
        a["num_hidden_layers"]
    hs = c // a["num_attention_heads"]
    q_out, kv_out = a["num_attention_heads"] * hs, a["num_key_value_heads"] * hs
    layer_matmul = c * q_out + 2 * c * kv_out + q_out * c + 3 * c * i
    attention = 2.0 * 2.0 * seq_len * q_out
    return 2.0 * (n_layers * layer_matmul + v * c) + n_layers * attention


# ---------------------------------------------------------------------------------------


def build(args):
    global ATTENTION
    ATTENTION = args.attention
    arch = dict(SHARED, **PRESETS[args.preset])
    if args.seq is not None:
        arch["seq_len"] = args.seq
    B, T, V = args.batch, arch["seq_len"], arch["vocab_size"]
    gen = torch.Generator().manual_seed(args.seed)

    # One batch, made once before the loop: the data pipeline's cost is not what is compared
    # (gradscope times its data phase separately). A window of T + 1 uniform random tokens
    # gives inputs and next-token targets, as gradscope cuts its text.
    window = torch.randint(0, V, (B, T + 1), generator=gen)  # (B, T + 1)
    input_ids = window[:, :-1].contiguous()                 # (B, T)
    targets = window[:, 1:].contiguous()                    # (B, T)
    del window
    args.mark_baseline()

    model = Llama(arch)
    model.init_weights(arch["initializer_range"], args.seed)
    n = sum(p.numel() for p in model.parameters())
    expected = count_params(arch)
    if n != expected:
        sys.exit(f"error: the peer Llama has {n:,} parameters, gradscope's count is "
                 f"{expected:,}")

    def loss_fn(m):
        logits = m(input_ids)  # (B, T, V)
        # Mean over all B x T targets (gradscope: summed, divided by the target count).
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))

    return {
        "model": model,
        "loss_fn": loss_fn,
        "inputs": [input_ids, targets],
        "config": arch,
        "seq_len": T,
        "num_classes": V,
        # 3 x forward (backward = 2 x forward), gradscope's convention.
        "flops_per_step": 3.0 * forward_flops_per_token(arch, T) * B * T,
    }


def main():
    parser = peer_common.make_parser(
        "Train a plain PyTorch Llama 3 decoder at a gradscope preset and time the steps.",
        {"batch": 8})
    parser.add_argument("--seq", type=int, default=None,
                        help="sequence length (default: the preset's, 64 tiny, 128 small)")
    parser.add_argument("--attention", choices=["sdpa", "math"], default="sdpa",
                        help="scaled_dot_product_attention or written out (default: sdpa)")
    args = parser.parse_args()
    peer_common.run(args, "pytorch-llama", build)


if __name__ == "__main__":
    main()
