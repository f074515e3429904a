#!/usr/bin/env bash
# test_sample_tokenizer.sh DEEPWELL — a run knows its tokenizer: `deepwell train` from a model
# directory with tokenizer.json (or with --tokenizer) copies it into the run and every checkpoint,
# listed in state.json; `deepwell sample RUN` then decodes with it after the model directory's copy
# is gone, and so does a checkpoint moved elsewhere alone. A changed or missing copy is refused
# naming the file; another tokenizer on --resume is refused; --tokenizer on sample that is not the
# run's is used with a warning; an unreadable or too large --tokenizer is refused, one of a kind the
# library cannot decode is recorded with a warning; a run without a tokenizer records none;
# `deepwell export` of a checkpoint writes the run's tokenizer into the export; train's own samples
# on token-id shards decode with it.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
export OMP_NUM_THREADS=1
py=/usr/bin/python3
# A byte-level BPE tokenizer.json (GPT-2's byte <-> character map; id b is byte b, so the byte data
# below is text in it) with a few merges: vocabulary 256 + merges.
tokenizer() { # tokenizer PATH MERGES...
  "$py" - "$@" <<'EOF'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
char = dict(zip(bs, map(chr, cs)))
vocab = {char[b]: b for b in range(256)}
merges = [m.split() for m in sys.argv[2:]]
for a, b in merges:
    vocab[a + b] = len(vocab)
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": bl, "post_processor": None,
           "decoder": bl, "model": {"type": "BPE", "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                                    "ignore_merges": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}},
          open(sys.argv[1], "w"))
EOF
}
mkdir -p "$tmp/model"
echo '{"model_type": "gpt2", "vocab_size": 264, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}' \
  >"$tmp/model/config.json"
tokenizer "$tmp/model/tokenizer.json" "h e" "l l" "he ll" "o Ġ"
tokenizer "$tmp/other.json" "a b"
head -c 6000 "$0" >"$tmp/text.txt"
run=(--data "$tmp/text.txt" --batch 2 --seq 32 --lr 3e-3 --steps 2 --seed 5 --device cpu --eval-every 0)

"$dw" train --model "$tmp/model" "${run[@]}" --out "$tmp/run" >/dev/null 2>"$tmp/train.err"
check "train from a model directory with tokenizer.json" 0 $?
cmp -s "$tmp/model/tokenizer.json" "$tmp/run/tokenizer.json" && ok "the run holds a copy" || bad "no copy in the run"
cmp -s "$tmp/model/tokenizer.json" "$tmp/run/ckpt-2/tokenizer.json" && ok "the checkpoint holds a copy" \
  || bad "no copy in ckpt-2"
has "state.json lists it" "$tmp/run/ckpt-2/state.json" '"tokenizer.json": {'

# token-id shards: train's own samples decode with the run's tokenizer (text, not ids)
"$py" - "$tmp" <<'EOF'
import struct, sys
toks = [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 10] * 100  # "hello world\n"
hdr = struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253))
open(f"{sys.argv[1]}/shard_0.bin", "wb").write(hdr + struct.pack("<%dH" % len(toks), *toks))
EOF
"$dw" train --model "$tmp/model" --data "$tmp/shard_0.bin" --batch 2 --seq 32 --lr 3e-3 --steps 2 --seed 5 \
  --device cpu --eval-every 0 --sample-every 2 --sample-tokens 8 --sample-prompt "hello" --out "$tmp/srun" \
  >"$tmp/srun.out" 2>"$tmp/srun.err"
check "train on token-id shards with --sample-every and a text prompt" 0 $?
grep -q "^hello" "$tmp/srun.out" && ok "the sample is decoded text" || bad "sample not text: $(head -c 200 "$tmp/srun.out")"
mv "$tmp/model/tokenizer.json" "$tmp/model.tokenizer.json" # the model directory's is gone now
"$dw" export "$tmp/run/ckpt-2" --out "$tmp/export" >/dev/null 2>"$tmp/export.err"
check "export the checkpoint (no --hf-dir)" 0 $?
cmp -s "$tmp/model.tokenizer.json" "$tmp/export/tokenizer.json" && ok "the export holds the run's tokenizer" \
  || bad "the export has no tokenizer.json"
common=(--prompt "hello world" -n 12 --temperature 0 --device cpu)
"$dw" sample "$tmp/run" "${common[@]}" >"$tmp/s.out" 2>"$tmp/s.err"
check "sample RUN" 0 $?
"$dw" sample "$tmp/run" "${common[@]}" --tokenizer "$tmp/model.tokenizer.json" >"$tmp/s2.out" 2>"$tmp/s2.err"
check "sample RUN --tokenizer (the same file)" 0 $?
cmp -s "$tmp/s.out" "$tmp/s2.out" && ok "decoded with the run's tokenizer" || bad "'$(cat "$tmp/s.out")' vs '$(cat "$tmp/s2.out")'"
grep -q warning "$tmp/s2.err" && bad "a warning for the same tokenizer: $(cat "$tmp/s2.err")" || ok "no warning for the same file"
case "$(head -c 11 "$tmp/s.out")" in "hello world") ok "text, not ids";; *) bad "not text: $(head -c 80 "$tmp/s.out")";; esac
"$dw" sample "$tmp/run" "${common[@]}" --tokenizer ids --prompt "104 101 108 108 111" >"$tmp/ids.out" 2>/dev/null
[ "$(wc -w <"$tmp/ids.out")" = 17 ] && ok "--tokenizer ids still gives ids" || bad "ids: $(cat "$tmp/ids.out")"

