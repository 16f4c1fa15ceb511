"""gradscope's models against Hugging Face transformers: from the same weights and the same
batch, the same logits, loss and per-parameter gradients.

  hf_models_test.py GRADSCOPE [--only NAME[,NAME...]] [--list] [--keep DIR]

Each case is a model (llama: LlamaForCausalLM, modernbert: ModernBertForMaskedLM, vit:
ViTForImageClassification) at a preset, or shaped like the published model with fewer layers.
For each case the weights come from both sides:
  - gradscope's: `gradscope run ... --save-weights W` (one SGD step from the preset's
    initialisation), loaded by transformers with from_pretrained;
  - transformers': a model built with from_config on W's config.json (its "gradscope" block
    removed: a plain Hugging Face config) from a seeded random initialisation ten times wider
    than its default (initializer_range 0.2, narrowed for models wider than the small presets to
    the same spread of activations: they then reach where every nonlinearity bends, so that one
    computed another way, a tanh GELU for the exact one, shows) and written
    with save_pretrained, loaded by gradscope with --init-from.
For each source, `gradscope outputs --init-from ... --attention A` writes its first training
batch, logits, mean loss and the gradients of that loss under the published names; the
transformers model (eval mode: no dropout) runs the same batch with the attention
implementation that computes the same thing (gradscope's sdpa: transformers' "sdpa"; gradscope's
math: transformers' "eager"; the published shapes sdpa only), takes the same loss with torch's
cross_entropy (mean over the targets gradscope gave, -100 ignored) and its backward. And once
per model, at its tiny preset, in bf16: gradscope --dtype bf16 against the same transformers
model under torch.autocast("cpu", bfloat16).

Tolerances (relative: ||a - b|| / ||b||, b the transformers value; each tensor on its own):
  fp32: loss 1e-5, logits 1e-5, every gradient tensor 1e-4. The two sides compute the same
    products in float32 and differ only in the order of their sums (unit roundoff u = 2^-24,
    about 6e-8). A sum of K terms in another order differs by at most about K u relative in the
    worst case, 5e-4 at the published Llama's K = 8192 (its MLP width), and typically by
    sqrt(K) u, 5e-6 there: the tolerances rest on the typical case, with a margin of 20 for the
    gradients, which pass through two such products per layer more than the loss does.
  bf16: per tensor, twice transformers' own bf16 error on it (its bf16 value against its fp32
    value, the same measure), and never below the fp32 tolerance. Under autocast the operands of
    every matrix product are rounded to bfloat16 (u = 2^-9) on both sides, and a value one float32
    ulp apart before a rounding can land 2^-8 apart after it, so the two sides' bf16 results
    differ by rounding noise of the size of autocast's own error on each. That bound alone would
    pass a gradscope that ignored --dtype (its float32 result is within transformers' error of
    transformers' bf16 one), so gradscope's logits must also be bfloat16, as autocast leaves
    them, and its own bf16 error on them (bf16 against its fp32 outputs) at least a quarter of
    transformers'. The loss, one number, can come out of transformers' bf16 nearly exact by
    luck (its errors cancel in the mean): its tolerance is the logits' instead.
The gradient of an attention key's bias (ViT's) is zero in exact arithmetic, so its difference is
taken relative to the key weight's gradient. Every figure measured is printed, so a tolerance's
margin can be read from the output.

Exit status: 0 every case within its tolerances, 1 a difference (every one is printed), 2 bad
input, 77 skipped (no transformers or safetensors package, or the data gradscope trains on is
not fetched).
"""
import json
import os
import shutil
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from peer_common import (CLASSES, GPT2, LLAMA3, SOTU, Failure, gradscope, hf_forward,
                             peer_main, relative, save_weights)
except ImportError as e:
    print(f"hf_models_test: skipped: {e} (pip install -r requirements.txt)")
    sys.exit(77)

TOLERANCES = {"fp32": {"loss": 1e-5, "logits": 1e-5, "grad": 1e-4}}

