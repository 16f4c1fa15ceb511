"""gradscope's NanoVLM against its parts in Hugging Face transformers: nanoVLM has no
transformers class, but its parts do. From the weights gradscope writes (nanoVLM's own layout,
docs/weights.md), a SiglipVisionModel (the vision encoder: q, k and v split from qkv_proj, the
position embedding a table), the projector by its definition (pixel shuffle, then MP.proj
without bias) and a LlamaForCausalLM (the decoder, its head tied) are composed as nanoVLM
composes them: image tokens before the caption's token embeddings, one causal decoder pass
with the caption's padding masked as keys, the final norm and head on the caption positions.
On the batch `gradscope outputs` wrote, the composition's logits, mean loss and every
parameter's gradient (mapped back to nanoVLM's names, q, k and v stacked again) must equal
gradscope's.

  nanovlm_parts_test.py GRADSCOPE [--only NAME[,NAME...]] [--list] [--keep DIR]

Tolerances as tests/peers/hf_models_test.py's fp32 ones (loss 1e-5, logits 1e-5, every
gradient tensor 1e-4, relative per tensor): the same products in another order of float32
sums. gradscope's --attention math is composed with transformers' "eager", sdpa with "sdpa".

Exit status: 0 every case within its tolerances, 1 a difference (every one is printed), 2 bad
input, 77 skipped (no transformers or safetensors package, or the data not fetched).
"""
import json
import os
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from peer_common import (EMOJI, GPT2, Failure, gradscope, peer_main, relative,
                             save_weights)
except ImportError as e:
    print(f"nanovlm_parts_test: skipped: {e} (pip install -r requirements.txt)")
    sys.exit(77)

TOLERANCES = {"loss": 1e-5, "logits": 1e-5, "grad": 1e-4}
ATTENTION = [("math", "eager"), ("sdpa", "sdpa")]
# ViT-style images are made when none are fetched; the captions' text is fetched data.
CASES = [
    ("nanovlm-tiny", "nanovlm", ["--preset", "tiny"], []),
    # Its data set at small is the emoji set.
    ("nanovlm-small", "nanovlm", ["--preset", "small", "--batch", "4"], GPT2 + [EMOJI]),
]


def parts(cfg, w):
    """The SiglipVisionModel, the projector weight and the LlamaForCausalLM holding gradscope's
    weights `w` (nanoVLM's names), and the map from each transformers parameter to the nanoVLM
    tensor it came from: (name, how), how one of "same", "row" (the position table, stacked
    under a leading 1) or ("qkv", i) (the i-th third of qkv_proj)."""
    cv, layers = cfg["vit_hidden_dim"], cfg["vit_n_blocks"]
    vision = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
        hidden_size=cv, intermediate_size=cfg["vit_inter_dim"], num_hidden_layers=layers,
        num_attention_heads=cfg["vit_n_heads"], num_channels=3, image_size=cfg["vit_img_size"],
        patch_size=cfg["vit_patch_size"], hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=cfg["vit_ln_eps"], attention_dropout=0.0, vision_use_head=False))
    vmap = {"embeddings.patch_embedding.weight": ("vision_encoder.patch_embedding.conv.weight",
                                                  "same"),
            "embeddings.patch_embedding.bias": ("vision_encoder.patch_embedding.conv.bias",
                                                "same"),
            "embeddings.position_embedding.weight": (
                "vision_encoder.patch_embedding.position_embedding", "row"),
            "post_layernorm.weight": ("vision_encoder.layer_norm.weight", "same"),
            "post_layernorm.bias": ("vision_encoder.layer_norm.bias", "same")}
    for i in range(layers):
        b, h = f"vision_encoder.blocks.{i}.", f"encoder.layers.{i}."
        for part in ("weight", "bias"):
            for j, x in enumerate("qkv"):
                vmap[f"{h}self_attn.{x}_proj.{part}"] = (f"{b}attn.qkv_proj.{part}", ("qkv", j))
            for ours, theirs in (("attn.out_proj", "self_attn.out_proj"), ("ln1", "layer_norm1"),
                                 ("ln2", "layer_norm2"), ("mlp.fc1", "mlp.fc1"),
                                 ("mlp.fc2", "mlp.fc2")):
                vmap[f"{h}{theirs}.{part}"] = (f"{b}{ours}.{part}", "same")
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=cfg["lm_vocab_size"], hidden_size=cfg["lm_hidden_dim"],
        intermediate_size=cfg["lm_inter_dim"], num_hidden_layers=cfg["lm_n_blocks"],
        num_attention_heads=cfg["lm_n_heads"], num_key_value_heads=cfg["lm_n_kv_heads"],
        rms_norm_eps=cfg["lm_rms_eps"], rope_theta=cfg["lm_re_base"], tie_word_embeddings=True,
        max_position_embeddings=cfg["lm_max_position_embeddings"], attention_bias=False,
        mlp_bias=False))
    lmap = {"model.embed_tokens.weight": ("decoder.token_embedding.weight", "same"),
            "model.norm.weight": ("decoder.norm.weight", "same")}
    for i in range(cfg["lm_n_blocks"]):
        b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
        for ours, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o")):
            lmap[f"{h}self_attn.{theirs}_proj.weight"] = (f"{b}attn.{ours}_proj.weight", "same")
        for x in ("gate", "up", "down"):
            lmap[f"{h}mlp.{x}_proj.weight"] = (f"{b}mlp.{x}_proj.weight", "same")
        lmap[f"{h}input_layernorm.weight"] = (f"{b}norm1.weight", "same")
        lmap[f"{h}post_attention_layernorm.weight"] = (f"{b}norm2.weight", "same")
    for model, names in ((vision, vmap), (lm, lmap)):
        state = {}
        for theirs, (ours, how) in names.items():
            t = w[ours]
            state[theirs] = t[0] if how == "row" else t.chunk(3, 0)[how[1]] if how != "same" \
                else t
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if m != "lm_head.weight"]  # tied to the embedding
        if missing or unexpected:
            raise Failure(f"{type(model).__name__}: missing {missing}, unexpected {unexpected}")
    lm.tie_weights()
    projector = w["MP.proj.weight"].clone().requires_grad_(True)
    return vision, projector, lm, vmap, lmap


