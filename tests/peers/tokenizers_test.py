"""gradscope's byte-level BPE tokenizers against Hugging Face `tokenizers`: identical ids, line
for line, on every text corpus scripts/fetch-data.sh fetches (each State of the Union address
and Moby-Dick, whole) and on a handful of hard strings (emoji, CJK, digit and whitespace runs,
contractions, mixed scripts).

  tokenizers_test.py GRADSCOPE [--self-test]

For each tokenizer (llama3 from tokenizer.json; gpt2 from encoder.json + vocab.bpe):
  1. `GRADSCOPE tokenize --tokenizer NAME FILE` prints the ids of each line of FILE; Hugging
     Face encodes the same lines with add_special_tokens=False. The ids must be identical.
  2. `GRADSCOPE tokenize --tokenizer NAME --decode` turns those ids back into text: every line
     must come back byte for byte, as Hugging Face's decode of the same ids gives it back.

A line is what std::getline reads: the bytes between two '\\n' (a '\\r' stays in the line),
with no extra empty line after a final '\\n'. All lines of all corpora go through one file, so
each tokenizer costs two gradscope processes in all.

--self-test: checks that the tokenizers as fetched agree, then hands Hugging Face a deliberately
altered copy of each tokenizer (the merges that make one token of the first corpus line
removed) and exits 0 only when the comparison catches the alteration for both tokenizers; it
shows what a failure looks like.

Data: $GRADSCOPE_DATA, default ~/.cache/gradscope (scripts/fetch-data.sh tokenizers text).
Exit status: 0 identical, 1 a difference (the first one is printed), 2 bad input, 77 skipped
(no `tokenizers` package or no data).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
except ImportError:
    print("tokenizers_test: skipped: the Python package `tokenizers` is not installed "
          "(pip install -r requirements.txt)")
    sys.exit(77)

SKIP, BAD_INPUT, MISMATCH = 77, 2, 1
# Ids shown either side of the first differing id, and characters either side of a difference.
ID_WINDOW = 6
TEXT_WINDOW = 60

# Strings the corpora may not exercise. One line each: no '\n' inside. None holds the text of
# one of Llama 3's added tokens ("<|begin_of_text|>" and the like): Hugging Face turns that
# text into the special token, while gradscope encodes all text as plain text on purpose, so
# a document cannot inject a boundary (data/bpe.h). "<|endoftext|>" is no added token of
# either reference here (GPT-2's is built from encoder.json and vocab.bpe alone), so it stays.
HARD_STRINGS = [
    "",
    "don't DON'T I'LL we're They'VE she'd it's o'clock rock'n'roll '' 's",
    "1234567890123456789012345678901234567890 3.14159 1,000,000 -42 +7e-10 0x1F 2024-12-31",
    "spaces:     five, tabs:\t\t\ttwo, then trailing   ",
    "      leading spaces and a vertical tab\x0b and form feed\x0c here",
    "    ",
    "a\rcarriage return inside and one at the end\r",
    "naïve café Zürich façade coöperate résumé Ångström",
    "e\u0301 combining accent, n\u0303, Hangul jamo \u1100\u1161\u11a8",
    "日本語のテキストと中文文本。한국어 문장도 있습니다。",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🏳️‍🌈 😀😀😀",
    "Ελληνικά Русский العربية עברית हिन्दी ไทย mixed中文English123日本",
    "no\u00a0break\u00a0spaces, ideographic\u3000space, zero\u200bwidth, line\u2028separator",
    "a" * 300 + " " + "xyz" * 120,
    "9" * 100 + " " + " " * 100 + "!" * 50,
    "<|endoftext|> looks special but is text; so is </s>",
    "\x00NUL\x01SOH\x7fDEL \U0010fffd private use \ufeffBOM",
    "Mixed-case CamelCaseWords, snake_case_words, and kebab-case-words... ?!?! ---- ****",
    "URLs: https://example.com/a?b=c&d=e#f, email: first.last+tag@example.org",
]


class Fail(Exception):
    """A difference between gradscope and Hugging Face, with its report."""


class BadInput(Exception):
    """Input the test cannot use (a corpus line that is not UTF-8, a bad executable)."""


def skip(message):
    print(f"tokenizers_test: skipped: {message}")
    sys.exit(SKIP)


# ---------------------------------------------------------------------------------------
# Data


def data_dir():
    return os.environ.get("GRADSCOPE_DATA") or os.path.expanduser("~/.cache/gradscope")


def data_paths(data):
    """The tokenizer files and corpora; skips (77) when any is missing."""
    paths = {
        "llama3": os.path.join(data, "tokenizers", "llama3", "tokenizer.json"),
        "gpt2-encoder": os.path.join(data, "tokenizers", "gpt2", "encoder.json"),
        "gpt2-merges": os.path.join(data, "tokenizers", "gpt2", "vocab.bpe"),
        "moby-dick": os.path.join(data, "text", "moby-dick", "data.txt"),
    }
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    sotu = sorted(glob.glob(os.path.join(glob.escape(data), "text", "sotu", "*.txt")))
    if not sotu:
        missing.append(os.path.join(data, "text", "sotu", "*.txt"))
    if missing:
        skip("missing data: " + ", ".join(missing) +
             " (run scripts/fetch-data.sh tokenizers text; data is in $GRADSCOPE_DATA, "
             "default ~/.cache/gradscope)")
    paths["sotu"] = sotu
    return paths


def getline_split(raw):
    """The lines std::getline reads from `raw`: split at '\\n', no line after a final one."""
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


class Corpus:
    """The lines of one corpus as bytes and as text, each with where it came from."""

    def __init__(self, name):
        self.name = name
        self.raw = []
        self.text = []
        self.where = []

    def add_file(self, path, label):
        with open(path, "rb") as f:
            raw = f.read()
        for number, line in enumerate(getline_split(raw), 1):
            self.add_line(line, f"{label} line {number}")

    def add_line(self, raw, where):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(f"{where} is not UTF-8 ({e}); both tokenizers need UTF-8 text")
        self.raw.append(raw)
        self.text.append(text)
        self.where.append(where)


def load_corpora(paths):
    sotu = Corpus("sotu")
    for path in paths["sotu"]:
        sotu.add_file(path, "text/sotu/" + os.path.basename(path))
    moby = Corpus("moby-dick")
    moby.add_file(paths["moby-dick"], "text/moby-dick/data.txt")
    hard = Corpus("hard-strings")
    for number, line in enumerate(HARD_STRINGS, 1):
        assert "\n" not in line, "a hard string is one line"
        hard.add_line(line.encode("utf-8"), f"hard string {number}")
    return [sotu, moby, hard]


# ---------------------------------------------------------------------------------------
# Hugging Face tokenizers (the reference), and their altered copies for --self-test


def read_gpt2_merges(path):
    """vocab.bpe's merges as (left, right) pairs, read as GPT-2 and gradscope read it: one
    pair a line, an optional '#version' first line, empty lines and a trailing '\\r' ignored."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path} is not UTF-8 ({e})")
    merges = []
    for number, line in enumerate(lines, 1):
        line = line[:-1] if line.endswith("\r") else line
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise BadInput(f"{path} line {number} {line!r} is not two tokens and a space")
        merges.append((parts[0], parts[1]))
    return merges


