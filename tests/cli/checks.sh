# checks.sh — sourced by tests/cli/test_*.sh: ok/bad/check/has, counting failures in $fails, a
# temporary directory $tmp removed on exit, and ranks_env for tests of several ranks. Not a test
# itself (ctest runs test_*.sh).
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { # check DESCRIPTION EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then bad "$1 (exit $3, expected $2)"; else ok "$1"; fi
}
has() { # has DESCRIPTION FILE TEXT...: FILE contains every TEXT
  local d=$1 f=$2; shift 2
  for t in "$@"; do grep -qF -- "$t" "$f" || { bad "$d: '$t' not in: $(head -c 600 "$f")"; return; }; done
  ok "$d"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# A tiny GPT-2 (vocab 256, 2 layers of 64) as a model directory DIR/config.json, for CLI tests.
tiny_gpt2() {
  mkdir -p "$1"
  echo '{"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 64}' >"$1/config.json"
}
# For tests of several ranks as CPU processes (after dw=DEEPWELL): one thread each, mpirun allowed as
# root and oversubscribed (CI has 2 cores: never wait for a free slot), a bounded wait on peers, and
# LeakSanitizer off in the ranks of an ASan build (Open MPI keeps what MPI_Init allocates until
# exit). Fails the test at once when mpirun is missing.
ranks_env() {
  export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DW_COMM_TIMEOUT=60
  export OMPI_MCA_rmaps_base_oversubscribe=1
  if ldd "$dw" 2>/dev/null | grep -q libasan; then export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"; fi
  command -v mpirun >/dev/null || { bad "mpirun not found (scripts/deps.sh installs openmpi-bin)"; exit 1; }
}
