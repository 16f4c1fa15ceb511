"""gradscope's LoRA adapters in PEFT: the adapters gradscope saves load into a transformers model
with peft.PeftModel.from_pretrained and give the outputs of the weights gradscope merged.

  peft_test.py GRADSCOPE [--only NAME[,NAME...]] [--list] [--keep DIR]

Each case is a model (llama: LlamaForCausalLM, modernbert: ModernBertForMaskedLM, vit:
ViTForImageClassification) at a preset. For each case:
  - BASE: `gradscope run ... --save-weights BASE`, one SGD step from the preset's
    initialisation;
  - two LoRA runs from BASE (every projection a model has: q, k, v, o, gate, up, down; rank 4,
    alpha 8; three Adam steps, so that B is no longer zero), the same but for what they save:
    one `--save-weights MERGED` (the adapters merged into the weights), one `--save-weights
    ADAPTERS --save-adapters` (the adapters alone, in PEFT's layout: docs/lora.md). The CPU is
    deterministic, so the two runs must record the same losses, bit for bit: the adapters
    file and the merged weights then come from the same training;
  - `gradscope outputs --init-from MERGED --attention math` (and from BASE): the first training
    batch, its logits and mean loss;
  - transformers (eval mode, attention "eager", the one that computes gradscope's math path):
    from_pretrained(BASE) wrapped by peft.PeftModel.from_pretrained(base, ADAPTERS) runs the
    batch, and its logits and loss must equal gradscope's from MERGED; so must PEFT's own merge
    (merge_and_unload) and from_pretrained(MERGED).
The test cannot pass on adapters that were dropped or loaded wrong:
  - every target module in adapter_config.json must name a module of the transformers model (a
    target that matches nothing is a failure, with the names the model has instead);
  - PEFT's warnings about missing or unexpected keys are failures, and the adapter state PEFT
    holds afterwards (get_peft_model_state_dict) must have exactly the file's tensors, bit for
    bit;
  - every adapted layer's rank must be its tensors' and its scale alpha / r of the config: a
    stacked adapter (ModernBERT's Wqkv: rank 3r, alpha 3 alpha) is read from rank_pattern and
    alpha_pattern, and a pattern PEFT ignored would give it rank r (a load error) or the scale
    alpha / 3r;
  - with the adapters off (`disable_adapter()`) the model must give gradscope's outputs from
    BASE, and turning them on must move the logits by at least EFFECT_FACTOR times the
    tolerance; so must the LoRA layers alone where a classifier trains beside them (ViT's
    modules_to_save: on its own it would move the outputs, the adapters dropped or not).

Tolerances (relative: ||a - b|| / ||b||, b gradscope's value; each tensor on its own):
  fp32: loss 1e-5, logits 1e-5. gradscope's merged weight is W + (alpha / r) B A rounded once to
    float32, where PEFT computes x W^T + (alpha / r) (x A^T) B^T: the weights differ by the
    merge's rounding (unit roundoff u = 2^-24, about 6e-8, relative on each entry) and the
    products by the order of their sums, at most about K u for a sum of K terms (K up to 768
    here, the small Llama's MLP width: 5e-5) and typically sqrt(K) u (2e-6). PEFT's
    merge_and_unload rounds the same merge in its own order, and from_pretrained(MERGED) runs
    gradscope's rounding through transformers' sums.
  The adapters' effect must be at least EFFECT_FACTOR (100) times the logits' tolerance: a
    difference of 1e-3 relative cannot be rounding, so adapters that were silently dropped
    would show up as a difference of that size from MERGED.
Every figure measured is printed, so a tolerance's margin can be read from the output.

The other direction: PEFT's own adapters (get_peft_model with a LoraConfig of the same
targets, rank and alpha on from_pretrained(BASE), every B and ViT's classifier drawn from a
seed, written with save_pretrained) read by `gradscope outputs --init-from BASE --init-adapters
DIR`: its logits and loss must equal PEFT's on the same batch, and PEFT's merge_and_unload()'s,
within the same tolerances, and differ from BASE's by at least EFFECT_FACTOR times them.
ModernBERT's Wqkv gets one PEFT adapter of rank r over q, k and v, which gradscope reads into
its three adapters sharing A.

Exit status: 0 every case within its tolerances, 1 a difference (every one is printed), 2 bad
input, 77 skipped (no peft, transformers or safetensors package, or the data gradscope trains
on is not fetched: $GRADSCOPE_DATA, default ~/.cache/gradscope).
"""
import json
import os
import re
import sys
import warnings

