#!/bin/sh
# san.sh B TEST... -- `make SAN=1`: the C tests and a short 2-rank training
# run, all built with ASan + UBSan into B (build-san/). Ends with one line
# "SAN: N passed, N failed (S s)"; exit 1 on any failure or report.
#
# The C tests are sanitized executables: ASan's runtime comes with them.
# Plain tests keep LeakSanitizer on (a leak in our code is a finding);
# tests under mpirun run with detect_leaks=0: Open MPI's own allocations
# live until exit and would bury ours.
#
# The training run uses B/ztrain, the LuaJIT host built with
# -fsanitize=address: its executable links libasan, so the ASan runtime is
# the first library loaded, before LuaJIT and before ffi.lua dlopens
# ZTRAIN_LIB=B/libztrain.so (ASan must come first: a sanitized library
# dlopened into an unsanitized process aborts with "ASan runtime does not
# come first"; `luajit` or busted would need
# LD_PRELOAD=$(gcc -print-file-name=libasan.so) instead). Leaks are off
# there: LuaJIT's and MPI's heaps are freed by exit, not by free().
B=$1; shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
SAN_COMMON="abort_on_error=0:halt_on_error=1:print_summary=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/tools/lsan.supp:print_suppressions=0"
t0=$(date +%s)
passed=0; failed=0
for t in "$@"; do
  s0=$(date +%s)
  case "$t" in
    */test_mpi_*)
      echo "== $t (mpirun -np 2, ASan + UBSan)"
      out=$(ASAN_OPTIONS="$SAN_COMMON:detect_leaks=0" timeout 300 $MPIRUN -np 2 \
            -x ASAN_OPTIONS -x UBSAN_OPTIONS "$t" 2>&1); rc=$? ;;
    *)
      echo "== $t (ASan + UBSan + LSan)"
      out=$(ASAN_OPTIONS="$SAN_COMMON:detect_leaks=1" timeout 300 "$t" 2>&1); rc=$? ;;
  esac
  # LSan's "Running thread N was not suspended" comes from test_aio's forked
  # child exiting with libuv's pool running (a note, not a report)
  echo "$out" | grep -v -e '^ok ' -e 'was not suspended. False leaks are possible'
  if [ $rc -ne 0 ] || echo "$out" | grep -q -E 'ERROR: (Address|Leak)Sanitizer|runtime error:'; then
    echo "FAILED: $t (exit $rc)"; failed=$((failed + 1))
  else
    passed=$((passed + 1))
  fi
  echo "   ($(( $(date +%s) - s0 )) s)"
done

# A short multi-rank run: zero3 with host offload (sharding, all-gathers,
# reduce-scatters, aio-free host copies, the optimizer on the host tier).
s0=$(date +%s)
echo "== $B/ztrain --nproc 2 recipes/zero3_offload.lua (gpt2-tiny, 3 steps, ASan + UBSan)"
out_dir=$(mktemp -d /tmp/ztrain-san.XXXXXX)
out=$(ZTRAIN_LIB="$PWD/$B/libztrain.so" ASAN_OPTIONS="$SAN_COMMON:detect_leaks=0" \
      timeout 600 "$B/ztrain" --nproc 2 recipes/zero3_offload.lua model.size=gpt2-tiny \
      data.tokenizer=bytes data.seq_len=64 batch.micro=2 train.steps=3 train.log_every=1 \
      train.eval_every=0 train.eval_batches=1 out="$out_dir/run" 2>&1); rc=$?
echo "$out" | grep -E 'step |digest|Sanitizer|runtime error|SUMMARY|ztrain:' | head -40
if [ $rc -ne 0 ] || echo "$out" | grep -q -E 'ERROR: (Address|Leak)Sanitizer|runtime error:'; then
  echo "$out" | tail -40
  echo "FAILED: 2-rank zero3_offload run (exit $rc)"; failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
rm -rf "$out_dir"
echo "   ($(( $(date +%s) - s0 )) s)"
echo "SAN: $passed passed, $failed failed ($(( $(date +%s) - t0 )) s)"
[ $failed -eq 0 ]
