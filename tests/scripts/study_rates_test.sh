#!/usr/bin/env bash
# scripts/study-rates.sh on small databases made here: it picks the lowest final validation
# loss among the ok runs of each model, optimizer and step (the latest attempt of a run, a
# diverged run never), flags a pick at the edge of the rates tried, writes the overrides and
# the accumulation step's own sweep only where its pick differs, and refuses a bad name or rate
# (exit 2) and a step without an ok run (exit 1), naming them. With a gradscope binary, the
# files it writes are sweep files gradscope reads, with the runs intended.
#   tests/scripts/study_rates_test.sh REPO [GRADSCOPE]
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: tests/scripts/study_rates_test.sh REPO [GRADSCOPE]" >&2
  exit 2
fi
repo=$1
gs=${2:-}
pick=$repo/scripts/study-rates.sh
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# A database with the columns the pick reads.
new_db() {
  rm -f -- "$tmp/rates.db"
  sqlite3 "$tmp/rates.db" \
    "CREATE TABLE runs(attempt_id INTEGER PRIMARY KEY, run_id TEXT, started_at TEXT,
       record_json TEXT)"
}
# add ID MODEL OPTIMIZER STRATEGY LR STATUS VAL [STARTED]: one attempt. LR and VAL are JSON
# (a number, a string, null).
add() {
  local accum=1
  [[ $4 == accumulation ]] && accum=4
  local json
  json=$(printf '{"config":{"model":%s,"optimizer":"%s","strategy":"%s","lr":%s,"steps":400,
    "seed":100,"batch":8,"accum_steps":%s},"status":"%s","final_val_loss":%s}' \
    "$2" "$3" "$4" "$5" "$accum" "$6" "$7")
  local q="'" qq="''"
  sqlite3 "$tmp/rates.db" "INSERT INTO runs(run_id, started_at, record_json) VALUES
    ('${1//$q/$qq}', '${8:-2026-01-01T00:00:00Z}', '${json//$q/$qq}')"
}
# run_pick: the script on the database into $tmp/out; its exit status in $code, its messages
# in $tmp/err.
run_pick() {
  code=0
  bash "$pick" "$tmp/rates.db" "$tmp/out" > "$tmp/msg" 2> "$tmp/err" || code=$?
}
expect_refused() {  # expect_refused CODE TEXT WHAT
  run_pick
  [[ $code -eq $1 ]] || fail "$3: exit $code, expected $1 ($(cat "$tmp/err"))"
  grep -qF -- "$2" "$tmp/err" || fail "$3: '$2' not in: $(cat "$tmp/err")"
}
row() { grep -F "| $1 | $2 | $3 | $4 |" "$tmp/out/rates.md" || true; }
# has TEXT PART: whether TEXT holds PART (lines included) as it is.
has() { [[ $1 == *"$2"* ]]; }

# --- a grid with every case ---
new_db
# Llama, Adam, standard: 3.16e-4 is the lowest ok loss; 3.16e-3 diverged with a lower one on
# record; 1e-4 has a later interrupted attempt, which does not replace its ok one; 1e-3 was
# run again and its later attempt counts.
add 00000000000000a1 '"llama"' adam standard 1e-4 ok 3.0
add 00000000000000a1 '"llama"' adam standard 1e-4 interrupted 0.1 2026-01-02T00:00:00Z
add 00000000000000a2 '"llama"' adam standard 3.16e-4 ok 2.5
add 00000000000000a3 '"llama"' adam standard 1e-3 ok 0.2
add 00000000000000a3 '"llama"' adam standard 1e-3 ok 2.75 2026-01-02T00:00:00Z
add 00000000000000a4 '"llama"' adam standard 3.16e-3 diverged 0.05
# Llama, Adam, accumulation: the highest rate wins, another rate than the standard step's.
add 00000000000000b1 '"llama"' adam accumulation 1e-4 ok 2.0
add 00000000000000b2 '"llama"' adam accumulation 3.16e-4 ok 1.5
add 00000000000000b3 '"llama"' adam accumulation 1e-3 ok 1.25
# ViT, Adam: the lowest rate wins, for both steps (so no sweep of its own).
add 00000000000000c1 '"vit"' adam standard 1e-3 ok 1.0
add 00000000000000c2 '"vit"' adam standard 3.16e-3 ok 1.1
add 00000000000000d1 '"vit"' adam accumulation 1e-3 ok 0.9
add 00000000000000d2 '"vit"' adam accumulation 3.16e-3 failed null
# NanoVLM, Adam: the accumulation step's own pick differs; study-cpu.toml runs it at 8 seeds.
add 00000000000000f1 '"nanovlm"' adam standard 1e-3 ok 1.0
add 00000000000000f2 '"nanovlm"' adam accumulation 1e-3 ok 2.0
add 00000000000000f3 '"nanovlm"' adam accumulation 3.16e-3 ok 1.0
run_pick
[[ $code -eq 0 ]] || fail "the grid: exit $code ($(cat "$tmp/err"))"
toml=$(cat "$tmp/out/rates.toml" 2>/dev/null || true)
has "$toml" 'when = { model = "llama", optimizer = "adam" }
[override.set]
lr = 0.000316
lr_chosen_by = "lowest final validation loss of 4 rates x 400 steps at seed 100, standard step"' \
  || fail "rates.toml lacks Llama's pick 0.000316: $toml"
