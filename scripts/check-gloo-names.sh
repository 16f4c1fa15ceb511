#!/usr/bin/env bash
# Checks that a gradscope binary defines nothing of Gloo's classes: src/gloo_names stands in
# for Gloo's headers with declarations only, and must never lead the compiler to emit a Gloo
# class's member function, vtable or type information (nor c10d's GlooStore, whose base is one
# of them). Template code over smart pointers to Gloo's types (std::vector<std::shared_ptr<...>>)
# is layout-independent and allowed.
#   scripts/check-gloo-names.sh BINARY
set -euo pipefail
bin=${1:?usage: check-gloo-names.sh BINARY}
[ -f "$bin" ] || { echo "check-gloo-names: no file $bin" >&2; exit 2; }
symbols=$(nm -C --defined-only "$bin") || { echo "check-gloo-names: nm cannot read $bin" >&2; exit 2; }
[ -n "$symbols" ] || { echo "check-gloo-names: $bin has no symbols (stripped?)" >&2; exit 2; }
found=$(echo "$symbols" | cut -d' ' -f3- |
  grep -E '^((non-virtual |virtual )?thunk to |guard variable for )?(gloo::|(vtable|typeinfo|typeinfo name|VTT|construction vtable) for [^ ]*gloo::)|GlooStore' || true)
if [ -n "$found" ]; then
  echo "check-gloo-names: $bin defines Gloo's own code, which the stand-in names must never produce:" >&2
  echo "$found" | head -20 >&2
  exit 1
fi
echo "check-gloo-names: $bin defines nothing of Gloo's classes"
