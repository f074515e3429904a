#!/usr/bin/env bash
# cited_paths.sh SOURCE_DIR — every repository path the docs cite exists: `src/...`, `include/...`,
# `tools/...`, `tests/...`, `bench/...`, `scripts/...`, `docs/...` in backticks or links in
# README.md and docs/*.md (a trailing `:LINE` or `#anchor` is dropped; globs like `ops_*.c` are
# matched as globs), and every bare file name in backticks (`trainer.c`) names some file of the
# repository (the CUDA toolkit's and libraries' headers excepted; another project's file is cited
# with its project's name right before it, "llm.c's `fineweb.py`"). Fails listing each missing path with the file that cites it.
set -uo pipefail
root=$1
cd "$root" || exit 2
missing=0 checked=0
for doc in README.md docs/*.md; do
  # candidates: backticked words and markdown link targets starting with a top-level folder
  while IFS= read -r p; do
    p=${p%%#*}; p=${p%%:*}; p=${p%/}
    [ -z "$p" ] && continue
    checked=$((checked + 1))
    # shellcheck disable=SC2086
    if ! compgen -G "$p" >/dev/null; then
      echo "MISSING: $doc cites $p"; missing=$((missing + 1))
    fi
  done < <(grep -oE '(`|\()(\.\./)?(src|include|tools|tests|bench|scripts|docs)/[][A-Za-z0-9_./*-]+' "$doc" |
           sed -E 's/^(`|\()//; s/^\.\.\///' | sort -u)
done
# bare file names in backticks (`trainer.c`, `ops.def`): some file of that name exists
names=$(find src include tools tests bench scripts docs -type f -printf '%f\n' 2>/dev/null | sort -u)
for doc in README.md docs/*.md; do
  while IFS= read -r f; do
    case $f in cuda_*.h | cublas*.h | cudnn*.h | nccl.h | jansson.h | cmocka.h) continue ;; esac # toolkit, libraries
    checked=$((checked + 1))
    if ! grep -qxF "$f" <<<"$names" && ! compgen -G "$f" >/dev/null; then
      # a glob of names (`ops_cpu_*.c`)
      if [[ $f == *'*'* ]] && find src include tools tests bench scripts docs -name "$f" | grep -q .; then continue; fi
      echo "MISSING: $doc cites $f"; missing=$((missing + 1))
    fi
  done < <(sed -E "s/'s \`[^\`]+\`//g" "$doc" | grep -oE '`[A-Za-z0-9_*.-]+\.(c|h|cu|cuh|def|sh|py)`' | tr -d '`' | sort -u)
done
if [ "$checked" -lt 50 ]; then echo "FAIL: only $checked citations found (the parser is broken)"; exit 1; fi
if [ "$missing" -gt 0 ]; then echo "FAIL: $missing of $checked cited paths do not exist"; exit 1; fi
echo "PASS: $checked cited paths exist"
