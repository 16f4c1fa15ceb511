#!/usr/bin/env bash
# Picks the study's learning rates from the runs of configs/sweeps/study-rates.toml: per model,
# optimizer and way of computing a step (standard, accumulation), the rate whose run reached
# the lowest final validation loss among the runs that ended ok (a run that diverged or failed
# is never picked; equal losses go to the smaller rate).
#   scripts/study-rates.sh RATES_DB OUT_DIR
# RATES_DB is read only. OUT_DIR gets:
#   rates.md    every tried rate with its final validation loss or its status, the picks
#               marked, and a flag where a pick is the lowest or highest rate tried;
#   rates.toml  one [[override]] per model and optimizer: `lr` the standard step's pick and
#               `lr_chosen_by` how it was chosen; scripts/study.sh appends them to copies of
#               the study's sweep files;
#   accumulation-own-rate.toml   a sweep of the study's accumulation runs at micro-batch 8
#               (configs/sweeps/study-cpu.toml's, seeds included) at the accumulation step's
#               own pick, for the models and optimizers whose own pick differs from the
#               standard one; removed, and not written, when none does.
# Everything read from the database is checked before it is written: names are lower-case
# letters, digits, '_' and '-', rates finite, positive and exact in 6 significant digits, ok
# runs have a finite validation loss, and the runs of one model, optimizer and step share
# their steps, seed and micro-batches and try each rate once. Exit 0 when the picks are
# written, 1 when a model and optimizer lack the runs a pick needs (no ok run of one of its
# steps, or no runs of one), 2 for bad usage or bad data, each naming what is wrong.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: scripts/study-rates.sh RATES_DB OUT_DIR" >&2
  exit 2
fi
db=$1
out=$2
if [[ ! -f $db ]]; then
  echo "study-rates: '$db' is not a file (the database of configs/sweeps/study-rates.toml)" >&2
  exit 2
fi
# The main grid, whose accumulation runs the own-rate sweep repeats at other rates.
study_cpu=$(dirname -- "$0")/../configs/sweeps/study-cpu.toml
if [[ ! -f $study_cpu ]]; then
  echo "study-rates: $study_cpu not found" >&2
  exit 2
fi

sql() { sqlite3 -readonly -batch -bail "$db" "$@"; }

