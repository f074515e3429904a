#!/usr/bin/env bash
# accuracy.sh — issue 31's accuracy targets, rerunnable: a byte-level Llama (8 layers, width 512,
# 25.4 M parameters) trained on English text (the Python documentation this python3 ships:
# bench/accuracy_setup.py) under each Deepwell recipe and seed, and the same model in PyTorch BF16
# (bench/accuracy_torch.py) for each seed; the validation loss after the last step against the
# bands (nvfp4 within 2% of Deepwell BF16, mxfp8 and fp8_block within 1%; Deepwell BF16 within 1%
# of PyTorch BF16). Not a test: it measures (tests/cli/test_accuracy_bench.sh runs it tiny on CPU).
#
# Usage: bash bench/accuracy.sh DEEPWELL [--steps 1200] [--seeds 1,2,3]
#          [--recipes bf16,mxfp8,fp8_block,nvfp4] [--device cuda] [--gpus 1] [--no-torch]
#          [--layers 8 --width 512 --batch 16 --seq 256] [--lr 1e-3 --min-lr 1e-4 --warmup 100]
#          [--eval-batches N] [--text FILE] [--strict]
#   Each run: `deepwell train --precision R --seed S` (AdamW betas 0.9/0.95, weight decay 0.1 on
#   matrices, clip 1, cosine from lr to min-lr after a linear warmup, validation on all of the
#   validation split after the last step, or its first N micro-batches with --eval-batches; every
#   other flag Deepwell's default) and
#   accuracy_torch.py with the same settings. --gpus N runs N jobs at once, job k on the next free
#   GPU (CUDA_VISIBLE_DEVICES: the N first of the ones it lists when set, else 0..N-1; with
#   --device cpu, N processes). --no-torch leaves PyTorch out (to
#   split the runs over several calls: `python3 bench/accuracy_report.py table A.jsonl B.jsonl`
#   joins them). --strict: exit 1 when a band fails. Exit 1 when a run failed, 2 on a bad flag.
#   env: OUT (default out): $OUT/accuracy.jsonl (one JSON line per run, in table order),
#   $OUT/accuracy.md (the table, also printed), $OUT/corpus.json, $OUT/runs/NAME/{row.json (the
#   run's line, written when it ends: after a call cut short, `python3 bench/accuracy_report.py
#   table $OUT/runs/*/row.json` tabulates the runs that finished), metrics.jsonl, log};
#   PYTHON (default python3, needs torch); WORK (run directories and checkpoints, default a
#   temporary directory removed at the end).
#   Interrupted (SIGTERM, as from `timeout`, or SIGINT): no job starts after the signal; the running
#   ones are stopped with every process below them (frozen, then killed); the finished runs are
#   tabulated as usual, the others listed as failed ("interrupted" or "not started"); exit 143
#   (SIGTERM) or 130 (SIGINT). WORK is removed only once those processes are gone.
# Order: the jobs start slowest first (mxfp8, nvfp4, PyTorch, any other recipe, fp8_block, bf16),
#   so a call cut short loses the cheap runs; accuracy.jsonl and the table keep PyTorch, then
#   --recipes by --seeds.
# Time, full size, measured on H100s (bench/RESULTS.md, call C2, commit c66e3d5, two runs at once
#   on two GPUs): the corpus under 6 s (Python 3.12, 16 cores); Deepwell bf16 1200 steps in
#   9.5-11.6 s a run (about 10 s), PyTorch BF16 54-61 s (about 60 s); mxfp8 0.6-0.8 s a step (step
#   200 but not 300 after 2.5-3 minutes: 12 minutes or more a run, longer than a 10-minute call);
#   fp8_block and nvfp4 not yet measured. To fit the 15 runs into 10-minute calls: first
#   `--gpus 4 --recipes bf16,fp8_block,nvfp4` (12 runs, nvfp4 and PyTorch starting first), then
#   mxfp8 in calls of its own (`--recipes mxfp8 --no-torch --gpus 3`) once its step time allows,
#   and join the parts with `python3 bench/accuracy_report.py table`. Measured on the CPU (2 shared
#   cores, one thread each): --layers 2 --width 128 --batch 4 --seq 64 --steps 30, training steps
#   only: Deepwell bf16 846 tokens/s (9 s), mxfp8 331 (23 s), PyTorch BF16 14,100 (0.5 s);
#   validating on all 765 micro-batches of that size took Deepwell's exact CPU engine 2 minutes,
#   hence --eval-batches for CPU checks.
set -u
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "accuracy.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: bash bench/accuracy.sh DEEPWELL [--steps N] [--seeds 1,2,3] [--recipes LIST] [--device cuda|cpu] [--gpus N] (header of bench/accuracy.sh)"
dw=$1
shift
[ -x "$dw" ] || die "$dw: not an executable (give the deepwell binary, e.g. build/deepwell)"
steps=1200 seeds=1,2,3 recipes=bf16,mxfp8,fp8_block,nvfp4 device=cuda gpus=1 torch=1 strict=0
layers=8 width=512 batch=16 seq=256 lr=1e-3 min_lr=1e-4 warmup=100 text='' eval_cap=''
while [ $# -gt 0 ]; do
  case $1 in
  --no-torch) torch=0; shift; continue ;;
  --strict) strict=1; shift; continue ;;
  --steps | --seeds | --recipes | --device | --gpus | --layers | --width | --batch | --seq | --lr | --min-lr | --warmup | --text | --eval-batches)
    [ $# -ge 2 ] || die "$1 needs a value" ;;
  *) die "unknown flag '$1' (see the header of bench/accuracy.sh)" ;;
  esac
  v=$2
  case $1 in
  --steps) steps=$v ;; --seeds) seeds=$v ;; --recipes) recipes=$v ;; --device) device=$v ;;
  --gpus) gpus=$v ;; --layers) layers=$v ;; --width) width=$v ;; --batch) batch=$v ;;
  --seq) seq=$v ;; --lr) lr=$v ;; --min-lr) min_lr=$v ;; --warmup) warmup=$v ;; --text) text=$v ;;
  --eval-batches) eval_cap=$v ;;
  esac
  shift 2