def gpt2_reference(encoder_path, merges):
    """GPT-2 as it is defined: byte-level BPE over the GPT-2 regex, no prefix space."""
    with open(encoder_path, encoding="utf-8") as f:
        vocab = json.load(f)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def merge_text(merge):
    """A tokenizer.json merge, "a b" or ["a", "b"], as the token it makes."""
    return "".join(merge.split(" ") if isinstance(merge, str) else merge)


def token_to_break(tok, line):
    """A token that `tok` makes inside a pre-tokenizer piece of `line` that takes several
    tokens: such a piece is encoded by merges (never looked up whole), so without the merges
    that make the token, its encoding changes."""
    for _, (begin, end) in tok.pre_tokenizer.pre_tokenize_str(line):
        ids = tok.encode(line[begin:end], add_special_tokens=False).ids
        if len(ids) >= 2:
            return max((tok.id_to_token(i) for i in ids), key=len)
    raise BadInput(f"no piece of {line[:80]!r} takes two tokens: nothing to alter")


def altered_references(paths, first_line, tmp):
    """Copies of both references, each without the merges that make one token of
    `first_line`; returns {name: (tokenizer, what was removed)}."""
    llama = loaded(Tokenizer.from_file, paths["llama3"])
    target = token_to_break(llama, first_line)
    with open(paths["llama3"], encoding="utf-8") as f:
        spec = json.load(f)
    merges = spec["model"]["merges"]
    spec["model"]["merges"] = [m for m in merges if merge_text(m) != target]
    removed = len(merges) - len(spec["model"]["merges"])
    altered_path = os.path.join(tmp, "llama3-altered.json")
    with open(altered_path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    out = {"llama3": (Tokenizer.from_file(altered_path),
                      f"{removed} merge(s) making {target!r} removed")}

    merges = read_gpt2_merges(paths["gpt2-merges"])
    gpt2 = loaded(gpt2_reference, paths["gpt2-encoder"], merges)
    target = token_to_break(gpt2, first_line)
    kept = [m for m in merges if m[0] + m[1] != target]
    out["gpt2"] = (gpt2_reference(paths["gpt2-encoder"], kept),
                   f"{len(merges) - len(kept)} merge(s) making {target!r} removed")
    return out


def references(paths):
    return {
        "llama3": (loaded(Tokenizer.from_file, paths["llama3"]), "tokenizer.json as fetched"),
        "gpt2": (loaded(gpt2_reference, paths["gpt2-encoder"],
                        read_gpt2_merges(paths["gpt2-merges"])),
                 "encoder.json + vocab.bpe as fetched"),
    }


def loaded(load, path, *args):
    """load(path, *args), a file Hugging Face cannot load reported as bad input naming it."""
    try:
        return load(path, *args)
    except Exception as e:  # tokenizers raises a plain Exception for a file it cannot read
        raise BadInput(f"Hugging Face tokenizers cannot load {path}: {e}")


def hf_encode(tok, lines):
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    return [e.ids for e in encode(lines, add_special_tokens=False)]


# ---------------------------------------------------------------------------------------
# gradscope


def run_gradscope(gradscope, args, input_path, output_path):
    """Runs `gradscope tokenize ARGS INPUT` into output_path; returns its output's lines."""
    with open(output_path, "wb") as out:
        proc = subprocess.run([gradscope, "tokenize", *args, input_path], stdout=out,
                              stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise Fail(f"`{gradscope} tokenize {' '.join(args)} {input_path}` exited "
                   f"{proc.returncode}:\n{proc.stderr.decode('utf-8', 'replace')}")
    with open(output_path, "rb") as f:
        return getline_split(f.read())


def parse_ids(lines, name):
    try:
        return [[int(word) for word in line.split()] for line in lines]
    except ValueError as e:
        raise Fail(f"gradscope tokenize --tokenizer {name} printed a non-integer id: {e}")


# ---------------------------------------------------------------------------------------
# Comparison and its report


def show_ids(tok, ids, at):
    """ids[at - ID_WINDOW : at + ID_WINDOW + 1] with their tokens, the one at `at` marked."""
    begin = max(0, at - ID_WINDOW)
    shown = []
    for i in range(begin, min(len(ids), at + ID_WINDOW + 1)):
        token = tok.id_to_token(ids[i])
        shown.append(("> " if i == at else "") + f"{ids[i]}:{token!r}")
    more = "... " if begin > 0 else ""
    tail = " ..." if at + ID_WINDOW + 1 < len(ids) else ""
    return f"[{len(ids)} ids] {more}{', '.join(shown)}{tail}"


def excerpt(text, at):
    begin = max(0, at - TEXT_WINDOW)
    return (("..." if begin > 0 else "") + repr(text[begin:at + TEXT_WINDOW]) +
            ("..." if at + TEXT_WINDOW < len(text) else ""))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_ids(name, tok, corpus, offset, ours, theirs):
    """Raises Fail at the first line whose ids differ; returns the number of ids compared."""
    count = 0
    for i, text in enumerate(corpus.text):
        a, b = ours[offset + i], theirs[offset + i]
        if a != b:
            at = first_difference(a, b)
            char = len(tok.decode(b[:at], skip_special_tokens=False))
            raise Fail(
                f"{name}: the ids of {corpus.where[i]} ({corpus.name}) differ at id {at} "
                f"(character {char} of {len(text)}):\n"
                f"  text around it: {excerpt(text, char)}\n"
                f"  gradscope:      {show_ids(tok, a, at)}\n"
                f"  Hugging Face:   {show_ids(tok, b, at)}")
        count += len(a)
    return count


def compare_decoded(name, corpus, offset, ours, theirs):
    """Raises Fail at the first line that gradscope's or Hugging Face's decode does not give
    back as it was."""
    for i, raw in enumerate(corpus.raw):
        for who, got in (("gradscope", ours[offset + i]),
                         ("Hugging Face", theirs[offset + i].encode("utf-8"))):
            if got != raw:
                at = first_difference(got, raw)
                raise Fail(
                    f"{name}: {who}'s decode does not give back {corpus.where[i]} "
                    f"({corpus.name}); the bytes differ at byte {at} of {len(raw)}:\n"
                    f"  line:    {excerpt(raw, at)}\n"
                    f"  decoded: {excerpt(got, at)}")


def check_tokenizer(gradscope, name, tok, corpora, tmp, input_path):
    """Encodes and decodes every line with gradscope and with `tok`; raises Fail at the first
    difference; returns one summary row per corpus and the times taken."""
    lines = [t for c in corpora for t in c.text]
    start = time.perf_counter()
    ids_path = os.path.join(tmp, f"{name}.ids")
    ours = parse_ids(run_gradscope(gradscope, ["--tokenizer", name], input_path, ids_path), name)
    ours_encode = time.perf_counter() - start
    start = time.perf_counter()
    theirs = hf_encode(tok, lines)
    theirs_encode = time.perf_counter() - start
    if len(ours) != len(lines):
        raise Fail(f"{name}: gradscope printed {len(ours)} lines of ids for {len(lines)} "
                   "input lines")
    rows, offset = [], 0
    for corpus in corpora:
        rows.append([corpus.name, len(corpus.text),
                     compare_ids(name, tok, corpus, offset, ours, theirs)])
        offset += len(corpus.text)

    start = time.perf_counter()
    decoded_path = os.path.join(tmp, f"{name}.decoded")
    ours_text = run_gradscope(gradscope, ["--tokenizer", name, "--decode"], ids_path,
                              decoded_path)
    ours_decode = time.perf_counter() - start
    start = time.perf_counter()
    theirs_text = tok.decode_batch(theirs, skip_special_tokens=False)
    theirs_decode = time.perf_counter() - start
    if len(ours_text) != len(lines):
        raise Fail(f"{name}: gradscope --decode printed {len(ours_text)} lines for "
                   f"{len(lines)} lines of ids")
    offset = 0
    for corpus in corpora:
        compare_decoded(name, corpus, offset, ours_text, theirs_text)
        offset += len(corpus.text)
    return rows, (ours_encode, theirs_encode, ours_decode, theirs_decode)


def write_input(corpora, path):
    """All lines of all corpora, one a line, in one file for gradscope."""
    with open(path, "wb") as f:
        for corpus in corpora:
            for raw in corpus.raw:
                f.write(raw + b"\n")


def print_summary(results, elapsed):
    print(f"{'tokenizer':<9} {'corpus':<13} {'lines':>7} {'tokens':>10}")
    for name, (rows, _) in results.items():
        for corpus, lines, tokens in rows:
            print(f"{name:<9} {corpus:<13} {lines:>7} {tokens:>10}")
    print("seconds: encode gradscope / Hugging Face, decode gradscope / Hugging Face")
    for name, (_, times) in results.items():
        print(f"  {name:<9} " + " / ".join(f"{t:.2f}" for t in times))
    print(f"identical ids and decoded text for every line ({tokenizers.__name__} "
          f"{tokenizers.__version__}); {elapsed:.1f} s in all")


# ---------------------------------------------------------------------------------------
# Main


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Compare gradscope's tokenizers with Hugging Face tokenizers.")
    p.add_argument("gradscope", help="the gradscope executable")
    p.add_argument("--self-test", action="store_true",
                   help="feed Hugging Face altered tokenizers; pass only if both are caught")
    args = p.parse_args(argv)
    if not (os.path.isfile(args.gradscope) and os.access(args.gradscope, os.X_OK)):
        raise BadInput(f"GRADSCOPE {args.gradscope!r} is not an executable file")
    return args


def run_all(gradscope, refs, corpora, tmp):
    """check_tokenizer for each reference; {name: result}, or raises Fail."""
    input_path = os.path.join(tmp, "lines.txt")
    write_input(corpora, input_path)
    results = {}
    for name, (tok, _) in refs.items():
        results[name] = check_tokenizer(gradscope, name, tok, corpora, tmp, input_path)
    return results


def self_test(gradscope, paths, corpora, tmp):
    """The references as fetched must pass, and then each altered reference on its own must
    make the comparison fail: a failure that is there anyway would prove nothing."""
    try:
        run_all(gradscope, references(paths), corpora, tmp)
    except Fail as e:
        print(f"self-test: FAILED: the tokenizers as fetched already differ:\nFAIL {e}")
        return MISMATCH
    print("self-test: the tokenizers as fetched give identical ids")
    first_line = corpora[0].text[0]
    caught = 0
    for name, (tok, what) in altered_references(paths, first_line, tmp).items():
        print(f"self-test: {name}: Hugging Face given an altered tokenizer ({what})")
        try:
            run_all(gradscope, {name: (tok, what)}, corpora, tmp)
            print(f"self-test: FAILED: {name}: the altered tokenizer was not caught")
        except Fail as e:
            print(f"self-test: caught, as it should be; the test reports:\nFAIL {e}\n")
            caught += 1
    if caught != 2:
        print(f"self-test: FAILED: {caught} of 2 altered tokenizers caught")
        return MISMATCH
    print("self-test: passed: both altered tokenizers caught")
    return 0


def main(argv):
    start = time.perf_counter()
    try:
        args = parse_args(argv)
        paths = data_paths(data_dir())
        corpora = load_corpora(paths)
        with tempfile.TemporaryDirectory(prefix="gradscope-tokenizers-") as tmp:
            if args.self_test:
                return self_test(args.gradscope, paths, corpora, tmp)
            results = run_all(args.gradscope, references(paths), corpora, tmp)
    except BadInput as e:
        print(f"tokenizers_test: error: {e}", file=sys.stderr)
        return BAD_INPUT
    except Fail as e:
        print(f"FAIL {e}")
        return MISMATCH
    print_summary(results, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