# SQL for: a name as the sweep files need it; a value shown in a message (printable ASCII
# quoted, anything else as hexadecimal bytes, so a message never carries a control character).
name_ok() { echo "(typeof($1) = 'text' AND $1 <> '' AND $1 NOT GLOB '*[^a-z0-9_-]*')"; }
shown() {
  echo "(CASE WHEN typeof($1) = 'text' AND $1 NOT GLOB '*[^ -~]*' THEN quote($1)
    WHEN typeof($1) = 'text' THEN 'the bytes x''' || hex($1) || ''''
    ELSE coalesce(quote($1), 'null') END)"
}
finite() { echo "(typeof($1) IN ('integer', 'real') AND abs($1) <= 1.7976931348623157e308)"; }
count_ok() { echo "(typeof($1) = 'integer' AND $1 >= $2)"; }

# The run as the report sees it: its latest attempt, except that an attempt without a final
# status (interrupted, crashed, error, timeout) never replaces one with a final status.
latest="WITH attempts AS (
  SELECT run_id AS id, record_json AS r, ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY
    json_extract(record_json, '\$.status') IN ('ok', 'oom', 'diverged') DESC,
    started_at DESC, attempt_id DESC) AS n
  FROM runs),
latest AS (
  SELECT id, json_extract(r, '\$.config.model') AS model,
    json_extract(r, '\$.config.optimizer') AS optimizer,
    json_extract(r, '\$.config.strategy') AS strategy, json_extract(r, '\$.config.lr') AS lr,
    json_extract(r, '\$.status') AS status, json_extract(r, '\$.final_val_loss') AS val,
    json_extract(r, '\$.config.steps') AS steps, json_extract(r, '\$.config.seed') AS seed,
    json_extract(r, '\$.config.batch') AS batch,
    json_extract(r, '\$.config.accum_steps') AS accum
  FROM attempts WHERE n = 1)"

if ! runs=$(sql "$latest SELECT count(*) FROM latest" 2>&1); then
  echo "study-rates: cannot read the runs of '$db': $runs" >&2
  exit 2
fi
if [[ $runs -eq 0 ]]; then
  echo "study-rates: '$db' holds no runs" >&2
  exit 2
fi

# The first bad value, if any, named with its run.
bad=$(sql "$latest SELECT who || problem FROM (SELECT CASE
  WHEN typeof(id) <> 'text' OR length(id) <> 16 OR id GLOB '*[^0-9a-f]*'
    THEN 'a run id is ' || $(shown id) || ', not 16 hexadecimal digits'
  WHEN NOT $(name_ok model) THEN 'config.model is ' || $(shown model)
  WHEN NOT $(name_ok optimizer) THEN 'config.optimizer is ' || $(shown optimizer)
  WHEN NOT $(name_ok strategy) THEN 'config.strategy is ' || $(shown strategy)
  WHEN strategy NOT IN ('standard', 'accumulation')
    THEN 'config.strategy is ' || $(shown strategy) || ', not standard or accumulation'
  WHEN NOT $(name_ok status) THEN 'status is ' || $(shown status)
  WHEN NOT ($(finite lr) AND lr > 0)
    THEN 'config.lr is ' || $(shown lr) || ', not a finite positive number'
  WHEN CAST(printf('%.6g', lr) AS REAL) <> lr
    THEN 'config.lr ' || printf('%.17g', lr) || ' needs more than 6 significant digits'
  WHEN NOT $(count_ok steps 1) THEN 'config.steps is ' || $(shown steps)
  WHEN NOT $(count_ok seed 0) THEN 'config.seed is ' || $(shown seed)
  WHEN NOT $(count_ok batch 1) THEN 'config.batch is ' || $(shown batch)
  WHEN NOT $(count_ok accum 1) THEN 'config.accum_steps is ' || $(shown accum)
  WHEN (strategy = 'standard') <> (accum = 1)
    THEN 'config.strategy ' || strategy || ' with config.accum_steps ' || accum
  WHEN status = 'ok' AND NOT $(finite val)
    THEN 'status ok with final_val_loss ' || $(shown val) || ', not a finite number'
  END AS problem,
  CASE WHEN typeof(id) = 'text' AND length(id) = 16 AND id NOT GLOB '*[^0-9a-f]*'
    THEN 'run ' || id || ': ' ELSE '' END AS who
  FROM latest) WHERE problem IS NOT NULL ORDER BY who LIMIT 1")
if [[ -n $bad ]]; then
  echo "study-rates: $db: $bad" >&2
  exit 2
fi

# One rate grid per model, optimizer and step: the same steps, seed and micro-batches, each
# rate once.
mixed=$(sql "$latest SELECT model || ' ' || optimizer || ' ' || strategy FROM latest
  GROUP BY model, optimizer, strategy
  HAVING count(DISTINCT steps) > 1 OR count(DISTINCT seed) > 1 OR count(DISTINCT batch) > 1
    OR count(DISTINCT accum) > 1 OR count(*) <> count(DISTINCT lr)
  ORDER BY 1 LIMIT 1")
if [[ -n $mixed ]]; then
  echo "study-rates: $db: the runs of $mixed differ in steps, seed, batch or accum_steps, or" \
    "try one rate twice: they are not one grid of rates" >&2
  exit 2
fi

# Every model and optimizer needs both steps, and an ok run of each.
missing=$(sql "$latest, pairs AS (SELECT DISTINCT model, optimizer FROM latest),
  steps(strategy) AS (VALUES ('standard'), ('accumulation'))
  SELECT p.model || ' ' || p.optimizer || ' ' || s.strategy || ': ' ||
    CASE WHEN count(l.id) = 0 THEN 'no runs'
      ELSE 'no ok run among ' || count(l.id) || ' (' || group_concat(l.status, ', ') || ')' END
  FROM pairs p CROSS JOIN steps s LEFT JOIN latest l
    ON l.model = p.model AND l.optimizer = p.optimizer AND l.strategy = s.strategy
  GROUP BY p.model, p.optimizer, s.strategy
  HAVING coalesce(sum(l.status = 'ok'), 0) = 0
  ORDER BY 1")
if [[ -n $missing ]]; then
  echo "study-rates: $db: no rate can be picked for:" >&2
  echo "$missing" | sed 's/^/  /' >&2
  exit 1
fi

# Every run, checked above: model|optimizer|strategy|rate|status|loss|picked|edge|rates|steps|
# seed|batch|accum|run id, in the order of the table.
table=$(sql "$latest, ranked AS (SELECT *,
    ROW_NUMBER() OVER g_best AS best, count(*) OVER g AS tried,
    -- the edges of the rates that ran to the end (a run that crashed or timed out tried none)
    min(CASE WHEN status IN ('ok', 'diverged') THEN lr END) OVER g AS lowest,
    max(CASE WHEN status IN ('ok', 'diverged') THEN lr END) OVER g AS highest
  FROM latest
  WINDOW g AS (PARTITION BY model, optimizer, strategy),
    g_best AS (PARTITION BY model, optimizer, strategy
      ORDER BY status = 'ok' DESC, val ASC, lr ASC))
  SELECT model, optimizer, strategy, printf('%.6g', lr), status,
    CASE WHEN status = 'ok' THEN printf('%.4f', val) ELSE '' END,
    best = 1 AND status = 'ok',
    CASE WHEN best <> 1 THEN '' WHEN lr = lowest AND lr = highest THEN 'only'
      WHEN lr = lowest THEN 'lowest' WHEN lr = highest THEN 'highest' ELSE '' END,
    tried, steps, seed, batch, accum, id
  FROM ranked ORDER BY model, optimizer, strategy = 'accumulation', lr")

mkdir -p -- "$out"
# A float as TOML writes one: 10 is an integer there, 10.0 a float.
toml_float() { [[ $1 == *[.e]* ]] && echo "$1" || echo "$1.0"; }
chosen_by() { echo "lowest final validation loss of $1 rates x $2 steps at seed $3, $4 step"; }
# An [[override]] setting one model's and optimizer's rate (the values checked above: names
# of [a-z0-9_-], a rate in %.6g, the text made of them and fixed words).
override() {
  echo "[[override]]"
  echo "when = { model = \"$1\", optimizer = \"$2\" }"
  echo "[override.set]"
  echo "lr = $(toml_float "$3")"
  echo "lr_chosen_by = \"$4\""
}

# rates.md: every tried rate, then the picks.
{
  echo "# The study's learning rates"
  echo
  echo "Picked by \`scripts/study-rates.sh\` from the runs of \`configs/sweeps/study-rates.toml\`"
  echo "($runs runs): per model, optimizer and way of computing a step, the rate with the lowest"
  echo "final validation loss among the runs that ended ok. A pick at the lowest or highest rate"
  echo "tried is flagged: the best rate may lie beyond the range tried."
  echo
  echo "| model | optimizer | step | rate | final validation loss | pick | run |"
  echo "|---|---|---|---|---|---|---|"
  echo "$table" | awk -F'|' '{
    step = $3 == "standard" ? "standard, batch " $12 : "accumulation, " $13 " x " $12
    loss = $5 == "ok" ? $6 : $5
    pick = ""
    if ($7 == 1) {
      pick = "**picked**"
      if ($8 == "lowest") pick = pick " (lowest rate tried: edge)"
      if ($8 == "highest") pick = pick " (highest rate tried: edge)"
      if ($8 == "only") pick = pick " (the only rate tried: edge)"
    }
    printf "| %s | %s | %s | %s | %s | %s | `%s` |\n", $1, $2, step, $4, loss, pick, $14
  }'
} > "$out/rates.md"

picks=$(echo "$table" | awk -F'|' '$7 == 1')
# model|optimizer|standard pick|accumulation pick|then, for the standard and the accumulation
# step: rates tried|steps|seed. One line per model and optimizer.
pairs=$(echo "$picks" | awk -F'|' '
  { key = $1 "|" $2; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    rate[key, $3] = $4; grid[key, $3] = $9 "|" $10 "|" $11 }
  END { for (i = 1; i <= n; ++i) { k = order[i]
    print k "|" rate[k, "standard"] "|" rate[k, "accumulation"] "|" grid[k, "standard"] "|" \
      grid[k, "accumulation"] } }')

{
  echo
  echo "| model | optimizer | standard step's pick (every step of the grids) |" \
    "accumulation step's own pick |"
  echo "|---|---|---|---|"
  echo "$pairs" | awk -F'|' '{
    own = $4 == $3 ? $4 " (the same)" : $4 " (its own sweep: accumulation-own-rate.toml)"
    printf "| %s | %s | %s | %s |\n", $1, $2, $3, own }'
} >> "$out/rates.md"

# rates.toml: the standard step's pick for every step of a model and optimizer.
{
  echo "# The study's learning rates, one per model and optimizer: the standard step's pick"
  echo "# (scripts/study-rates.sh; rates.md lists every rate tried). scripts/study.sh appends"
  echo "# these blocks to copies of configs/sweeps/study-cpu.toml and study-dropout.toml."
  while IFS='|' read -r model optimizer standard _ n steps seed _; do
    echo
    override "$model" "$optimizer" "$standard" "$(chosen_by "$n" "$steps" "$seed" standard)"
  done <<< "$pairs"
} > "$out/rates.toml"

# The accumulation step's own picks where they differ from the standard step's.
differ=$(echo "$pairs" | awk -F'|' '$3 != $4')
own="$out/accumulation-own-rate.toml"
rm -f -- "$own"
if [[ -z $differ ]]; then
  echo "study-rates: the accumulation step's own pick is the standard step's for every model" \
    "and optimizer: no accumulation-own-rate.toml (those runs are in the main grid)"
else
  {
    echo "# The study's accumulation runs at micro-batch 8 (4 x 8, 2 evaluation batches of 32),"
    echo "# at the accumulation step's own pick of learning rate where it differs from the"
    echo "# standard step's, at which configs/sweeps/study-cpu.toml runs them: written by"
    echo "# scripts/study-rates.sh from that file (its settings and seeds) and the rates grid."
    # The main grid's settings, less its leading comment and under this sweep's name.
    sed -e '/^#/d' -e 's/^name = "study-cpu"$/name = "study-accumulation-rate"/' -- "$study_cpu"
    echo
    echo "# Only accumulation at micro-batch 8, and only where its own pick differs: every"
    echo "# accumulation run is marked, the overrides below give the ones that differ their rate"
    echo "# and how it was chosen, and the runs still marked are dropped."
    echo "[[exclude]]"
    echo "strategy = [\"standard\", \"checkpoint\"]"
    echo
    echo "[[exclude]]"
    echo "batch = 2"
    echo
    echo "[[override]]"
    echo "when = { strategy = \"accumulation\" }"
    echo "set = { lr_chosen_by = \"no own pick\" }"
    echo
    echo "[[exclude]]"
    echo "lr_chosen_by = \"no own pick\""
    while IFS='|' read -r model optimizer _ accumulation _ _ _ n steps seed; do
      echo
      override "$model" "$optimizer" "$accumulation" \
        "$(chosen_by "$n" "$steps" "$seed" accumulation)"
    done <<< "$differ"
  } > "$own"
  if ! grep -qx 'name = "study-accumulation-rate"' -- "$own"; then
    echo "study-rates: $study_cpu has no line name = \"study-cpu\" to rename" >&2
    rm -f -- "$own"
    exit 2
  fi
  echo "study-rates: the accumulation step's own pick differs for" \
    "$(echo "$differ" | awk -F'|' '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}'):" \
    "$own runs them"
fi
echo "study-rates: picks for $(echo "$pairs" | wc -l) models x optimizers in $out/rates.md" \
  "and $out/rates.toml"
