#!/usr/bin/env bash
# test_ep.sh DEEPWELL — expert parallelism on CPU ranks (issue 28): mixtral-tiny (4 experts, top 2,
# 2 MoE layers) on builtin data. `--ep 2` on 2 ranks (each rank runs 2 experts; rows go to their
# experts' ranks and back by all-to-all) gives the losses of `--ep 1` (plain data parallelism) on 2
# ranks: the forward of every row is the same arithmetic wherever it runs, but the expert weight
# gradients are summed over both ranks' rows in one kernel instead of two partial sums averaged, so
# they differ in their last bits and AdamW carries that on: over these 6 steps in 5 runs (fresh
# seeds) the losses differed by 0 to 5.4e-8 relative and the gradient norms by 1.6e-9 to 8.9e-9
# (the script prints its own run's); asserted at 1e-6 relative. mpirun (MPI) and `deepwell launch`
# (TCP) give bit-identical --ep 2 losses, and so does --ep 2 with selective recompute's dense part
# (DW_MOE_REMAT=0 --recompute selective: the norms run again on each rank); 4 ranks in 2 groups of 2, with
# 2 micro-batches per step, give 4-rank --ep 1's, and so does --ep 4 (one expert per rank, buffers
# for 2 x its own rows: fewer than the group's); an --ep 2 checkpoint holds every expert (rank 0
# writes the whole model: the ranks hold identical weights), matches --ep 1's and resumes on one
# rank with the same losses; rank 0's samples run while the others wait; bad --ep values are
# refused naming both numbers. BF16 programs (2-byte rows), ZeRO-1/2 and experts over capacity
# (dropped assignments) agree the same way. ZeRO-0 reduces each rank's expert gradients only among
# the ranks holding the same experts: without clipping, bit for bit what reducing the whole pool
# (ZeRO-1) gives, on 2 and 4 ranks.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env

# resumed A B TOL: run B's metrics are steps 4-6, with run A's losses of those steps (TOL relative)
resumed() {
  python3 - "$@" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])][3:]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [x["step"] for x in b] == [4, 5, 6], b
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= float(sys.argv[3]) * x["loss"], (x, y)
PY
}

seed=$((RANDOM * 32768 + RANDOM))
run=(train --model mixtral-tiny --data builtin --seq 32 --steps 6 --lr 3e-3 --warmup 2 --eval-every 3
     --eval-batches 2 --ckpt-every 3 --keep 0 --device cpu --seed $seed --batch 2)
echo "seed $seed"

"$dw" launch -n 2 -- "${run[@]}" --out "$tmp/dp" >/dev/null 2>"$tmp/err1"
check "launch -n 2, --ep 1 (data parallel)" 0 $?
"$dw" launch -n 2 -- "${run[@]}" --ep 2 --sample-every 3 --sample-tokens 8 --out "$tmp/ep" >"$tmp/out2" 2>"$tmp/err2"
check "launch -n 2 --ep 2, with samples" 0 $?
has "  ... each rank runs its half of the experts" "$tmp/err2" \
  "[deepwell info rank 0/2] expert parallel: groups of 2 ranks, rank 0 runs experts 0-1 of 4 in 2 MoE layers" \
  "[deepwell info rank 1/2] expert parallel: groups of 2 ranks, rank 1 runs experts 2-3 of 4 in 2 MoE layers"
[ -s "$tmp/out2" ] && ok "  ... rank 0 sampled (the others did not wait for it forever)" || bad "  ... no sample printed"
mpirun -np 2 "$dw" "${run[@]}" --ep 2 --out "$tmp/mpi" >/dev/null 2>"$tmp/err3"
check "mpirun -np 2 --ep 2" 0 $?
"$dw" launch -n 4 -- "${run[@]}" --global-batch 16 --out "$tmp/dp4" >/dev/null 2>"$tmp/err4"
check "launch -n 4, --ep 1, 2 micro-batches per step" 0 $?
"$dw" launch -n 4 -- "${run[@]}" --global-batch 16 --ep 2 --out "$tmp/ep4" >/dev/null 2>"$tmp/err5"
check "launch -n 4 --ep 2 (two groups: each expert on two ranks)" 0 $?
has "  ... rank 3 runs experts 2-3, as rank 1 does" "$tmp/err5" "rank 3 runs experts 2-3 of 4"
# --ep 4 with buffers for 2 x a rank's own rows (DW_EP_CAPACITY=2), half the group's: the expert ops
# run on those rows, not the group's (moe-e64 --ep 4 on 4 H100s wrote past them, session 21)
DW_EP_CAPACITY=2 "$dw" launch -n 4 -- "${run[@]}" --global-batch 16 --ep 4 --out "$tmp/ep44" >/dev/null 2>"$tmp/err7"
check "launch -n 4 --ep 4 (one expert per rank, buffers for 2 x its own rows)" 0 $?
has "  ... sized below the group's rows" "$tmp/err7" "rank 3 runs experts 3-3 of 4" "for up to 2.00 x its own rows"

