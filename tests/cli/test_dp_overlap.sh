#!/usr/bin/env bash
# test_dp_overlap.sh DEEPWELL — data parallelism's gradient reduction overlapped with backward
# (issue 28) on CPU ranks: each bucket's collectives start from the executor as soon as the backward
# step that last writes its gradients has run, and `--no-overlap` starts the very same collectives
# in the same order after backward, so the two must agree bit for bit: the losses and gradient norms
# of every step and every byte of the final checkpoint's tensors. Small buckets (a random size of
# 300-3000 floats through DW_DP_BUCKET_FLOATS, so that the pool has tens of buckets that become
# ready at different backward steps) on a random-weight GPT-2 and mixtral-tiny (MoE: 4 experts),
# ZeRO 0, 1 and 2, accumulation 1 and 2, `--ep 2`, mpirun (MPI's nonblocking collectives) and
# `deepwell launch` (tcp: each collective runs to completion where it starts). The overlapped runs
# must say that reductions started during backward; metrics.jsonl carries each rank's
# communication and exposed-communication seconds; a bad bucket size is refused by name.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env

seed=$((RANDOM * 32768 + RANDOM))
export DW_DP_BUCKET_FLOATS=$((300 + RANDOM % 2701))
echo "seed $seed, buckets of $DW_DP_BUCKET_FLOATS floats"
tiny_gpt2 "$tmp/gpt2" # random weights from --seed
common=(train --data builtin --seq 32 --steps 4 --lr 3e-3 --warmup 2 --eval-every 0 --ckpt-every 0 --keep 0
        --device cpu --seed $seed --batch 2)

# same A B: metrics (loss, grad_norm) and every tensor file of the final checkpoint identical
same() {
  python3 - "$tmp/$1" "$tmp/$2" <<'PY' || return 1
import json, sys
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), (x, y)
PY
  local files
  files=$(cd "$tmp/$1/ckpt-4" && find . -name '*.safetensors' | sort)
  [ -n "$files" ] || return 1
  [ "$files" = "$(cd "$tmp/$2/ckpt-4" && find . -name '*.safetensors' | sort)" ] || return 1
  for f in $files; do cmp -s "$tmp/$1/ckpt-4/$f" "$tmp/$2/ckpt-4/$f" || return 1; done
}

# pair NAME COMMAND... :: ARGS...: the overlapped run and the --no-overlap run of COMMAND (what
# runs `deepwell` as 2 ranks) train ARGS, compared
pair() {
  local name=$1 launcher=()
  shift
  while [ "$1" != "::" ]; do launcher+=("$1"); shift; done
  shift
  "${launcher[@]}" "${common[@]}" "$@" --out "$tmp/$name" >/dev/null 2>"$tmp/$name.err"
  local rc1=$?
  "${launcher[@]}" "${common[@]}" "$@" --no-overlap --out "$tmp/$name.no" >/dev/null 2>"$tmp/$name.no.err"
  local rc2=$?
  if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
    bad "$name: exit $rc1 / $rc2: $(tail -n 3 "$tmp/$name.err" "$tmp/$name.no.err")"
    return
  fi
  local n
  n=$(sed -n 's/.*rank 0\/2\] data parallel: \([0-9]*\) bucket reductions started during backward.*/\1/p' "$tmp/$name.err")
  if ! [ "${n:-0}" -gt 0 ]; then bad "$name: no reduction started during backward ($(grep 'data parallel' "$tmp/$name.err"))"; return; fi
  if grep -q "started during backward" "$tmp/$name.no.err"; then bad "$name: --no-overlap still overlapped"; return; fi
  same "$name" "$name.no" && ok "$name: overlapped ($n reductions started in backward) = --no-overlap, bit for bit" ||
    bad "$name: overlapped and --no-overlap differ"
}

mpi=(mpirun -np 2 "$dw")
for z in 0 1 2; do
  pair "gpt2-z$z-a1" "${mpi[@]}" :: --model "$tmp/gpt2" --zero $z
  pair "gpt2-z$z-a2" "${mpi[@]}" :: --model "$tmp/gpt2" --zero $z --global-batch 8
done
pair "moe-z0-a2" "${mpi[@]}" :: --model mixtral-tiny --global-batch 8
pair "moe-z1-a1" "${mpi[@]}" :: --model mixtral-tiny --zero 1
pair "moe-z2-a2" "${mpi[@]}" :: --model mixtral-tiny --zero 2 --global-batch 8
pair "moe-ep2-z0-a1" "${mpi[@]}" :: --model mixtral-tiny --ep 2
pair "moe-ep2-z2-a2" "${mpi[@]}" :: --model mixtral-tiny --ep 2 --zero 2 --global-batch 8
pair "tcp-gpt2-z1-a2" "$dw" launch -n 2 -- :: --model "$tmp/gpt2" --zero 1 --global-batch 8
pair "tcp-moe-ep2-z0-a2" "$dw" launch -n 2 -- :: --model mixtral-tiny --ep 2 --global-batch 8

# the overlapped ZeRO-0 run gives the losses of the reduction as it was before (2 ranks add a + b
# either way): one process with the global batch within test_dp.sh's 2e-6
"$dw" "${common[@]}" --model "$tmp/gpt2" --batch 4 --out "$tmp/one" >/dev/null 2>"$tmp/one.err"
check "one process, --batch 4" 0 $?
python3 - "$tmp/one/metrics.jsonl" "$tmp/gpt2-z0-a1/metrics.jsonl" <<'PY' && ok "  ... 2 overlapped ranks x 2 = 1 process x 4 (2e-6); each rank's communication in metrics.jsonl" || bad "  ... one process vs overlapped ranks, or the per-rank metrics"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 2e-6 * x["loss"], (x, y)
    assert "comm_s" not in x and "exposed_comm_s" not in x, x
    for k in ("comm_s", "exposed_comm_s"):
        assert len(y[k]) == 2 and all(v >= 0 for v in y[k]), y
    assert all(e <= y["elapsed_s"] + 1 for e in y["exposed_comm_s"]), y
PY

DW_DP_BUCKET_FLOATS=0 "${mpi[@]}" "${common[@]}" --model "$tmp/gpt2" --out "$tmp/bad" >/dev/null 2>"$tmp/bad.err"
[ $? -ne 0 ] && ok "DW_DP_BUCKET_FLOATS=0 refused" || bad "DW_DP_BUCKET_FLOATS=0 ran"
has "  ... naming it" "$tmp/bad.err" "DW_DP_BUCKET_FLOATS=0: a gradient bucket is a positive number of floats"

[ "$fails" -eq 0 ] || exit 1