has "$toml" 'when = { model = "vit", optimizer = "adam" }
[override.set]
lr = 0.001
lr_chosen_by = "lowest final validation loss of 2 rates x 400 steps at seed 100, standard step"' \
  || fail "rates.toml lacks ViT's pick 0.001: $toml"
[[ $(grep -c '^\[\[override\]\]$' <<< "$toml") -eq 3 ]] || fail "rates.toml: not 3 overrides"
[[ $(row llama adam "standard, batch 8" 0.000316) == *"| 2.5000 | **picked** |"* ]] ||
  fail "rates.md does not mark 0.000316 picked: $(row llama adam "standard, batch 8" 0.000316)"
[[ $(row llama adam "standard, batch 8" 0.00316) == *"| diverged |  |"* ]] ||
  fail "rates.md: the diverged run: $(row llama adam "standard, batch 8" 0.00316)"
[[ $(row llama adam "standard, batch 8" 0.001) == *"| 2.7500 |  |"* ]] ||
  fail "rates.md: the rerun rate: $(row llama adam "standard, batch 8" 0.001)"
[[ $(row llama adam "accumulation, 4 x 8" 0.001) == *"**picked** (highest rate tried: edge)"* ]] ||
  fail "rates.md: the edge at the top: $(row llama adam "accumulation, 4 x 8" 0.001)"
[[ $(row vit adam "standard, batch 8" 0.001) == *"**picked** (lowest rate tried: edge)"* ]] ||
  fail "rates.md: the edge at the bottom: $(row vit adam "standard, batch 8" 0.001)"
[[ $(row vit adam "accumulation, 4 x 8" 0.00316) == *"| failed |  |"* ]] ||
  fail "rates.md: the failed run: $(row vit adam "accumulation, 4 x 8" 0.00316)"
[[ $(grep -c '\*\*picked\*\*' "$tmp/out/rates.md") -eq 6 ]] || fail "rates.md: not 6 picks"
own=$tmp/out/accumulation-own-rate.toml
if [[ ! -f $own ]]; then
  fail "no accumulation-own-rate.toml, though Llama's accumulation pick differs"
else
  grep -qx 'name = "study-accumulation-rate"' "$own" || fail "the own-rate sweep's name"
  said="lowest final validation loss of 3 rates x 400 steps at seed 100, accumulation step"
  has "$(cat "$own")" "when = { model = \"llama\", optimizer = \"adam\" }
[override.set]
lr = 0.001
lr_chosen_by = \"$said\"" || fail "the own-rate sweep lacks Llama's own pick: $(cat "$own")"
  if [[ -n $gs ]]; then
    # Llama and NanoVLM with Adam at micro-batch 8 x 4, at their own rates, with
    # study-cpu.toml's seeds.
    dry=$("$gs" sweep "$own" --dry-run 2>&1) || fail "gradscope refuses the own-rate sweep: $dry"
    runs=$(awk '$NF == "run" {print $2, $3, $4, $5, $6}' <<< "$dry" | sort)
    expected=$( (printf 'llama adam accumulation batch=8 seed=%s\n' 0 1 2
      printf 'nanovlm adam accumulation batch=8 seed=%s\n' 0 1 2 3 4 5 6 7) | sort)
    [[ $runs == "$expected" ]] || fail "the own-rate sweep runs: $runs"
    # The committed grids with the overrides appended, as scripts/study.sh sweeps them.
    for f in study-cpu study-dropout; do
      cat "$repo/configs/sweeps/$f.toml" "$tmp/out/rates.toml" > "$tmp/$f.toml"
      "$gs" sweep "$tmp/$f.toml" --dry-run > "$tmp/dry" 2>&1 ||
        fail "gradscope refuses $f.toml with rates.toml appended: $(head -3 "$tmp/dry")"
    done
  fi