try:
    import torch
    import transformers
    import peft
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import load_file
    from peer_common import (CLASSES, GPT2, SOTU, Failure, gradscope, peer_main, relative,
                             save_weights)
    from peer_common import hf_forward as hf_forward_with_grad
except ImportError as e:
    print(f"peft_test: skipped: {e} (pip install -r requirements.txt)")
    sys.exit(77)


TOLERANCES = {"loss": 1e-5, "logits": 1e-5}
EFFECT_FACTOR = 100

# (name, model, gradscope settings, data it reads under $GRADSCOPE_DATA, and whether PEFT's own
# adapters are loaded into gradscope too: the second direction, peft_into_gradscope).
CASES = [
    ("llama-tiny", "llama", ["--preset", "tiny"], [SOTU], True),
    ("llama-small", "llama", ["--preset", "small", "--batch", "2"], [SOTU] + GPT2, True),
    ("modernbert-tiny", "modernbert", ["--preset", "tiny"], [SOTU], True),
    ("vit-tiny", "vit", ["--preset", "tiny"], [], True),  # synthetic images
]

COMMON = ["--warmup-steps", "0", "--eval-batches", "1", "--quiet", "--no-db",
          "--sample-period", "0"]
# Every projection a model has (docs/lora.md skips those it lacks: ViT's gate).
LORA = ["--lora-targets", "q,k,v,o,gate,up,down", "--lora-rank", "4", "--lora-alpha", "8",
        "--optimizer", "adam", "--steps", "3"]
# Warnings PEFT gives when the adapters file and the model do not match.
KEY_WARNING = re.compile(r"missing|unexpected|mismatch", re.IGNORECASE)


def hf_forward(model_name, model, outputs):
    """The transformers model on gradscope's batch, without gradients: its logits (float32, in
    the shape of gradscope's) and loss."""
    with torch.no_grad():
        logits, loss = hf_forward_with_grad(model_name, model, outputs)
    return {"logits": logits.float().reshape(outputs["logits"].shape), "loss": loss}


def record_losses(path):
    """The losses a run record holds: every step's training loss and the final validation
    loss."""
    with open(path) as f:
        record = json.load(f)
    losses = [s["loss"] for s in record["steps"]] + [record["final_val_loss"]]
    if len(losses) < 2 or any(not isinstance(x, float) for x in losses):
        raise Failure(f"{path}: no losses recorded: {losses}")
    return losses


def unmatched_targets(model, config):
    """The target modules of adapter_config.json that name no module of `model` (PEFT takes a
    target as the module's full name or a dotted suffix of it)."""
    names = [n for n, _ in model.named_modules()]
    targets = config["target_modules"]
    if isinstance(targets, str):  # a regular expression: PEFT's full match
        return [] if any(re.fullmatch(targets, n) for n in names) else [targets]
    return [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]


def linear_names(model, limit):
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    return names[:limit]