def pixel_shuffle(x, s):
    """nanoVLM's: (B, side * side, C) -> (B, (side / s)^2, s^2 C), s x s neighbours per cell."""
    b, n, c = x.shape
    side = int(round(n ** 0.5))
    cells = side // s
    return x.reshape(b, cells, s, cells, s, c).permute(0, 1, 3, 2, 4, 5).reshape(
        b, cells * cells, s * s * c)


def composed(cfg, vision, projector, lm, o):
    """nanoVLM's forward from the three parts: the caption positions' logits and mean loss."""
    patches = vision(pixel_values=o["batch.images"]).last_hidden_state  # (B, N, Cv)
    image = pixel_shuffle(patches, cfg["mp_pixel_shuffle_factor"]) @ projector.T  # (B, n, C)
    text = lm.model.embed_tokens(o["batch.input_ids"])  # (B, T, C)
    x = torch.cat([image, text], 1)
    n = image.shape[1]
    mask = torch.cat([torch.ones(x.shape[0], n, dtype=torch.long), o["batch.text_mask"]], 1)
    hidden = lm.model(inputs_embeds=x, attention_mask=mask).last_hidden_state[:, n:]
    logits = lm.lm_head(hidden)  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), o["batch.targets"].flatten(),
                                             ignore_index=-100)
    return logits, loss


def gradients(vision, projector, lm, vmap, lmap):
    """The composition's gradients under nanoVLM's names (q, k and v stacked again)."""
    out = {"MP.proj.weight": projector.grad}
    stacked = {}
    for model, names in ((vision, vmap), (lm, lmap)):
        params = dict(model.named_parameters())
        for theirs, (ours, how) in names.items():
            g = params[theirs].grad
            if g is None:
                raise Failure(f"transformers' {theirs} got no gradient")
            if how == "row":
                out[ours] = g.unsqueeze(0)
            elif how == "same":
                out[ours] = g
            else:
                stacked.setdefault(ours, [None] * 3)[how[1]] = g
    for ours, thirds in stacked.items():
        out[ours] = torch.cat(thirds, 0)
    return out


def run_case(gs, case, work):
    name, model_name, settings, _ = case
    weights = save_weights(gs, model_name, settings, os.path.join(work, name + "-weights"))
    with open(os.path.join(weights, "config.json")) as f:
        cfg = json.load(f)
    w = load_file(os.path.join(weights, "model.safetensors"))
    failed = False
    for attention, theirs in ATTENTION:
        out = os.path.join(work, f"{name}-{attention}.safetensors")
        gradscope(gs, ["outputs", "--model", model_name] + settings +
                  ["--init-from", weights, "--attention", attention, "--out", out],
                  f"{name}: gradscope outputs")
        o = load_file(out)
        vision, projector, lm, vmap, lmap = parts(cfg, w)
        for model in (vision, lm):
            model.eval()
            model.config._attn_implementation = theirs
        logits, loss = composed(cfg, vision, projector, lm, o)
        loss.backward()
        grads = gradients(vision, projector, lm, vmap, lmap)
        written = {k[len("grad."):]: v for k, v in o.items() if k.startswith("grad.")}
        if set(written) != set(grads):
            raise Failure(f"gradients: gradscope wrote {sorted(set(written) - set(grads))}, "
                          f"the composition has {sorted(set(grads) - set(written))} besides")
        rows = [("loss", relative(o["loss"], loss.detach()), TOLERANCES["loss"]),
                ("logits", relative(o["logits"], logits.detach()), TOLERANCES["logits"])]
        worst = max(((relative(written[k], g), k) for k, g in grads.items()))
        rows += [(f"grad.{k}", r, TOLERANCES["grad"]) for k, g in grads.items()
                 for r in [relative(written[k], g)] if r > TOLERANCES["grad"]]
        rows.append((f"grads ({len(grads)}; worst {worst[1]})", worst[0], TOLERANCES["grad"]))
        for what, r, tol in rows:
            ok = r <= tol
            failed |= not ok
            print(f"  {name:<14} {attention}/{theirs:<6} {what:<56} {r:.2e} (<= {tol:.0e}) "
                  f"{'ok' if ok else 'FAILED'}")
    return not failed


def main():
    return peer_main("nanovlm_parts_test", __doc__, CASES,
                     "write the weights and outputs here and keep them", run_case,
                     f"transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    sys.exit(main())
