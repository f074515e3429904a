#!/usr/bin/env bash
# exports.sh LIBDEEPWELL_SO DEEPWELL_H — the shared library exports exactly the functions
# include/deepwell.h declares with DW_API: nothing internal leaks, nothing declared is missing.
set -euo pipefail
lib=$1 header=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort -u > "$tmp/exported"
# every "DW_API <type> <name>(" declaration, possibly with pointer stars before the name
grep -E '^DW_API ' "$header" | sed -E 's/^DW_API [^(]*[ *]([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/' | sort -u > "$tmp/declared"
n_decl=$(wc -l < "$tmp/declared")
if [ "$n_decl" -lt 50 ]; then
    echo "FAIL: only $n_decl DW_API declarations parsed from $header (the parser is broken)"; exit 1
fi
extra=$(comm -23 "$tmp/exported" "$tmp/declared")
missing=$(comm -13 "$tmp/exported" "$tmp/declared")
rc=0
if [ -n "$extra" ]; then echo "FAIL: exported but not declared in $header:"; echo "$extra"; rc=1; fi
if [ -n "$missing" ]; then echo "FAIL: declared in $header but not exported:"; echo "$missing"; rc=1; fi
[ $rc = 0 ] && echo "PASS: $(wc -l < "$tmp/exported") exported functions, all declared with DW_API"
exit $rc