# selective recompute with the MoE outputs kept (DW_MOE_REMAT=0): only the norms run again, on every rank
DW_MOE_REMAT=0 "$dw" launch -n 2 -- "${run[@]}" --ep 2 --recompute selective --out "$tmp/eps" >/dev/null 2>"$tmp/err8"
check "launch -n 2 --ep 2 --recompute selective" 0 $?

python3 - "$tmp" <<'PY' && ok "--ep 2 = --ep 1 (losses, norms 1e-6); mpirun = launch exactly; 4 ranks too; selective recompute exactly" || bad "losses"
import json, sys
t = sys.argv[1]
m = {k: [json.loads(l) for l in open(f"{t}/{k}/metrics.jsonl")] for k in ("dp", "ep", "mpi", "dp4", "ep4", "ep44", "eps")}
assert all(len(v) == 6 for v in m.values()), {k: len(v) for k, v in m.items()}  # rank 0 alone writes
def close(a, b, tol):
    for x, y in zip(a, b):
        for key in ("loss", "val_loss", "grad_norm", "moe_aux_loss"):
            assert (key in x) == (key in y), (key, x, y)
            if key in x:
                assert abs(x[key] - y[key]) <= tol * abs(x[key]), (key, x, y)
def worst(a, b, key):
    return max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b) if key in x)
print("measured --ep 2 vs --ep 1, 2 ranks: loss %.1e, grad_norm %.1e relative; 4 ranks: loss %.1e, grad_norm %.1e"
      % (worst(m["dp"], m["ep"], "loss"), worst(m["dp"], m["ep"], "grad_norm"), worst(m["dp4"], m["ep4"], "loss"),
         worst(m["dp4"], m["ep4"], "grad_norm")))
close(m["dp"], m["ep"], 1e-6)
close(m["dp4"], m["ep4"], 1e-6)
close(m["dp4"], m["ep44"], 1e-6)
assert [(x["loss"], x["grad_norm"]) for x in m["ep"]] == [(x["loss"], x["grad_norm"]) for x in m["mpi"]], (m["ep"], m["mpi"])
assert [(x["loss"], x["grad_norm"]) for x in m["ep"]] == [(x["loss"], x["grad_norm"]) for x in m["eps"]], (m["ep"], m["eps"])
assert sum("val_loss" in x for x in m["ep"]) == 2
assert m["dp"][0]["loss"] > m["dp"][-1]["loss"]  # it trains
PY

# with ZeRO-1 and ZeRO-2 (the sharded stages reduce the whole gradient pool, experts included)
for z in 1 2; do
  "$dw" launch -n 2 -- "${run[@]}" --ep 2 --zero $z --eval-every 0 --ckpt-every 0 --out "$tmp/z$z" >/dev/null 2>"$tmp/err"
  check "--ep 2 --zero $z" 0 $?
done
python3 - "$tmp" <<'PY' && ok "  ... both give --ep 2's losses and norms (1e-6)" || bad "  ... --ep 2 with ZeRO differs"
import json, sys
t = sys.argv[1]
a = [json.loads(l) for l in open(f"{t}/ep/metrics.jsonl")]
for z in ("z1", "z2"):
    b = [json.loads(l) for l in open(f"{t}/{z}/metrics.jsonl")]
    assert len(b) == 6
    for x, y in zip(a, b):
        for k in ("loss", "grad_norm"):
            assert abs(x[k] - y[k]) <= 1e-6 * abs(x[k]), (z, k, x, y)
PY