fi

# --- the same picks for both steps: no own-rate sweep, and an earlier one is removed ---
sqlite3 "$tmp/rates.db" "DELETE FROM runs WHERE run_id IN ('00000000000000b3',
  '00000000000000f3')"
run_pick
[[ $code -eq 0 ]] || fail "equal picks: exit $code ($(cat "$tmp/err"))"
[[ ! -e $own ]] || fail "an own-rate sweep is left where every pick is the standard one"
grep -qF "no accumulation-own-rate.toml" "$tmp/msg" || fail "equal picks are not said"
grep -qF "lr = 0.000316" "$tmp/out/rates.toml" || fail "rates.toml after equal picks"

# --- bad data: exit 2 naming the value ---
sqlite3 "$tmp/rates.db" "DELETE FROM runs WHERE run_id LIKE '00000000000000c%'
  OR run_id LIKE '00000000000000d%'"
cp "$tmp/rates.db" "$tmp/good.db"
add 00000000000000e1 '"Llama"' adam standard 1e-2 ok 1.0
expect_refused 2 "config.model is 'Llama'" "an upper-case name"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama\nx"' adam standard 1e-2 ok 1.0
expect_refused 2 "config.model is the bytes x'6C6C616D610A78'" "a name with a line break"
[[ $(wc -l < "$tmp/err") -eq 1 ]] || fail "a line break reached the message: $(cat "$tmp/err")"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam standard -1e-2 ok 1.0
expect_refused 2 "config.lr is -0.01, not a finite positive number" "a negative rate"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam standard '"0.01"' ok 1.0
expect_refused 2 "config.lr is '0.01', not a finite positive number" "a rate as text"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam standard 1e999 ok 1.0
expect_refused 2 "not a finite positive number" "an infinite rate"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam standard 1.234567e-3 ok 1.0
expect_refused 2 "needs more than 6 significant digits" "a rate %.6g would change"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam standard 1e-2 ok '"low"'
expect_refused 2 "final_val_loss 'low', not a finite number" "an ok run's loss as text"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam checkpoint 1e-2 ok 1.0
expect_refused 2 "not standard or accumulation" "another step"
cp "$tmp/good.db" "$tmp/rates.db"
add 00000000000000e1 '"llama"' adam standard 3.16e-4 ok 1.0
expect_refused 2 "try one rate twice" "one rate twice"
cp "$tmp/good.db" "$tmp/rates.db"
add "0000'; x" '"llama"' adam standard 1e-2 ok 1.0
expect_refused 2 "a run id is '0000''; x', not 16 hexadecimal digits" "a bad run id"

# --- a step without an ok run: exit 1 naming it ---
cp "$tmp/good.db" "$tmp/rates.db"
sqlite3 "$tmp/rates.db" "UPDATE runs SET record_json = json_set(record_json, '\$.status',
  'diverged') WHERE json_extract(record_json, '\$.config.strategy') = 'accumulation'"
expect_refused 1 "llama adam accumulation: no ok run among 2 (diverged, diverged)" "no ok run"
cp "$tmp/good.db" "$tmp/rates.db"
sqlite3 "$tmp/rates.db" "DELETE FROM runs WHERE run_id LIKE '00000000000000b%'"
expect_refused 1 "llama adam accumulation: no runs" "a step without runs"

# --- usage ---
code=0
bash "$pick" "$tmp/rates.db" > /dev/null 2>&1 || code=$?
[[ $code -eq 2 ]] || fail "one argument: exit $code"
code=0
bash "$pick" "$tmp/none.db" "$tmp/out" > /dev/null 2>&1 || code=$?
[[ $code -eq 2 ]] || fail "a missing database: exit $code"

if [[ $failures -gt 0 ]]; then
  echo "study_rates_test: $failures failed" >&2
  exit 1
fi
echo "study_rates_test: every check passed"