done
for f in steps:$steps gpus:$gpus ${eval_cap:+eval-batches:$eval_cap} layers:$layers width:$width batch:$batch seq:$seq warmup:$warmup; do
  [[ ${f#*:} =~ ^[0-9]+$ ]] || die "--${f%%:*} '${f#*:}' is not a whole number"
done
if [ "$steps" -lt 1 ] || [ "$gpus" -lt 1 ]; then die "--steps and --gpus must be >= 1"; fi
[[ $seeds =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--seeds '$seeds' is not a comma-separated list of whole numbers"
[[ $recipes =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || die "--recipes '$recipes' is not a comma-separated list of recipe names"
case $device in cuda | cpu) ;; *) die "--device '$device' must be cuda or cpu" ;; esac
[ -z "$text" ] || [ -r "$text" ] || die "--text $text: cannot be read"
py=${PYTHON:-python3}
command -v ps >/dev/null || die "ps not found (Debian: apt-get install procps): it finds the runs to stop on a signal"
out=${OUT:-out}
mkdir -p "$out/runs" || die "$out: cannot create the output directory"
own_work=0
if [ -z "${WORK:-}" ]; then WORK=$(mktemp -d) && own_work=1; fi
mkdir -p "$WORK" || die "$WORK: cannot create the work directory"
[ $own_work = 1 ] && trap 'rm -rf "$WORK"' EXIT
job_list=() workers=() stopped_by=''
trap 'interrupted SIGTERM 143' TERM
trap 'interrupted SIGINT 130' INT

# The corpus and the model config, once for every run.
"$py" "$here/accuracy_setup.py" "$WORK/data" --layers "$layers" --width "$width" --seq "$seq" \
  ${text:+--text "$text"} >"$out/corpus.json" || { echo "accuracy.sh: accuracy_setup.py failed" >&2; exit 1; }
data=$WORK/data
val_windows=$(( ($(wc -c <"$data/val.txt") - 1) / seq ))
eval_batches=$(( val_windows / batch > 0 ? val_windows / batch : 1 )) # all of the validation split
[ -n "$eval_cap" ] && [ "$eval_cap" -lt "$eval_batches" ] && eval_batches=$eval_cap
echo "accuracy.sh: corpus $(cat "$out/corpus.json")" >&2
echo "accuracy.sh: $layers layers, width $width, batch $batch x seq $seq, $steps steps, lr $lr -> $min_lr," \
  "warmup $warmup, $eval_batches validation batches, device $device, $gpus at once" >&2

# The jobs: "torch_bf16 SEED" and "RECIPE SEED", PyTorch first: the order of accuracy.jsonl.
IFS=, read -ra seed_list <<<"$seeds"
IFS=, read -ra recipe_list <<<"$recipes"
[ $torch = 1 ] && for s in "${seed_list[@]}"; do job_list+=("torch_bf16 $s"); done
for r in "${recipe_list[@]}"; do for s in "${seed_list[@]}"; do job_list+=("$r $s"); done; done

# The order they start in: the slowest first (the header's measurements; unmeasured recipes by guess).
start_rank() { case $1 in mxfp8) echo 0 ;; nvfp4) echo 1 ;; torch_bf16) echo 2 ;; fp8_block) echo 4 ;; bf16) echo 5 ;; *) echo 3 ;; esac; }
mapfile -t run_order < <(for k in "${!job_list[@]}"; do echo "$(start_rank "${job_list[$k]% *}") $k"; done | sort -s -n -k1,1 | cut -d' ' -f2)