cp -r "$tmp/run/ckpt-2" "$tmp/alone"
"$dw" sample "$tmp/alone" "${common[@]}" >"$tmp/a.out" 2>/dev/null
check "sample a checkpoint moved elsewhere alone" 0 $?
cmp -s "$tmp/s.out" "$tmp/a.out" && ok "decoded alike" || bad "'$(cat "$tmp/a.out")'"

"$dw" sample "$tmp/run" "${common[@]}" --tokenizer "$tmp/other.json" >/dev/null 2>"$tmp/w.err"
check "sample with another tokenizer" 0 $?
has "the other tokenizer is used with a warning" "$tmp/w.err" "warning: --tokenizer $tmp/other.json is not" \
  "$tmp/run/ckpt-2/tokenizer.json"

echo ' ' >>"$tmp/alone/tokenizer.json"
"$dw" sample "$tmp/alone" "${common[@]}" >/dev/null 2>"$tmp/c.err"
rc=$?
[ "$rc" != 0 ] && ok "a changed tokenizer copy is refused" || bad "a changed copy was accepted"
has "the refusal names it" "$tmp/c.err" "$tmp/alone/tokenizer.json" "state.json records"
rm "$tmp/alone/tokenizer.json"
"$dw" sample "$tmp/alone" "${common[@]}" >/dev/null 2>"$tmp/m.err"
rc=$?
[ "$rc" != 0 ] && ok "a missing tokenizer copy is refused" || bad "a missing copy was accepted"
has "the refusal names it" "$tmp/m.err" "$tmp/alone/tokenizer.json" "missing"

"$dw" train --resume "$tmp/run" --steps 3 --tokenizer "$tmp/other.json" >/dev/null 2>"$tmp/r.err"
rc=$?
[ "$rc" != 0 ] && ok "another tokenizer on --resume is refused" || bad "another tokenizer on --resume accepted"
has "the refusal says why" "$tmp/r.err" "$tmp/run/tokenizer.json" "another tokenizer"
"$dw" train --resume "$tmp/run" --steps 3 >/dev/null 2>&1
check "resume keeps the run's tokenizer" 0 $?
cmp -s "$tmp/model.tokenizer.json" "$tmp/run/ckpt-3/tokenizer.json" && ok "ckpt-3 holds it too" || bad "ckpt-3 lacks it"

mkdir -p "$tmp/plain"
cp "$tmp/model/config.json" "$tmp/plain/"
"$dw" train --model "$tmp/plain" "${run[@]}" --out "$tmp/given" --tokenizer "$tmp/other.json" >/dev/null 2>&1
check "train --tokenizer FILE" 0 $?
cmp -s "$tmp/other.json" "$tmp/given/ckpt-2/tokenizer.json" && ok "the given tokenizer is recorded" || bad "not recorded"
"$dw" train --model "$tmp/plain" "${run[@]}" --out "$tmp/none" >/dev/null 2>&1
check "train without a tokenizer" 0 $?
[ ! -e "$tmp/none/tokenizer.json" ] && ! grep -q tokenizer.json "$tmp/none/ckpt-2/state.json" \
  && ok "none recorded" || bad "a run without a tokenizer recorded one"
"$dw" train --model "$tmp/plain" "${run[@]}" --out "$tmp/bad" --tokenizer "$tmp/nope.json" >/dev/null 2>"$tmp/b.err"
rc=$?
[ "$rc" != 0 ] && ok "a missing --tokenizer is refused" || bad "a missing --tokenizer was accepted"
has "the refusal names it" "$tmp/b.err" "$tmp/nope.json"
tokenizer "$tmp/big.json" "a b" "c d" "e f" "g h" "i j" "k l" "m n" "o p" "q r" # 265 ids
"$dw" train --model "$tmp/plain" "${run[@]}" --out "$tmp/big" --tokenizer "$tmp/big.json" >/dev/null 2>"$tmp/v.err"
check "a tokenizer beyond the model's vocabulary is refused" 2 $?
has "the refusal says so" "$tmp/v.err" "ids reach 265" "vocabulary of 264"
echo '{"model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}}' >"$tmp/wl.json"
"$dw" train --model "$tmp/plain" "${run[@]}" --out "$tmp/wl" --tokenizer "$tmp/wl.json" >/dev/null 2>"$tmp/wl.err"
check "a --tokenizer the library cannot decode" 0 $?
has "is recorded with a warning" "$tmp/wl.err" "warning:" "WordLevel"
cmp -s "$tmp/wl.json" "$tmp/wl/ckpt-2/tokenizer.json" && ok "recorded" || bad "not recorded"

echo "$fails failed"
[ "$fails" = 0 ]
