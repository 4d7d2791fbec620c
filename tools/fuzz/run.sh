#!/bin/sh
# run.sh LIMIT TARGET... -- run each build-fuzz/fuzz_TARGET from its seeds
# (spec/fuzz/TARGET, read-only) with libFuzzer's LIMIT (-runs=N or
# -max_total_time=S); new inputs go to build-fuzz/corpus/TARGET, crashes to
# build-fuzz/crash-TARGET-*. One line per target: executions, corpus size,
# outcome; then "fuzz: N passed, N failed". Exit 1 on any finding.
limit=$1; shift
passed=0; failed=0
# a reader that hangs over 10 s on one input is a finding; 2 GiB of RSS too
for t in "$@"; do
  # a smoke run (-runs=N) starts from the seeds alone each time (a corpus
  # grown by earlier runs would make it slower and less repeatable)
  corpus="build-fuzz/corpus/$t"
  case "$limit" in -runs=*) corpus=$(mktemp -d /tmp/ztrain-fuzz-corpus.XXXXXX) ;; esac
  mkdir -p "$corpus"
  log="build-fuzz/fuzz_$t.log"
  dict=""
  [ -f "tools/fuzz/$t.dict" ] && dict="-dict=tools/fuzz/$t.dict"   # the format's keys and tokens
  scratch=$(mktemp -d /tmp/ztrain-fuzz.XXXXXX)    # the files the harness writes inputs to
  TMPDIR="$scratch" ZTRAIN_HOME="$PWD" ASAN_OPTIONS="detect_leaks=0:abort_on_error=0" \
    "build-fuzz/fuzz_$t" "$limit" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 $dict \
    -artifact_prefix="build-fuzz/crash-$t-" "$corpus" "spec/fuzz/$t" > "$log" 2>&1
  rc=$?
  rm -rf "$scratch"
  new=$(ls "$corpus" | wc -l)
  case "$limit" in -runs=*) rm -rf "$corpus" ;; esac
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | sed 's/ft: /features /')
  if [ $rc -eq 0 ]; then
    echo "fuzz $t: ok, ${execs:-?} executions, $cov, $new new inputs kept"
    passed=$((passed + 1))
  else
    echo "fuzz $t: FINDING (exit $rc), ${execs:-?} executions; log $log:"
    grep -E 'FINDING|harness itself|ERROR:|runtime error|Test unit written|traceback|\.lua:' "$log" | head -20
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ $failed -eq 0 ]