# ZeRO-0 reduces each rank's expert gradients only among the ranks holding the same experts and steps
# only its own experts and the dense parameters (the rest comes from their owners at a checkpoint);
# ZeRO-1 reduces by cells (the dense floats over every rank, each expert group's over its holders:
# src/train/dp_ep_zero.h) and steps only its cells. Without clipping (whose global norm the two sum
# in other orders) every element's AdamW is the same arithmetic on the same gradient (tcp adds in
# rank order for both): the same losses and checkpoint bytes, on 2 ranks (each
# rank alone with its experts) and on 4 (two ranks per expert, 2 micro-batches per step)
for n in 2 4; do
  gb=$((n == 4 ? 16 : 4))
  "$dw" launch -n $n -- "${run[@]}" --ep 2 --clip 0 --global-batch $gb --eval-every 0 --ckpt-every 3 --out "$tmp/l$n" \
    >/dev/null 2>"$tmp/errl$n"
  check "--ep 2 on $n ranks, ZeRO-0: experts reduced among their holders" 0 $?
  "$dw" launch -n $n -- "${run[@]}" --ep 2 --clip 0 --global-batch $gb --eval-every 0 --ckpt-every 3 --zero 1 \
    --out "$tmp/w$n" >/dev/null 2>&1
  check "  ... and ZeRO-1, which reduces by cells" 0 $?
  has "  ... as each rank says" "$tmp/errl$n" "reduced among the $((n / 2)) rank" "the dense parameters among all $n"
  same=1
  for c in 3 6; do
    for f in $(cd "$tmp/w$n/ckpt-$c" && ls *.safetensors); do
      cmp -s "$tmp/l$n/ckpt-$c/$f" "$tmp/w$n/ckpt-$c/$f" || same=0
    done
  done
  python3 - "$tmp/l$n/metrics.jsonl" "$tmp/w$n/metrics.jsonl" <<'PY' || same=0
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 6 and [x["loss"] for x in a] == [x["loss"] for x in b], (a, b)
PY
  [ $same = 1 ] && ok "  ... the same losses and checkpoints (steps 3 and 6), bit for bit" ||
    bad "  ... ZeRO-0's expert-local reduction differs from ZeRO-1's cells on $n ranks"
done

# experts over capacity (config.json capacity_factor 0.6: about half the assignments dropped, each
# rank's dispatch dropping its own): the same agreement
mkdir -p "$tmp/cap"
cat >"$tmp/cap/config.json" <<'JSON'
{"model_type": "mixtral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
 "max_position_embeddings": 256, "capacity_factor": 0.6}
JSON
cap=(--model "$tmp/cap" --steps 3 --eval-every 0 --ckpt-every 0)
"$dw" launch -n 2 -- "${run[@]}" "${cap[@]}" --out "$tmp/cdp" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- "${run[@]}" "${cap[@]}" --ep 2 --out "$tmp/cep" >/dev/null 2>"$tmp/err"
check "capacity factor 0.6: --ep 1 and --ep 2 on 2 ranks" 0 $?
python3 - "$tmp/cdp/metrics.jsonl" "$tmp/cep/metrics.jsonl" <<'PY' && ok "  ... the same losses, norms (1e-6) and drops" || bad "  ... --ep 2 with drops differs"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        assert abs(x[k] - y[k]) <= 1e-6 * abs(x[k]), (k, x, y)
    if "moe_dropped" in x or "moe_dropped" in y:
        assert x["moe_dropped"] == y["moe_dropped"] > 0, (x, y)
PY

# BF16 activations (2-byte rows on the wire): step 1 agrees as FP32 does (the same weights: the
# same loss bits, norms within 1e-6). Later, weights that differ in their last bits can move a
# BF16 activation across a rounding boundary (one BF16 ulp, 2^-8 relative, on that element): at
# seed 155121153 step 3's norm differed by 8.4e-6 and its loss by 5.8e-7, so 1e-4 from step 2 on.
bf=(--precision bf16 --steps 3 --eval-every 0 --ckpt-every 0)
"$dw" launch -n 2 -- "${run[@]}" "${bf[@]}" --out "$tmp/bdp" >/dev/null 2>&1 &&
  "$dw" launch -n 2 -- "${run[@]}" "${bf[@]}" --ep 2 --out "$tmp/bep" >/dev/null 2>"$tmp/err"
check "--precision bf16: --ep 1 and --ep 2 on 2 ranks" 0 $?
python3 - "$tmp/bdp/metrics.jsonl" "$tmp/bep/metrics.jsonl" <<'PY' && ok "  ... the same step-1 loss, then losses and norms within 1e-4" || bad "  ... bf16 --ep 2 differs"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3
assert a[0]["loss"] == b[0]["loss"], (a[0], b[0])
for x, y in zip(a, b):
    tol = 1e-6 if x["step"] == 1 else 1e-4
    for k in ("loss", "grad_norm"):
        assert abs(x[k] - y[k]) <= tol * abs(x[k]), (k, x, y)
PY

