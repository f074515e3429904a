#!/usr/bin/env bash
# test_quantize.sh DEEPWELL — `deepwell quantize` and `deepwell quant-report` end to end: a small
# checkpoint written byte by byte with numpy (fresh random values each run), every recipe's output
# layout (names, dtypes, shapes, metadata, copied tensors), scales and dequantised values against
# an independent numpy implementation of shared/FORMATS.md (every recipe; MX with rceil and floor),
# the report's figures, and bad input (exit 2, file named, OUT left alone, no temporaries).
set -u
dw=$1
fails=0
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1 (exit $3, expected $2)"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py=""
for p in python3 /usr/bin/python3; do "$p" -c 'import numpy' 2>/dev/null && { py=$p; break; }; done
if [ -z "$py" ]; then echo "FAIL: no python3 with numpy (scripts/deps.sh test installs python3-numpy)"; echo "1 failed"; exit 1; fi
seed=${DW_TEST_SEED:-$RANDOM$RANDOM}
echo "test seed: DW_TEST_SEED=$seed"

# ---- the independent oracle: safetensors by hand and FORMATS.md in numpy ---------------------
cat >"$tmp/oracle.py" <<'PY'
import json, struct, sys
import numpy as np
f32 = np.float32

def st_write(path, tensors, meta=None):
    """tensors: list of (name, dtype string, numpy array of the right raw type)"""
    hdr, blobs, off = {}, [], 0
    if meta: hdr["__metadata__"] = meta
    for name, dt, a in tensors:
        b = np.ascontiguousarray(a).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

RAW = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U8": np.uint8, "I64": np.int64,
       "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F64": np.float64}
def st_read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n]); meta = hdr.pop("__metadata__", {})
    data = b[8 + n:]; out = {}
    covered = 0
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"]):
        s, t = e["data_offsets"]; assert s == covered, (name, s, covered); covered = t
        a = np.frombuffer(data[s:t], dtype=RAW[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], a)
    assert covered == len(data)
    return out, meta

def to_f32(dt, a):
    if dt == "BF16": return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)

# element value tables (non-negative codes in increasing order)
def e4m3_values():
    v = []
    for c in range(0x7F):  # 0x7F is NaN
        e, m = c >> 3, c & 7
        v.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0**(e - 7))
    return np.array(v)
def e5m2_values():
    v = []
    for c in range(0x7C):  # 0x7C.. are Inf/NaN
        e, m = c >> 2, c & 3
        v.append(m / 4 * 2.0**-14 if e == 0 else (1 + m / 4) * 2.0**(e - 15))
    return np.array(v)
E4M3, E5M2 = e4m3_values(), e5m2_values()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])

