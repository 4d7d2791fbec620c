#!/bin/sh
# run_tests.sh -- run every C test binary given as an argument, then the busted
# specs under LuaJIT, and end with one line "N passed, N failed" over all of them.
# A test named test_mpi_* runs under mpirun with 2 and with 4 ranks (its rank 0
# prints the totals over ranks).
# SPECS names the busted specs to run (default: all of spec/, as .busted
# says): make test-unit runs SPECS=spec/unit with no C test, make test-e2e
# SPECS=spec/e2e (spec/README.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenBLAS's kernels decide the last bits of every GEMM, and the recorded
# digests (spec/fixtures/digests.json) are those of the core ztrain picks for
# this CPU: run the suite as on a user's machine, without a developer's override.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
# checked collectives in every multi-rank run of the suite: ranks whose
# collectives differ fail at once, naming both call sites, instead of hanging
export ZTRAIN_COMM_CHECK=1
# The suite shares its cores with other work: an OpenMP thread that spins
# while waiting (libgomp's default) holds a core the thread it waits for
# needs, and a 2-thread run then steps 3 to 8 times slower (gpt2-tiny, seq
# 128 x 16: 26 ms a step alone, 100-350 ms beside two busy processes; 40-90
# ms passive). Passive threads sleep instead: the same threads, the same
# work split, the same bits; alone, a step takes ~10% longer.
export OMP_WAIT_POLICY=passive
MPIRUN="mpirun --oversubscribe --bind-to none"
runs=""
for t in "$@"; do
  case "$t" in
    */test_mpi_*) runs="$runs $t@2 $t@4" ;;
    *) runs="$runs $t" ;;
  esac
done
passed=0; failed=0; status=0
for r in $runs; do
  t=${r%@*}; np=""
  [ "$r" != "$t" ] && np=${r#*@}
  echo "== $t${np:+ (mpirun -np $np)}"
  if [ -n "$np" ]; then
    out=$(timeout 120 $MPIRUN -np "$np" "$t" 2>&1); rc=$?
  else
    out=$("$t" 2>&1); rc=$?
  fi
  echo "$out" | grep -v '^ok ' 
  line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
  if [ -z "$line" ]; then
    echo "$t: no summary line (exit $rc): counted as 1 failure"; failed=$((failed + 1)); status=1; continue
  fi
  p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.*, ([0-9]+) failed.*/\1/')
  passed=$((passed + p)); failed=$((failed + f))
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "$t exited $rc"; failed=$((failed + 1)); }
  [ "$rc" -ne 0 ] && status=1
done
echo "== busted (luajit)${SPECS:+: $SPECS}"
tap=$(mktemp)
# shellcheck disable=SC2086 -- SPECS is a list of paths
busted --lua=luajit -o TAP ${SPECS:-} > "$tap" 2>&1; brc=$?
grep -v '^ok ' "$tap"
bp=$(grep -c '^ok ' "$tap"); bf=$(grep -c '^not ok ' "$tap")
if [ "$brc" -ne 0 ] && [ "$bf" -eq 0 ]; then echo "busted exited $brc"; bf=1; fi
rm -f "$tap"
passed=$((passed + bp)); failed=$((failed + bf))
# a failure counted by the caller (make test: the CUDA backend's build or test)
failed=$((failed + ${EXTRA_FAILED:-0}))
[ "$failed" -ne 0 ] && status=1
echo "$passed passed, $failed failed"
exit $status