# the checkpoint: every expert of every layer, as --ep 1 writes them (1e-5: six AdamW steps on
# gradients that differ in their last bits)
python3 - "$tmp/dp/ckpt-6/model.safetensors" "$tmp/ep/ckpt-6/model.safetensors" "$tmp/ep/ckpt-3/model.safetensors" <<'PY' && ok "the --ep 2 checkpoint is whole, matches --ep 1's, and both ranks' experts trained" || bad "checkpoint"
import array, json, struct, sys
def load(p):  # {name: (shape, FP32 values)}
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = (v["shape"], array.array("f", b[8 + n + s:8 + n + e]))
    return out
dp, ep, ep3 = (load(p) for p in sys.argv[1:])
assert dp.keys() == ep.keys(), (sorted(dp), sorted(ep))
experts = [k for k in dp if "experts" in k]
assert experts and all(dp[k][0][0] == 4 for k in experts), [(k, dp[k][0]) for k in experts]
for k in dp:
    d = max(abs(x - y) for x, y in zip(dp[k][1], ep[k][1]))
    assert d <= 1e-5, (k, d)
for k in experts:  # rank 0's experts (0, 1) and rank 1's (2, 3) both moved since step 3
    half = len(ep[k][1]) // 2
    moved = [abs(x - y) for x, y in zip(ep3[k][1], ep[k][1])]
    assert max(moved[:half]) > 0 and max(moved[half:]) > 0, k
PY

# the 2-rank --ep 2 checkpoint resumes on 1 rank (batch 2, accumulation 2: the same windows per step)
"$dw" train --resume "$tmp/ep/ckpt-3" --out "$tmp/res" >/dev/null 2>"$tmp/err6"
check "the --ep 2 step-3 checkpoint resumes on 1 rank" 0 $?
resumed "$tmp/ep/metrics.jsonl" "$tmp/res/metrics.jsonl" 2e-6 && ok "  ... steps 4-6 as the 2 ranks ran them (2e-6)" ||
  bad "  ... resumed losses"

# and the --ep 1 checkpoint resumes with --ep 2 (--ep is no part of the resume record)
"$dw" launch -n 2 -- train --resume "$tmp/dp/ckpt-3" --ep 2 --out "$tmp/res2" >/dev/null 2>"$tmp/err7"
check "the --ep 1 step-3 checkpoint resumes with --ep 2" 0 $?
resumed "$tmp/dp/metrics.jsonl" "$tmp/res2/metrics.jsonl" 1e-6 && ok "  ... steps 4-6 as --ep 1 ran them (1e-6)" ||
  bad "  ... resumed losses"

# refusals, naming the numbers
"$dw" launch -n 2 -- "${run[@]}" --ep 4 --out "$tmp/bad1" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "--ep 4 on 2 ranks refused" || bad "--ep 4 on 2 ranks ran"
has "  ... saying why" "$tmp/err" "--ep 4: groups of 4 do not divide the job's 2 ranks"
"$dw" launch -n 3 -- "${run[@]}" --ep 3 --out "$tmp/bad2" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "--ep 3 with 4 experts refused" || bad "--ep 3 with 4 experts ran"
has "  ... saying why" "$tmp/err" "--ep 3: the model's 4 experts do not split over 3 ranks"
"$dw" launch -n 2 -- "${run[@]}" --model gpt2-tiny --ep 2 --out "$tmp/bad3" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "--ep 2 with a dense model refused" || bad "--ep 2 with gpt2-tiny ran"
has "  ... saying why" "$tmp/err" "--ep 2: the model has no mixture-of-experts layer"
"$dw" "${run[@]}" --ep 2 --out "$tmp/bad5" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "--ep 2 in a process of its own refused" || bad "--ep 2 on one rank ran"
has "  ... saying why" "$tmp/err" "--ep 2: groups of 2 do not divide the job's 1 rank "
# buffers below the routing's needs (DW_EP_CAPACITY 0.5 x a rank's own rows; routing sends each
# about its own): the step is refused naming the layer, the rows and the variable, nothing run on
DW_EP_CAPACITY=0.5 "$dw" launch -n 2 -- "${run[@]}" --ep 2 --out "$tmp/bad6" >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && ok "--ep 2 with DW_EP_CAPACITY=0.5 refused" || bad "--ep 2 with buffers for half the rows ran"
has "  ... saying why" "$tmp/err" "more than its buffers hold"
has "  ... and what to do" "$tmp/err" "needs a larger DW_EP_CAPACITY (at most 2, the --ep group)"
"$dw" "${run[@]}" --ep 0 --out "$tmp/bad4" >/dev/null 2>"$tmp/err"
check "--ep 0 refused" 2 $?
has "  ... naming the flag" "$tmp/err" "--ep"

[ "$fails" -eq 0 ] || exit 1