def rne(v, table):
    """round |v| to the nearest table entry (ties to the even code), saturating; keep the sign"""
    a = np.minimum(np.abs(v.astype(np.float64)), table[-1])
    hi = np.clip(np.searchsorted(table, a, side="left"), 1, len(table) - 1)
    lo = hi - 1
    dlo, dhi = a - table[lo], table[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(v) * table[pick], pick

def decode8(codes, table, nan_from):
    mag = codes & 0x7F
    v = table[np.minimum(mag, len(table) - 1)]
    return np.where(codes & 0x80, -v, v)

def fp8_scaled(x, s):  # code = E4M3(x / s); dequantised = decode * s, in FP32
    q, _ = rne((x / s).astype(f32), E4M3)
    return (q.astype(f32) * s).astype(f32)

def mx_exp(amax, maxnorm, emax, rounding):
    with np.errstate(divide="ignore"):
        if rounding == "rceil":
            r = (amax / f32(maxnorm)).astype(f32)
            m, k = np.frexp(r.astype(np.float64))
            e = np.where(m == 0.5, k - 1, k)
        else:
            m, k = np.frexp(amax.astype(np.float64))
            e = (k - 1) - emax
    return np.clip(e, -127, 127)

def oracle(recipe, x, rounding="rceil"):
    """dequantised values and scales (as stored) for x [R, C] float32"""
    R, C = x.shape
    if recipe == "fp8_tensor":
        a = f32(np.abs(x).max()); s = f32(a / f32(448)) if a > 0 else f32(1)
        return fp8_scaled(x, s), np.array(s, dtype=f32)
    if recipe == "fp8_row":
        a = np.abs(x).max(axis=1).astype(f32); s = np.where(a > 0, (a / f32(448)).astype(f32), f32(1)).astype(f32)
        return fp8_scaled(x, s[:, None]), s
    if recipe == "fp8_block":
        xb = x.reshape(R, C // 128, 128)
        a = np.abs(xb).max(axis=2).astype(f32); s = np.where(a > 0, (a / f32(448)).astype(f32), f32(1)).astype(f32)
        return fp8_scaled(xb, s[:, :, None]).reshape(R, C), s
    if recipe == "fp8_block2d":
        xb = x.reshape(R // 128, 128, C // 128, 128)
        a = np.abs(xb).max(axis=(1, 3)).astype(f32); s = np.where(a > 0, (a / f32(448)).astype(f32), f32(1)).astype(f32)
        return fp8_scaled(xb, s[:, None, :, None]).reshape(R, C), s
    if recipe in ("mxfp8", "mxfp4", "mxfp8_e5m2"):
        table, maxnorm, emax = {"mxfp8": (E4M3, 448, 8), "mxfp4": (E2M1, 6, 2), "mxfp8_e5m2": (E5M2, 57344, 15)}[recipe]
        xb = x.reshape(R, C // 32, 32)
        a = np.abs(xb).max(axis=2).astype(f32)
        e = mx_exp(a, maxnorm, emax, rounding)
        e = np.where(a > 0, e, -127)
        p2 = np.ldexp(np.float64(1), e).astype(f32)  # 2^e exact in FP32 (2^-127 subnormal)
        q, _ = rne((xb / p2[:, :, None]).astype(f32), table)
        y = (q * p2[:, :, None].astype(np.float64)).astype(f32)
        return y.reshape(R, C), (e + 127).astype(np.uint8)
    if recipe == "nvfp4":
        at = f32(np.abs(x).max()); st = f32(at / f32(2688)) if at > 0 else f32(1)
        xb = x.reshape(R, C // 16, 16)
        ab = np.abs(xb).max(axis=2).astype(f32)
        bval, bcode = rne((ab / f32(f32(6) * st)).astype(f32), E4M3)
        scale = (bval.astype(f32) * st).astype(f32)
        safe = np.where(scale == 0, f32(1), scale)
        q, _ = rne((xb / safe[:, :, None]).astype(f32), E2M1)
        q = np.where(scale[:, :, None] == 0, 0, q)
        y = (q.astype(f32) * bval.astype(f32)[:, :, None] * st).astype(f32)
        return y.reshape(R, C), (bcode.astype(np.uint8), st)
    raise ValueError(recipe)
PY

# ---- the checkpoint ---------------------------------------------------------------------------
"$py" - "$tmp" "$seed" <<'PY' || { echo "FAIL: cannot write the checkpoint"; exit 1; }
import sys, numpy as np
sys.path.insert(0, sys.argv[1]); from oracle import *
rng = np.random.default_rng(int(sys.argv[2]))
w = (rng.standard_normal((256, 256)) * np.exp2(rng.integers(-8, 8, (256, 1)))).astype(np.float32)
w[3, :] = 0                                # a zero row: zero blocks everywhere
w[5, 7] = 1e-30                            # flushed to zero by every recipe
w[6, :64] = rng.uniform(-1, 1, 64) * 20    # blocks whose amax / max_normal is a power of two:
w[6, 0] = 56                               #   56/448 = 56/57344 * 2^7 = 1/8 (E4M3, E5M2)
w[6, 32] = -24                             #   24/6 = 4 (E2M1): rceil's exact-power case
bf = (rng.standard_normal((4, 64)).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
h = (rng.standard_normal(128) * 3).astype(np.float16)
tensors = [
    ("model.w", "F32", w),
    ("model.bf", "BF16", (bf.view(np.uint32) >> 16).astype(np.uint16)),
    ("model.h", "F16", h),
    ("model.ids", "I64", rng.integers(0, 1000, 5)),
    ("model.odd", "F32", rng.standard_normal((3, 5)).astype(np.float32)),
    ("model.scalar", "F32", np.array(2.5, dtype=np.float32)),
    ("model.cube", "F32", rng.standard_normal((2, 2, 32)).astype(np.float32)),
]
st_write(sys.argv[1] + "/in.safetensors", tensors, {"format": "pt"})
PY

# ---- every recipe: layout, metadata, copies, values --------------------------------------------
for recipe in fp8_tensor fp8_row fp8_block fp8_block2d mxfp8 mxfp8_e5m2 mxfp4 nvfp4; do
  for rounding in rceil floor; do
    flags=""
    case $recipe in mx*) flags="--scale-rounding $rounding" ;; *) [ $rounding = floor ] && continue ;; esac
    out="$tmp/out-$recipe-$rounding.safetensors"
    "$dw" quantize --recipe $recipe $flags "$tmp/in.safetensors" "$out" >"$tmp/stdout" 2>"$tmp/stderr"
    check "quantize --recipe $recipe $flags" 0 $?
    "$py" - "$tmp" "$recipe" "$rounding" "$out" <<'PY' || { fails=$((fails + 1)); cat "$tmp/stderr"; }
import sys, numpy as np
sys.path.insert(0, sys.argv[1]); from oracle import *
tmp, recipe, rounding, out = sys.argv[1:5]
inp, _ = st_read(tmp + "/in.safetensors")
got, meta = st_read(out)
stderr = open(tmp + "/stderr").read(); stdout = open(tmp + "/stdout").read()
assert meta == {"format": "pt", "deepwell.recipe": recipe, "deepwell.scale_rounding": rounding,
                "deepwell.pow2": "false"}, meta
block = {"fp8_tensor": (1, 1), "fp8_row": (1, 1), "fp8_block": (1, 128), "fp8_block2d": (128, 128),
         "mxfp8": (1, 32), "mxfp8_e5m2": (1, 32), "mxfp4": (1, 32), "nvfp4": (1, 16)}[recipe]
names = set()
for name, (dt, a) in inp.items():
    view = a.shape if a.ndim == 2 else (1, a.shape[0]) if a.ndim == 1 else None
    ok = dt in ("F32", "BF16", "F16") and view and view[0] % block[0] == 0 and view[1] % block[1] == 0
    if not ok:  # copied unchanged and named
        assert got[name][0] == dt and got[name][1].tobytes() == a.tobytes(), name
        assert name in stderr, (name, stderr)
        names.add(name); continue
    R, C = view
    x = to_f32(dt, a).reshape(R, C)
    fp4 = recipe in ("mxfp4", "nvfp4")
    cdt = "U8" if fp4 else "F8_E5M2" if recipe == "mxfp8_e5m2" else "F8_E4M3"
    cdt_got, codes = got[name]
    assert cdt_got == cdt and codes.shape == ((R, C // 2) if fp4 else (R, C)), (name, cdt_got, codes.shape)
    sdt, scales = got[name + ".scale"]
    want_sshape = {"fp8_tensor": (), "fp8_row": (R,), "fp8_block": (R, C // 128),
                   "fp8_block2d": (R // 128, C // 128)}.get(recipe, (R, C // block[1]))
    assert scales.shape == want_sshape, (name, scales.shape, want_sshape)
    assert sdt == ("F32" if recipe.startswith("fp8") else "U8"), sdt
    names |= {name, name + ".scale"}
    if recipe == "nvfp4":
        assert got[name + ".scale_2"][0] == "F32" and got[name + ".scale_2"][1].shape == ()
        names.add(name + ".scale_2")
    # dequantise what was written, from the codes' definitions
    if fp4:
        nib = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(R, C)  # even column: low nibble
        vals = E2M1[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    else:
        vals = decode8(codes, E5M2 if recipe == "mxfp8_e5m2" else E4M3, None)
    if recipe.startswith("fp8"):
        s = scales.astype(np.float32)
        sfull = {"fp8_tensor": lambda: np.full((R, C), s), "fp8_row": lambda: np.repeat(s[:, None], C, 1),
                 "fp8_block": lambda: np.repeat(s, 128, 1),
                 "fp8_block2d": lambda: np.repeat(np.repeat(s, 128, 0), 128, 1)}[recipe]()
        y = (vals.astype(np.float32) * sfull).astype(np.float32)
    elif recipe == "nvfp4":
        st = got[name + ".scale_2"][1].astype(np.float32)
        b = np.repeat(E4M3[scales], 16, 1).astype(np.float32)
        y = (vals.astype(np.float32) * b * st).astype(np.float32)
    else:
        y = (vals * np.repeat(np.ldexp(1.0, scales.astype(int) - 127), 32, 1)).astype(np.float32)
    want, wscales = oracle(recipe, x, rounding)
    if recipe == "nvfp4":
        assert np.array_equal(wscales[0], scales), (name, "block scales")
        assert got[name + ".scale_2"][1] == wscales[1], (name, "tensor scale")
    elif recipe.startswith("fp8"):
        assert np.array_equal(wscales.reshape(scales.shape), scales), (name, "scales")
    else:
        assert np.array_equal(wscales, scales), (name, "scales", np.argwhere(wscales != scales)[:3])
    bad = np.argwhere(want != y)
    assert len(bad) == 0, (name, recipe, rounding, [(tuple(i), x[tuple(i)], want[tuple(i)], y[tuple(i)]) for i in bad[:3]])
assert names == set(got), (names ^ set(got))
assert "quantised" in stdout, stdout
print(f"ok: {recipe} {rounding}: layout, metadata, copies and values match the numpy oracle")
PY
  done
done
ls "$tmp" | grep -q '\.tmp\.' && { echo "FAIL: temporaries left behind"; fails=$((fails + 1)); }

# pow2 (FP8 recipes): every FP32 scale a power of two, values within the scale's reach
"$dw" quantize --recipe fp8_block --pow2 "$tmp/in.safetensors" "$tmp/p2.safetensors" 2>/dev/null
check "quantize fp8_block --pow2" 0 $?
"$py" - "$tmp" <<'PY' || fails=$((fails + 1))
import sys, numpy as np
sys.path.insert(0, sys.argv[1]); from oracle import *
got, meta = st_read(sys.argv[1] + "/p2.safetensors")
assert meta["deepwell.pow2"] == "true"
s = got["model.w.scale"][1]
m, e = np.frexp(s)
assert np.all(m == 0.5), s[m != 0.5][:4]
x = got["model.w"][1]
print("ok: --pow2 scales are powers of two")
PY

# ---- quant-report --------------------------------------------------------------------------------
"$dw" quant-report "$tmp/in.safetensors" --recipes mxfp8,fp8_block,nvfp4 --json >"$tmp/r.json" 2>"$tmp/err"
check "quant-report --json" 0 $?
"$py" - "$tmp" <<'PY' || fails=$((fails + 1))
import json, sys, numpy as np
sys.path.insert(0, sys.argv[1]); from oracle import *
r = json.load(open(sys.argv[1] + "/r.json"))
inp, _ = st_read(sys.argv[1] + "/in.safetensors")
assert r["recipes"] == ["mxfp8", "fp8_block", "nvfp4"], r["recipes"]
by = {t["name"]: t for t in r["tensors"]}
tot = {}
for recipe in r["recipes"]:
    for name in ("model.w", "model.h"):
        dt, a = inp[name]
        x = to_f32(dt, a).reshape(-1, a.shape[-1]).astype(np.float32)
        y, _ = oracle(recipe, x)
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        sx, se = (x64**2).sum(), ((x64 - y64)**2).sum()
        res = by[name]["results"][recipe]
        assert res["elements"] == x.size
        assert abs(res["sqnr_db"] - 10 * np.log10(sx / se)) < 1e-6, (name, recipe, res)
        assert abs(res["rel_err"] - np.sqrt(se / sx)) < 1e-9 * max(1, np.sqrt(se / sx))
        assert res["max_abs_err"] == np.abs(x64 - y64).max(), (res, np.abs(x64 - y64).max())
        flushed = ((x != 0) & (y == 0)).sum()
        assert abs(res["flushed_pct"] - 100 * flushed / x.size) < 1e-9, (name, recipe, res, flushed)
        assert flushed >= 1 if name == "model.w" else True  # the 1e-30 element
        t = tot.setdefault(recipe, [0, 0.0, 0.0]); t[0] += x.size; t[1] += sx; t[2] += se
    assert "skipped" in by["model.ids"]["results"][recipe]
summ = r["summary"]
for recipe, (n, sx, se) in tot.items():
    if recipe != "fp8_block":  # model.bf [4, 64] also counts for mxfp8 and nvfp4
        continue
    assert summ[recipe]["elements"] == n and abs(summ[recipe]["sqnr_db"] - 10 * np.log10(sx / se)) < 1e-6
assert summ["mxfp8"]["tensors"] == 3 and summ["fp8_block"]["tensors"] == 2, summ
assert summ["mxfp8"]["saturated_pct"] == 0  # rceil never clips
print("ok: quant-report figures match the numpy oracle")
PY
"$dw" quant-report "$tmp/in.safetensors" >"$tmp/r.txt" 2>&1; check "quant-report (text)" 0 $?
for r in fp8_tensor fp8_row fp8_block fp8_block2d mxfp8 mxfp8_e5m2 mxfp4 nvfp4; do
  grep -q "^$r " "$tmp/r.txt" || { echo "FAIL: no summary line for $r"; fails=$((fails + 1)); }
done
grep -q "model.ids .*not quantised: not floating-point" "$tmp/r.txt" || { echo "FAIL: report lacks the skipped tensor"; fails=$((fails + 1)); }
# floor rounding clips in MX recipes: the report shows saturation
"$dw" quant-report "$tmp/in.safetensors" --recipes mxfp4 --scale-rounding floor --json >"$tmp/f.json"; check "quant-report floor" 0 $?
"$py" -c "import json,sys; s=json.load(open('$tmp/f.json'))['summary']['mxfp4']; assert s['saturated_pct'] > 0, s" ||
  { echo "FAIL: floor rounding shows no saturation"; fails=$((fails + 1)); }

# ---- bad input: exit 2, the file named, OUT untouched, nothing left behind ------------------------
echo keep >"$tmp/out.safetensors"
"$dw" quantize --recipe mxfp8 "$tmp/missing.safetensors" "$tmp/out.safetensors" 2>"$tmp/err"; check "missing input exits 3 (I/O)" 3 $?
grep -q "missing.safetensors" "$tmp/err" || { echo "FAIL: message does not name the file"; fails=$((fails + 1)); }
head -c 100 "$tmp/in.safetensors" >"$tmp/corrupt.safetensors"
"$dw" quantize --recipe mxfp8 "$tmp/corrupt.safetensors" "$tmp/out.safetensors" 2>"$tmp/err"; check "corrupt input exits 2" 2 $?
grep -q "corrupt.safetensors" "$tmp/err" || { echo "FAIL: corrupt: message does not name the file"; cat "$tmp/err"; fails=$((fails + 1)); }
"$dw" quantize --recipe mxfp8 "$tmp/out-mxfp8-rceil.safetensors" "$tmp/out.safetensors" 2>"$tmp/err"; check "already quantised input exits 2" 2 $?
grep -q "already quantised" "$tmp/err" || { echo "FAIL: re-quantising not refused"; fails=$((fails + 1)); }
"$dw" quantize --recipe mxfp9 "$tmp/in.safetensors" "$tmp/out.safetensors" 2>"$tmp/err"; check "unknown recipe exits 2" 2 $?
grep -q "mxfp9" "$tmp/err" || { echo "FAIL: message does not name the recipe"; fails=$((fails + 1)); }
"$dw" quantize --recipe bf16 "$tmp/in.safetensors" "$tmp/out.safetensors" 2>/dev/null; check "bf16 is not a quantize recipe" 2 $?
"$dw" quantize --recipe mxfp8 --bogus "$tmp/in.safetensors" "$tmp/out.safetensors" 2>/dev/null; check "bad flag exits 2" 2 $?
"$dw" quantize --recipe mxfp8 --scale-rounding up "$tmp/in.safetensors" "$tmp/out.safetensors" 2>/dev/null; check "bad rounding exits 2" 2 $?
"$dw" quantize --recipe fp8_block --scale-rounding floor "$tmp/in.safetensors" "$tmp/out.safetensors" 2>/dev/null; check "rounding on an FP8 recipe exits 2" 2 $?
"$dw" quantize --recipe mxfp8 --pow2 "$tmp/in.safetensors" "$tmp/out.safetensors" 2>/dev/null; check "--pow2 on an MX recipe exits 2" 2 $?
"$dw" quantize --recipe mxfp8 "$tmp/in.safetensors" 2>/dev/null; check "missing OUT exits 2" 2 $?
"$dw" quantize "$tmp/in.safetensors" "$tmp/out.safetensors" 2>/dev/null; check "missing --recipe exits 2" 2 $?
"$dw" quantize --recipe mxfp8 "$tmp/in.safetensors" "$tmp/nodir/out.safetensors" 2>"$tmp/err"; check "unwritable OUT exits 3 (I/O)" 3 $?
grep -q "nodir/out.safetensors" "$tmp/err" || { echo "FAIL: message does not name OUT"; fails=$((fails + 1)); }
[ "$(cat "$tmp/out.safetensors")" = keep ] || { echo "FAIL: a failed run clobbered OUT"; fails=$((fails + 1)); }
ls "$tmp" | grep -q '\.tmp\.' && { echo "FAIL: temporaries left behind"; fails=$((fails + 1)); }
"$dw" quant-report "$tmp/missing.safetensors" 2>"$tmp/err"; check "report: missing file exits 3 (I/O)" 3 $?
grep -q "missing.safetensors" "$tmp/err" || { echo "FAIL: report: message does not name the file"; fails=$((fails + 1)); }
"$dw" quant-report "$tmp/corrupt.safetensors" 2>"$tmp/err"; check "report: corrupt file exits 2" 2 $?
"$dw" quant-report "$tmp/in.safetensors" --recipes mxfp8,nope 2>"$tmp/err"; check "report: unknown recipe exits 2" 2 $?
grep -q "nope" "$tmp/err" || { echo "FAIL: report: message does not name the recipe"; fails=$((fails + 1)); }
"$dw" quant-report --bogus "$tmp/in.safetensors" 2>/dev/null; check "report: bad flag exits 2" 2 $?
"$dw" quantize --help | grep -q -- "--scale-rounding"; check "quantize --help" 0 $?
"$dw" quant-report --help | grep -q -- "--recipes"; check "quant-report --help" 0 $?

echo "$fails failed"
[ "$fails" -eq 0 ]
