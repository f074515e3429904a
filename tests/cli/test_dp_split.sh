#!/usr/bin/env bash
# test_dp_split.sh DEEPWELL — the communicator's splits and started collectives over MPI: the unit
# test tests/unit/test_dp_split.c (which runs them over tcp among forked ranks) as 4 mpirun ranks
# with --mpi, MPI_Comm_split and MPI_Iallreduce / MPI_Ireduce under the same exact oracles.
set -u
dw=$1
. "$(dirname "$0")/checks.sh"
ranks_env
unit="$(dirname "$dw")/tests/test_dp_split"
[ -x "$unit" ] || { bad "$unit not built"; exit 1; }

mpirun -np 4 "$unit" --mpi >"$tmp/out" 2>"$tmp/err"
check "mpirun -np 4 test_dp_split --mpi" 0 $?
has "  ... rank 0 checked every split" "$tmp/out" "ok: mpi splits of 4 ranks"
[ "$fails" -eq 0 ] || { cat "$tmp/err"; exit 1; }