def load_adapters(model_name, base_dir, adapters_dir):
    """BASE in transformers with gradscope's adapters on it through PEFT, after checking that
    every adapter of the file was loaded as written; returns the PeftModel and a line of what
    it holds."""
    base = CLASSES[model_name].from_pretrained(base_dir, attn_implementation="eager",
                                               dtype=torch.float32)
    with open(os.path.join(adapters_dir, "adapter_config.json")) as f:
        config = json.load(f)
    unmatched = unmatched_targets(base, config)
    if unmatched:
        raise Failure(f"{len(unmatched)} of {len(config['target_modules'])} target modules name "
                      f"no module of transformers {transformers.__version__}'s "
                      f"{type(base).__name__}, e.g. {unmatched[:2]}; its linear layers are "
                      f"named {linear_names(base, 6)}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = peft.PeftModel.from_pretrained(base, adapters_dir)
        except Exception as e:  # PEFT's own errors: what does not load, and why
            raise Failure(f"PEFT does not load the adapters: {type(e).__name__}: {e}")
    for w in caught:
        if KEY_WARNING.search(str(w.message)):
            raise Failure(f"PEFT: {w.message}")
    model.eval()
    held = peft.get_peft_model_state_dict(model)
    written = load_file(os.path.join(adapters_dir, "adapter_model.safetensors"))
    if set(held) != set(written):
        raise Failure(f"PEFT holds {sorted(set(held) - set(written))[:4]} that the file does "
                      f"not have, the file {sorted(set(written) - set(held))[:4]} that PEFT "
                      f"did not load")
    changed = [k for k in written if not torch.equal(held[k], written[k])]
    if changed:
        raise Failure(f"PEFT holds other values than the file for {changed[:4]}")
    scale = config["lora_alpha"] / config["r"]
    ranks = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        r = layer.r["default"]
        key = f"{name}.lora_A.weight".replace(".base_layer", "")
        if key not in written or written[key].shape[0] != r:
            raise Failure(f"{name}: PEFT's rank {r}, the file has {key} "
                          f"{tuple(written[key].shape) if key in written else 'missing'}")
        if layer.scaling["default"] != scale:
            raise Failure(f"{name}: PEFT scales by {layer.scaling['default']}, "
                          f"gradscope by alpha / r = {scale}")
        ranks[r] = ranks.get(r, 0) + 1
    adapted = sum(ranks.values())
    held_line = (f"{len(written)} tensors loaded bit for bit, {adapted} layers adapted "
                 f"(rank: layers {dict(sorted(ranks.items()))}), scale {scale:g}")
    return model, held_line


def set_lora_layers(model, enabled):
    """Turns the LoRA layers on or off, leaving modules_to_save (ViT's classifier) trained."""
    for layer in model.modules():
        if isinstance(layer, LoraLayer):
            layer.enable_adapters(enabled)


def compare(model_name, base_dir, merged_dir, adapters_dir, merged_out, base_out):
    """Rows (what, relative difference, tolerance, passes) and the line of what PEFT holds."""
    merged = load_file(merged_out)
    base = load_file(base_out)
    for o in (merged, base):
        o["logits"] = o["logits"].float()
    model, held_line = load_adapters(model_name, base_dir, adapters_dir)
    rows = []

    def agree(label, got, want):
        for key in ("logits", "loss"):
            r = relative(got[key], want[key])
            rows.append((f"{label}: {key}", r, f"<= {TOLERANCES[key]:.1e}",
                         r <= TOLERANCES[key]))

    adapted = hf_forward(model_name, model, merged)
    agree("PEFT(BASE + adapters) vs gradscope(MERGED)", adapted, merged)
    with model.disable_adapter():
        off = hf_forward(model_name, model, merged)
    agree("PEFT, disable_adapter() vs gradscope(BASE)", off, base)
    least = EFFECT_FACTOR * TOLERANCES["logits"]
    effects = [("all adapters", off)]
    if model.peft_config["default"].modules_to_save:  # trained beside the adapters
        set_lora_layers(model, False)
        effects.append(("LoRA layers alone", hf_forward(model_name, model, merged)))
        set_lora_layers(model, True)
    for label, without in effects:
        r = relative(adapted["logits"], without["logits"])
        loss = relative(adapted["loss"], without["loss"])
        rows.append((f"effect of {label}: logits (loss {loss:.2e})", r, f">= {least:.1e}",
                     r >= least))
    agree("PEFT merge_and_unload() vs gradscope(MERGED)",
          hf_forward(model_name, model.merge_and_unload(), merged), merged)
    plain = CLASSES[model_name].from_pretrained(merged_dir, attn_implementation="eager",
                                                dtype=torch.float32)
    plain.eval()
    agree("transformers(MERGED) vs gradscope(MERGED)", hf_forward(model_name, plain, merged),
          merged)
    return rows, held_line


# PEFT's target modules for the projections LORA names, as PEFT users write them (suffixes of
# the module names transformers builds), and the heads that train beside the adapters.
PEFT_TARGETS = {
    "llama": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
              None),
    "modernbert": (["Wqkv", "attn.Wo", "Wi", "mlp.Wo"], None),
    "vit": (["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"], ["classifier"]),
}