# (name, model, gradscope settings): the presets, and a configuration shaped like the published
# one (its widths, heads and vocabulary; fewer layers, a short sequence), named NAME-published.
CASES = [
    ("llama-tiny", "llama", ["--preset", "tiny"], [SOTU]),
    ("llama-small", "llama", ["--preset", "small", "--batch", "2"], [SOTU] + GPT2),
    ("llama-published", "llama",
     ["--preset", "paper", "--arch", "num_hidden_layers=2", "--seq", "64", "--batch", "1"],
     [SOTU] + LLAMA3),
    ("modernbert-tiny", "modernbert", ["--preset", "tiny"], [SOTU]),
    ("modernbert-small", "modernbert", ["--preset", "small", "--batch", "2"], [SOTU] + GPT2),
    # Three layers: one global attention layer and two sliding-window ones (window 128 of 256).
    ("modernbert-published", "modernbert",
     ["--preset", "paper", "--arch", "num_hidden_layers=3", "--seq", "256", "--batch", "1"],
     [SOTU] + GPT2),
    # ViT reads images it makes when none are fetched.
    ("vit-tiny", "vit", ["--preset", "tiny"], []),
    ("vit-small", "vit", ["--preset", "small", "--batch", "4"], []),
    ("vit-published", "vit", ["--preset", "paper", "--arch", "num_hidden_layers=2",
                              "--batch", "2"], []),
]
# The gradient of an attention key's bias is zero in exact arithmetic (it adds q.b to every
# score of a query's row, which the softmax ignores): each side gives rounding noise, whose
# difference is compared with the norm of the key weight's gradient instead of its own.
ZERO_GRADIENT_SUFFIX = ".attention.attention.key.bias"
# Attention: gradscope's path and the transformers implementation that computes the same thing.
ATTENTION = [("sdpa", "sdpa"), ("math", "eager")]
# The spread of the weights transformers draws (its default is 0.02): wide enough that the
# activations reach where every nonlinearity bends, so that a nonlinearity computed another
# way (a tanh GELU for the exact one) shows in the logits.
WIDE_INIT = 0.2
# The width at which WIDE_INIT holds (the small presets'). A product's outputs spread as
# sqrt(width) x the weights' spread, so wider models draw narrower weights, to the same spread
# of activations: the published Llama's logits at 0.2 spread so far (their std about 9) that the
# softmax, nearly one-hot, turns the logits' rounding differences (a few 1e-6) into gradient
# differences of 4e-4, the worst case of the sums' order rather than the typical one.
WIDE_INIT_WIDTH = 256


def wide_init(hidden_size):
    """The weights' spread for a model of this width: WIDE_INIT, narrowed above
    WIDE_INIT_WIDTH by sqrt(WIDE_INIT_WIDTH / hidden_size)."""
    return WIDE_INIT * min(1.0, (WIDE_INIT_WIDTH / hidden_size) ** 0.5)


def hf_outputs(model_name, weights, attention, outputs, bf16, folder):
    """The transformers model from `weights` on gradscope's batch, in the names and layouts of
    gradscope's outputs file: "loss", "logits" and "grad.<published name>"."""
    model = CLASSES[model_name].from_pretrained(weights, attn_implementation=attention,
                                                dtype=torch.float32)
    model.eval()  # no dropout; gradients are still taken
    logits, loss = hf_forward(model_name, model, outputs, bf16)
    loss.backward()
    result = {"loss": loss.detach(), "logits": logits.detach().float()}
    for name, g in saved_gradients(model, folder).items():
        result["grad." + name] = g
    return result


def difference(key, a, b, reference):
    """||a - b|| relative to ||b||; for a gradient that is zero in exact arithmetic, relative
    to its weight's gradient in `reference` instead."""
    if key.endswith(ZERO_GRADIENT_SUFFIX):
        weight = reference[key[:-len("bias")] + "weight"].double().norm().item()
        return (a.double() - b.double()).norm().item() / weight
    return relative(a, b)


def compare(model_name, weights, attention, dtype, outputs_file, own_fp32_file=None):
    """Loads `weights` into transformers, runs gradscope's batch, and returns the rows of
    differences: (what, relative difference, tolerance). In bf16 each tensor's tolerance is
    twice transformers' own bf16 error on it (its bf16 value against its fp32 one), and never
    below the fp32 tolerance."""
    outputs = load_file(outputs_file)
    logits_dtype = outputs["logits"].dtype
    outputs["logits"] = outputs["logits"].float()
    hf_attention = dict(ATTENTION)[attention]
    bf16 = dtype == "bf16"
    hf = hf_outputs(model_name, weights, hf_attention, outputs, bf16, outputs_file + ".hf")
    hf["logits"] = hf["logits"].reshape(outputs["logits"].shape)
    if bf16:
        exact = hf_outputs(model_name, weights, hf_attention, outputs, False,
                           outputs_file + ".hf32")
        exact["logits"] = exact["logits"].reshape(outputs["logits"].shape)
    missing = sorted(k for k in set(hf) - set(outputs) if k.startswith("grad."))
    extra = sorted(k for k in set(outputs) - set(hf) if k.startswith("grad."))
    if missing or extra:
        raise Failure(f"gradients: transformers has {missing} that gradscope did not write, "
                      f"gradscope wrote {extra} that transformers does not have")
    rows = []
    worst_name, worst, worst_tol = "", -1.0, 0.0
    grads = 0
    for key, value in hf.items():
        if tuple(outputs[key].shape) != tuple(value.shape):
            raise Failure(f"{key}: gradscope {tuple(outputs[key].shape)}, "
                          f"transformers {tuple(value.shape)}")
        kind = "grad" if key.startswith("grad.") else key
        tol = TOLERANCES["fp32"][kind]
        if bf16:  # the loss, one number, can agree by luck: its scale is the logits' error
            own = "logits" if key == "loss" else key
            tol = max(tol, 2 * difference(own, hf[own], exact[own], exact))
        r = difference(key, outputs[key], value, hf)
        if kind != "grad":
            rows.append((key, r, tol))
            continue
        grads += 1
        if r / tol > worst / max(worst_tol, 1e-300):
            worst_name, worst, worst_tol = key[len("grad."):], r, tol
        if r > tol:
            rows.append((key, r, tol))
    rows.append((f"grads ({grads}; nearest its tolerance: {worst_name})", worst, worst_tol))
    if bf16:
        # A gradscope that computed in float32 whatever --dtype said would be within transformers'
        # own bf16 error of transformers' bf16 result: so its logits must be bfloat16, as
        # autocast leaves them, and its own bf16 error on them at least a quarter of
        # transformers'.
        rows.append(("logits not bfloat16 (0: they are)", float(logits_dtype != torch.bfloat16),
                     0.0))
        own = relative(outputs["logits"], load_file(own_fp32_file)["logits"].float())
        theirs = relative(hf["logits"], exact["logits"])
        rows.append((f"bf16 error on the logits, transformers' {theirs:.2e} / gradscope's",
                     theirs / max(own, 1e-300), 4.0))
    return rows


