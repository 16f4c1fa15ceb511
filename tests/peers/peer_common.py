"""What the peer tests share: running gradscope, the relative difference they report, and a
transformers model run on the batch `gradscope outputs` wrote (in the layout gradscope writes
its logits). Imported by the scripts beside it, which run it with the same Python."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

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


def save_weights(gs, model_name, settings, folder):
    """gradscope's weights of `model_name` after one SGD step from the preset's initialisation
    (`run --save-weights folder`; its record beside, folder + ".json"): weights that are no
    special point of the initialisation. Returns the folder."""
    gradscope(gs, ["run", "--model", model_name] + settings +
              ["--optimizer", "sgd", "--steps", "1", "--warmup-steps", "0", "--eval-batches", "1",
               "--quiet", "--no-db", "--sample-period", "0", "--json", folder + ".json",
               "--save-weights", folder],
              f"gradscope writes its weights to {folder}")
    return folder


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


# Data the cases read under $GRADSCOPE_DATA (scripts/fetch-data.sh).
SOTU = "text/sotu"
GPT2 = ["tokenizers/gpt2/encoder.json", "tokenizers/gpt2/vocab.bpe"]
LLAMA3 = ["tokenizers/llama3/tokenizer.json"]
EMOJI = "emoji/emoji.json"


def data_dir():
    return os.environ.get("GRADSCOPE_DATA") or os.path.expanduser("~/.cache/gradscope")


def command_line(prog, doc, cases, keep_help):
    """The peer tests' command line: GRADSCOPE [--only NAMES] [--list] [--keep DIR]. `cases`
    are tuples (name, model, gradscope settings, data paths, ...). Returns the arguments and the
    cases asked for; exits 0 after --list, BAD_INPUT for an unknown case or a gradscope that is
    not an executable file, and SKIP when a case's data is not fetched."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("gradscope", help="the gradscope executable")
    ap.add_argument("--only", help="comma-separated case names (--list shows them)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", help=keep_help)
    a = ap.parse_args()
    if a.list:
        for case in cases:
            print(f"{case[0]:<22} {case[1]:<11} {' '.join(case[2])}")
        sys.exit(0)
    selected = cases
    if a.only:
        wanted = a.only.split(",")
        unknown = sorted(set(wanted) - {c[0] for c in cases})
        if unknown:
            print(f"{prog}: --only: no case {unknown} (--list shows them)", file=sys.stderr)
            sys.exit(BAD_INPUT)
        selected = [c for c in cases if c[0] in wanted]
    if not (os.path.isfile(a.gradscope) and os.access(a.gradscope, os.X_OK)):
        print(f"{prog}: {a.gradscope} is not an executable file", file=sys.stderr)
        sys.exit(BAD_INPUT)
    data = data_dir()
    missing = sorted({os.path.join(data, p) for c in selected for p in c[3]
                      if not os.path.exists(os.path.join(data, p))})
    if missing:
        print(f"{prog}: skipped: missing data: {', '.join(missing)} (run "
              f"make data; data is in $GRADSCOPE_DATA, "
              f"default ~/.cache/gradscope)")
        sys.exit(SKIP)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    return a, selected


def peer_main(prog, doc, cases, keep_help, run_case, versions):
    """A peer test's whole run: its command line (command_line), then run_case(gradscope,
    case, work) for each case asked for, in a work folder (--keep, else a temporary one removed
    at the end), a Failure failing that case only; each case's verdict and time, then the
    test's with `versions`. Returns the exit status."""
    a, selected = command_line(prog, doc, cases, keep_help)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    work = a.keep or tempfile.mkdtemp(prefix=f"gradscope-{prog}-")
    os.makedirs(work, exist_ok=True)
    started = time.time()
    ok = True
    try:
        for case in selected:
            case_started = time.time()
            try:
                passed = run_case(a.gradscope, case, work)
            except Failure as e:
                print(f"{case[0]}: FAILED: {e}")
                passed = False
            print(f"{case[0]}: {'ok' if passed else 'FAILED'} in "
                  f"{time.time() - case_started:.1f} s")
            ok &= passed
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{prog}: {'every case agrees' if ok else 'differences above'} "
          f"({len(selected)} cases, {versions}, {time.time() - started:.0f} s)")
    return 0 if ok else MISMATCH