def peft_into_gradscope(gs, name, model_name, settings, work):
    """PEFT's own adapters loaded into gradscope: get_peft_model on from_pretrained(BASE) with a
    LoraConfig of LORA's targets, rank and alpha, every B (and a head that trains beside the
    adapters) drawn from a seed so that they change the outputs, written with save_pretrained;
    gradscope reads them with --init-from BASE --init-adapters, and its outputs must equal
    PEFT's, and PEFT's merge_and_unload()'s, on gradscope's batch. Returns rows as compare()."""
    base_dir = os.path.join(work, f"{name}-base")
    peft_dir = os.path.join(work, f"{name}-peft-adapters")
    out = os.path.join(work, f"{name}-peft.safetensors")
    base_out = os.path.join(work, f"{name}-base.safetensors")
    targets, heads = PEFT_TARGETS[model_name]
    rank, alpha = LORA[LORA.index("--lora-rank") + 1], LORA[LORA.index("--lora-alpha") + 1]
    base = CLASSES[model_name].from_pretrained(base_dir, attn_implementation="eager",
                                               dtype=torch.float32)
    config = peft.LoraConfig(r=int(rank), lora_alpha=float(alpha), lora_dropout=0.0,
                             target_modules=targets, modules_to_save=heads)
    model = peft.get_peft_model(base, config)
    torch.manual_seed(4321)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_B" in pname:
                p.normal_(0.0, 0.05)
            elif "modules_to_save" in pname:
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(peft_dir)
    gradscope(gs, ["outputs", "--model", model_name] + settings + LORA[:6] +
              ["--init-from", base_dir, "--init-adapters", peft_dir, "--attention", "math",
               "--out", out], f"{name}: gradscope reads PEFT's adapters")
    got = load_file(out)
    got["logits"] = got["logits"].float()
    model.eval()
    rows = []
    for label, hf in (("PEFT's adapters in gradscope vs PEFT", hf_forward(model_name, model, got)),
                      ("PEFT's adapters in gradscope vs PEFT merge_and_unload()",
                       hf_forward(model_name, model.merge_and_unload(), got))):
        for key in ("logits", "loss"):
            r = relative(got[key], hf[key])
            rows.append((f"{label}: {key}", r, f"<= {TOLERANCES[key]:.1e}",
                         r <= TOLERANCES[key]))
    least = EFFECT_FACTOR * TOLERANCES["logits"]
    r = relative(got["logits"], load_file(base_out)["logits"].float())
    rows.append(("effect of PEFT's adapters in gradscope: logits", r, f">= {least:.1e}",
                 r >= least))
    return rows


def run_case(gs, case, work):
    name, model_name, settings, _, into_gradscope = case

    def path(what):
        return os.path.join(work, f"{name}-{what}")

    save_weights(gs, model_name, settings, path("base"))
    for what, extra in (("merged", []), ("adapters", ["--save-adapters"])):
        gradscope(gs, ["run", "--model", model_name] + settings + LORA + COMMON +
                  ["--init-from", path("base"), "--json", path(what + ".json"),
                   "--save-weights", path(what)] + extra,
                  f"{name}: gradscope trains LoRA adapters and saves them {what}")
    merged_losses = record_losses(path("merged.json"))
    adapter_losses = record_losses(path("adapters.json"))
    same = merged_losses == adapter_losses
    print(f"  {name:<16} losses of the run saving MERGED   "
          f"{' '.join(f'{x:.8f}' for x in merged_losses)}")
    print(f"  {name:<16} losses of the run saving ADAPTERS "
          f"{' '.join(f'{x:.8f}' for x in adapter_losses)} "
          f"{'(equal) ok' if same else 'FAILED: the runs differ'}")
    if not same:
        raise Failure("the two LoRA runs trained differently: MERGED and ADAPTERS do not match")
    for what in ("merged", "base"):
        gradscope(gs, ["outputs", "--model", model_name] + settings +
                  ["--init-from", path(what), "--attention", "math",
                   "--out", path(what + ".safetensors")], f"{name}: gradscope outputs")
    rows, held_line = compare(model_name, path("base"), path("merged"), path("adapters"),
                              path("merged.safetensors"), path("base.safetensors"))
    print(f"  {name:<16} PEFT {peft.__version__}: {held_line}")
    failed = False
    for what, r, bound, ok in rows:
        failed |= not ok
        print(f"  {name:<16} {what:<54} {r:.2e} ({bound}) {'ok' if ok else 'FAILED'}")
    if into_gradscope:
        for what, r, bound, ok in peft_into_gradscope(gs, name, model_name, settings, work):
            failed |= not ok
            print(f"  {name:<16} {what:<54} {r:.2e} ({bound}) {'ok' if ok else 'FAILED'}")
    return not failed


def main():
    return peer_main("peft_test", __doc__, CASES,
                     "write the weights, adapters and outputs here and keep them", run_case,
                     f"peft {peft.__version__}, transformers {transformers.__version__}, "
                     f"torch {torch.__version__}")


if __name__ == "__main__":
    sys.exit(main())