def saved_gradients(model, folder):
    """The gradients of the model's parameters under the names transformers writes its weights
    with (its save_pretrained maps its modules to the published checkpoint's names, e.g. ViT's
    vit.encoder.layer.N...; a tied weight once): each parameter's gradient copied over its
    value, the model saved, and the files read back."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.grad is None:
                raise Failure(f"transformers' {name} got no gradient")
            p.copy_(p.grad)
    model.save_pretrained(folder)
    tensors = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, file)))
    shutil.rmtree(folder)
    return tensors


def hf_saved_weights(model_name, gradscope_weights, out):
    """A transformers model of the same configuration, randomly initialised from a seed, written
    with save_pretrained: the config as plain Hugging Face keys (no "gradscope" block)."""
    with open(os.path.join(gradscope_weights, "config.json")) as f:
        config = json.load(f)
    config.pop("gradscope", None)
    config_class = transformers.AutoConfig.for_model(config["model_type"])
    cfg = config_class.from_dict(config)
    cfg.initializer_range = wide_init(cfg.hidden_size)
    torch.manual_seed(1234)
    model = CLASSES[model_name](cfg)
    model.save_pretrained(out)


def run_case(gs, case, work):
    name, model_name, settings, _ = case
    # The published shapes load about a gigabyte per side and pass: sdpa only (each attention
    # path is compared at the presets; the published shape adds the published widths).
    published = name.endswith("-published")
    gs_weights = save_weights(gs, model_name, settings, os.path.join(work, name + "-gradscope"))
    hf_weights = os.path.join(work, name + "-transformers")
    hf_saved_weights(model_name, gs_weights, hf_weights)
    with open(os.path.join(gs_weights, "config.json")) as f:
        tokenizer = json.load(f)["gradscope"].get("tokenizer")
    # --init-from takes the architecture from the folder; the preset gives the rest (data,
    # tokenizer, sequence length), and --arch is the folder's already.
    shape = []
    skip = False
    for s in settings:
        if skip:
            skip = False
            continue
        if s == "--arch":
            skip = True
            continue
        shape.append(s)
    runs = [(source, weights, attention, "fp32")
            for source, weights in (("gradscope", gs_weights), ("transformers", hf_weights))
            for attention, _ in ATTENTION
            if attention == "sdpa" or not published]
    if name.endswith("-tiny"):  # bf16 once per model
        runs.append(("gradscope", gs_weights, "sdpa", "bf16"))
    failed = False
    for source, weights, attention, dtype in runs:
        out = os.path.join(work, f"{name}-{source}-{attention}-{dtype}.safetensors")
        # A folder transformers wrote has no tokenizer: the one gradscope's weights name.
        given = ["--tokenizer", tokenizer] if tokenizer and source == "transformers" else []
        gradscope(gs, ["outputs", "--model", model_name] + shape + given +
                  ["--init-from", weights, "--attention", attention, "--dtype", dtype,
                   "--out", out], f"{name}: gradscope outputs")
        own_fp32 = os.path.join(work, f"{name}-{source}-{attention}-fp32.safetensors")
        rows = compare(model_name, weights, attention, dtype, out, own_fp32)
        label = f"{name:<21} weights {source:<12} {attention}/{dict(ATTENTION)[attention]:<5} " \
                f"{dtype}"
        for what, r, tol in rows:
            ok = r <= tol
            failed |= not ok
            if what.startswith("grad.") and ok:
                continue
            print(f"  {label}  {what:<44} {r:.2e} (<= {tol:.1e}) {'ok' if ok else 'FAILED'}")
    return not failed


def main():
    return peer_main("hf_models_test", __doc__, CASES,
                     "write the weights and outputs here and keep them", run_case,
                     f"transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    sys.exit(main())
