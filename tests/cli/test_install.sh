#!/usr/bin/env bash
# test_install.sh DEEPWELL — `cmake --install BUILD --prefix DIR` (the build holding DEEPWELL) puts
# the CLI, libdeepwell (shared and static), include/deepwell.h, deepwell.pc and the CMake package
# files under DIR; a C program builds and runs against them through pkg-config (the shared
# library) and through find_package(deepwell) (the static one) (issue 32, finding 9).
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
build=$(cd "$(dirname "$dw")" && pwd)
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/log" 2>&1; check "cmake --install --prefix" 0 $?
libdir=$(dirname "$(find "$prefix" -name libdeepwell.a | head -1)")
for f in bin/deepwell include/deepwell.h; do
  [ -f "$prefix/$f" ] && ok "  ... $f" || bad "  ... $f missing: $(cat "$tmp/log")"
done
for f in libdeepwell.a libdeepwell.so pkgconfig/deepwell.pc cmake/deepwell/deepwellConfig.cmake \
         cmake/deepwell/deepwellConfigVersion.cmake; do
  [ -e "$libdir/$f" ] && ok "  ... ${libdir#"$prefix"/}/$f" || bad "  ... $f missing under ${libdir#"$prefix"/}"
done
"$prefix/bin/deepwell" --version >"$tmp/v"; check "the installed deepwell runs" 0 $?

cat >"$tmp/hello.c" <<'C'
#include <deepwell.h>
#include <stdio.h>
int main(void) {
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_ctx *ctx = NULL;
    dw_status s = dw_ctx_create(&o, &ctx);
    printf("deepwell %s: %s\n", dw_version_string(), dw_status_name(s));
    dw_ctx_free(ctx);
    return s == DW_OK ? 0 : 1;
}
C
san=""
grep -q '^DW_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" && san="-fsanitize=address,undefined"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pc() { # pkg-config ARGS deepwell; where pkg-config is not installed, the same few queries by hand
  if command -v pkg-config >/dev/null; then pkg-config "$@"; return; fi
  python3 - "$PKG_CONFIG_PATH/deepwell.pc" "$1" <<'PY'
import os, re, sys
path, q = sys.argv[1], sys.argv[2]
v, f = {"pcfiledir": os.path.dirname(path)}, {}
sub = lambda s: re.sub(r"\$\{(\w+)\}", lambda m: v[m.group(1)], s).strip()
for line in open(path):
    m = re.match(r"(\w[\w.]*)\s*([=:])(.*)", line)
    if m: (v if m.group(2) == "=" else f)[m.group(1)] = sub(m.group(3))
print({"--cflags": f.get("Cflags", ""), "--libs": f.get("Libs", ""), "--modversion": f["Version"],
       "--exists": ""}.get(q) if not q.startswith("--variable=") else v[q.split("=", 1)[1]])
PY
}
pc --exists deepwell; check "pkg-config finds deepwell.pc" 0 $?
read -ra cflags <<<"$(pc --cflags deepwell)"
read -ra libs <<<"$(pc --libs deepwell)"
[ "$(pc --variable=includedir deepwell)/deepwell.h" -ef "$prefix/include/deepwell.h" ] &&
  ok "  ... its includedir is the prefix's" || bad "  ... includedir $(pc --variable=includedir deepwell)"
cc -std=c11 $san "$tmp/hello.c" "${cflags[@]}" "${libs[@]}" -Wl,-rpath,"$libdir" -o "$tmp/hello" 2>"$tmp/err"
check "a C program compiles and links through pkg-config" 0 $? || cat "$tmp/err"
"$tmp/hello" >"$tmp/out" 2>&1; check "  ... and runs on the installed libdeepwell.so" 0 $?
has "  ... says so" "$tmp/out" "deepwell $(pc --modversion deepwell)" "DW_OK"
ldd "$tmp/hello" 2>/dev/null | grep -q "$libdir/libdeepwell.so" && ok "  ... loaded from the prefix" ||
  bad "  ... not loaded from the prefix: $(ldd "$tmp/hello" | grep deepwell)"

mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(deepwell 0.1 REQUIRED)
add_executable(hello_static "$tmp/hello.c")
target_link_libraries(hello_static PRIVATE deepwell::deepwell_static)
target_compile_options(hello_static PRIVATE $san)
target_link_options(hello_static PRIVATE $san)
CM
if cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/log" 2>&1 &&
   cmake --build "$tmp/consumer/build" >>"$tmp/log" 2>&1; then
  ok "find_package(deepwell) and deepwell::deepwell_static build a C program"
else
  bad "find_package(deepwell) and deepwell::deepwell_static build a C program: $(tail -20 "$tmp/log")"
fi
"$tmp/consumer/build/hello_static" >"$tmp/out" 2>&1; check "  ... that runs" 0 $?
has "  ... says so" "$tmp/out" "DW_OK"
echo "$fails failed"
[ $fails -eq 0 ]