common=(--steps "$steps" --batch "$batch" --seq "$seq" --lr "$lr" --min-lr "$min_lr" --warmup "$warmup")
job_name() { echo "${job_list[$1]% *}_s${job_list[$1]#* }"; } # job_name K: torch_bf16_s1, nvfp4_s3, ...
run_job() { # run_job K: job K's run, its JSON line in $OUT/runs/NAME/row.json
  local recipe=${job_list[$1]% *} seed=${job_list[$1]#* } name t0 rc msg row
  name=$(job_name "$1")
  row=$out/runs/$name/row.json
  t0=$(date +%s%N)
  if [ "$recipe" = torch_bf16 ]; then
    "$py" "$here/accuracy_torch.py" --config "$data/model/config.json" --train "$data/train.txt" \
      --val "$data/val.txt" --seed "$seed" --device "$device" --eval-batches "$eval_batches" "${common[@]}" \
      >"$out/runs/$name/log" 2>&1
    rc=$?
    grep '^{' "$out/runs/$name/log" | tail -1 >"$row.tmp"
    if [ $rc != 0 ] || [ ! -s "$row.tmp" ]; then
      # shellcheck disable=SC1003 # tr deletes quotes and backslashes
      msg=$(tail -1 "$out/runs/$name/log" | tr -d '"\\' | cut -c1-200)
      echo "{\"impl\": \"pytorch\", \"recipe\": \"$recipe\", \"seed\": $seed, \"error\": \"exit $rc: $msg\"}" >"$row.tmp"
    fi
  else
    "$dw" train --model "$data/model" --data "$data/train.txt" --val "$data/val.txt" --out "$WORK/runs/$name" \
      --precision "$recipe" --seed "$seed" --device "$device" --eval-every "$steps" --eval-batches "$eval_batches" \
      --schedule cosine --weight-decay 0.1 --clip 1 --beta1 0.9 --beta2 0.95 --ckpt-minutes 0 --keep 1 \
      --log-every 100 "${common[@]}" >"$out/runs/$name/log" 2>&1
    rc=$?
    cp "$WORK/runs/$name/metrics.jsonl" "$out/runs/$name/" 2>/dev/null
    "$py" "$here/accuracy_report.py" row "$WORK/runs/$name" "$recipe" "$seed" \
      "$((($(date +%s%N) - t0) / 1000000))e-3" "$rc" "$out/runs/$name/log" >"$row.tmp"
    rm -rf "$WORK/runs/$name"/ckpt-* # checkpoints: 300 MB a run at full size
  fi
  mv "$row.tmp" "$row"
  echo "accuracy.sh: $name done (exit $rc): $(cut -c1-200 "$row")" >&2
}
visible=(${CUDA_VISIBLE_DEVICES:+${CUDA_VISIBLE_DEVICES//,/ }}) # the GPUs given, when the caller narrows them
worker() { # worker G: claims the jobs one by one (mkdir is atomic) and runs them on the G-th GPU
  trap : TERM INT # the main shell stops this one and its run (interrupted)
  export CUDA_VISIBLE_DEVICES=${visible[$1]:-$1}
  for k in "${run_order[@]}"; do
    [ -e "$WORK/stop" ] && break
    mkdir "$WORK/claim.$k" 2>/dev/null && run_job "$k" </dev/null
  done
}
tabulate() { # $OUT/accuracy.jsonl in table order (a job without its row.json: an error line) and the table
  # (accuracy.md, printed); returns 1 when a run failed
  local k name why failed=0
  : >"$out/accuracy.jsonl"
  for k in "${!job_list[@]}"; do
    name=$(job_name "$k")
    why="no result"
    [ -n "$stopped_by" ] && { [ -e "$out/runs/$name/log" ] && why="interrupted by $stopped_by" || why="not started: $stopped_by"; }
    cat "$out/runs/$name/row.json" >>"$out/accuracy.jsonl" 2>/dev/null ||
      echo "{\"recipe\": \"${job_list[$k]% *}\", \"seed\": ${job_list[$k]#* }, \"error\": \"$why\"}" >>"$out/accuracy.jsonl"
  done
  grep -q '"error"' "$out/accuracy.jsonl" && failed=1
  "$py" "$here/accuracy_report.py" table "$out/accuracy.jsonl" --corpus "$out/corpus.json" >"$out/accuracy.md" || failed=1
  cat "$out/accuracy.md"
  return $failed
}
process_tree() { # process_tree PID...: the PIDs and every live process below them (ps's parent links)
  ps -e -o pid= -o ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) in_tree[r[i]] = 1 }
    { parent[$1] = $2 }
    END { do { grew = 0; for (p in parent) if (!(p in in_tree) && (parent[p] in in_tree)) { in_tree[p] = 1; grew = 1 } } while (grew)
          for (p in in_tree) if (p in parent) print p }' | sort -n | tr '\n' ' '
}
stop_tree() { # stop_tree PID...: freeze the tree (a frozen process starts nothing) until it stops growing, kill
  # it, and wait until none of it runs (zombies count as gone); returns 1 if some still run after 60 s
  local pids='' prev=x left='' i
  for ((i = 0; i < 20; i++)); do
    [ "$pids" = "$prev" ] && break
    prev=$pids pids=$(process_tree "$@")
    [ -n "$pids" ] && kill -STOP $pids 2>/dev/null
  done
  [ -n "$pids" ] || return 0
  kill -KILL $pids 2>/dev/null
  { wait; } 2>/dev/null # this shell's children: the workers
  for ((i = 0; i < 600; i++)); do
    left=$(ps -o pid= -o stat= -p "${pids// /,}" 2>/dev/null | awk '$2 !~ /^Z/ { print $1 }' | tr '\n' ' ')
    [ -z "${left// /}" ] && return 0
    sleep 0.1
  done
  echo "accuracy.sh: processes $left still run 60 s after SIGKILL; $WORK is left in place" >&2
  return 1
}
interrupted() { # interrupted SIGNAL STATUS: no job starts, the running ones stop, the finished ones are
  # tabulated, exit STATUS; WORK (the EXIT trap) goes after the workers and all below them, or stays
  trap '' TERM INT
  stopped_by=$1
  [ -d "$WORK" ] && : >"$WORK/stop"
  echo "accuracy.sh: $1: stopping the workers and their runs; no job starts now" >&2
  if [ ${#workers[@]} -gt 0 ]; then
    stop_tree "${workers[@]}" || trap - EXIT
    tabulate # the table of the runs that finished
  fi
  exit "$2"
}
rm -rf "$WORK"/claim.* "$WORK/runs" "$WORK/stop" # a WORK used before: nothing of it is this call's
for k in "${!job_list[@]}"; do rm -rf "$out/runs/$(job_name "$k")" && mkdir -p "$out/runs/$(job_name "$k")"; done
for ((g = 0; g < gpus; g++)); do worker $g & workers+=($!); done
wait

failed=0
tabulate || failed=1
[ $failed = 1 ] && exit 1
[ $strict = 1 ] && grep -q '| FAIL' "$out/accuracy.md" && exit 1
exit 0
