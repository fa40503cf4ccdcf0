#!/bin/sh
# test_gpu_stage.sh - scripts/gpu-daemon stage, which packs what a device call runs: with
# --kernels-only the kernels' test and benchmarks, the sample model, the script and BUILD's path,
# and no daemon; --also NAME=FILE a second benchmark under bin/bench/NAME (the same bytes, but
# for the debug info stripped), --also NAME=BUILD that build's benchmark there and its kernels'
# test as bin/tests/NAME; --tgz the same folder packed as DIR.tgz and no folder left; and
# exit 2 with a one-line error for --also without NAME=FILE, --also of a missing file or of a
# folder that is no build, and a --timeline build that has no benchmark; run --ab refuses a
# benchmark the stage lacks, --ab-rounds a count below 1, and the staged one's own name the same
# way, before it touches a GPU; and run --ab with two --ab-args sets runs every side with each set
# in turn and compares each set on its own, the dequant once (stand-in benchmarks that print a
# record named by their arguments and a dequant record, the staged build's path moved so that the
# run links it to the stage, as on the device).  Skips (77) where the build has no CUDA kernels or
# no sample model.
#   test_gpu_stage.sh SOURCE_DIR BUILD_DIR
src="$1" build="$2"
stage="$src/scripts/gpu-daemon"
if [ ! -x "$build/bench/nwc_gpu_bench" ] || [ ! -x "$build/tests/test_gpu_kernels" ]; then
  echo "no CUDA kernels in $build: skipped"
  exit 77
fi
if [ -z "$NWC_SAMPLE" ] || [ ! -r "$NWC_SAMPLE" ]; then
  echo "no sample model (NWC_SAMPLE=$NWC_SAMPLE): skipped"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

"$stage" stage --kernels-only --also base="$build/bench/nwc_gpu_bench" --also draft="$build" "$build" "$tmp/d" \
  >"$tmp/out" 2>&1 || fail "stage --kernels-only --also: exit $? ($(tail -n 1 "$tmp/out"))"
for f in bin/tests/test_gpu_kernels bin/bench/nwc_gpu_bench bin/bench/base bin/bench/draft bin/tests/draft gpu-daemon \
         bench-compare use-lite-bf16.safetensors; do
  [ -s "$tmp/d/$f" ] || fail "stage --kernels-only: $f missing"
done
[ -e "$tmp/d/bin/daemon/nwcd" ] && fail "stage --kernels-only: staged nwcd"
[ "$(cat "$tmp/d/build-path" 2>/dev/null)" = "$(cd "$build" && pwd)" ] || fail "build-path is not $build's absolute path"
cmp -s "$NWC_SAMPLE" "$tmp/d/use-lite-bf16.safetensors" || fail "the staged sample differs from $NWC_SAMPLE"
cmp -s "$tmp/d/bin/bench/nwc_gpu_bench" "$tmp/d/bin/bench/base" || fail "--also base: not the benchmark it names"
cmp -s "$tmp/d/bin/bench/nwc_gpu_bench" "$tmp/d/bin/bench/draft" || fail "--also draft=BUILD: not its benchmark"
cmp -s "$tmp/d/bin/tests/test_gpu_kernels" "$tmp/d/bin/tests/draft" || fail "--also draft=BUILD: not its kernels' test"

"$stage" stage --kernels-only --tgz "$build" "$tmp/t" >"$tmp/out" 2>&1 || fail "stage --tgz: exit $?"
[ -e "$tmp/t" ] && fail "stage --tgz left the folder $tmp/t"
tar -tzf "$tmp/t.tgz" >"$tmp/list" 2>/dev/null || fail "stage --tgz: $tmp/t.tgz is no gzip tar"
for f in t/gpu-daemon t/build-path t/bin/bench/nwc_gpu_bench t/bin/tests/test_gpu_kernels; do
  grep -qx "$f" "$tmp/list" || fail "stage --tgz: $f not in the archive"
done

refuse() { # what, then the stage's arguments: exit 2 with one line on stderr
  what="$1"
  shift
  "$stage" stage "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 2 ] || fail "$what: exit $rc, not 2"
  [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$what: not one line of error: $(cat "$tmp/err")"
}
refuse "--also without NAME=FILE" --also base "$build" "$tmp/r"
refuse "--also of a missing file" --also base="$tmp/none" "$build" "$tmp/r"
refuse "--also of a folder that is no build" --also base="$tmp" "$build" "$tmp/r"
refuse "--timeline without a benchmark" --timeline "$tmp" "$build" "$tmp/r"

# run --ab refuses a benchmark the stage does not have (before it touches a GPU): exit 2, one line
for names in missing nwc_gpu_bench; do
  "$tmp/d/gpu-daemon" run --no-test --ab "$names" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 2 ] || fail "run --ab $names: exit $rc, not 2"
  [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "^gpu-daemon: --ab $names: " "$tmp/err" ||
    fail "run --ab $names: not one line of error: $(cat "$tmp/err")"
done
# and a count of rounds that is no count of at least 1
for rounds in 0 x ""; do
  "$tmp/d/gpu-daemon" run --no-test --ab missing --ab-rounds "$rounds" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 2 ] && grep -q "^gpu-daemon: --ab-rounds $rounds: " "$tmp/err" ||
    fail "run --ab-rounds '$rounds': exit $rc: $(cat "$tmp/err")"
done
# run --ab with two argument sets: each side runs each set, and each set is compared on its own
echo "$tmp/moved/build" >"$tmp/d/build-path"
for side in nwc_gpu_bench base; do
  us=$([ $side = base ] && echo 12 || echo 10)
  cat >"$tmp/d/bin/bench/$side" <<EOF
#!/bin/sh
echo "{\"bench\":\"linear_bf16\",\"shape\":\"\$*\",\"nwc_graph_us\":$us,\"cublas_graph_us\":20}"
echo '{"bench":"dequant_bf16","shape":"1x1","graph_us":4,"out_tbps":2.5}'
EOF
  chmod +x "$tmp/d/bin/bench/$side"
done
OUT="$tmp/o" "$tmp/d/gpu-daemon" run --no-test --ab base --ab-args "--cols 1" --ab-args "--cols 8 --x bf16" \
  --ab-rounds 1 >"$tmp/out" 2>&1 || fail "run --ab with two --ab-args: exit $? ($(tail -n 3 "$tmp/out"))"
tar -xzf "$tmp/o/logs.tgz" -C "$tmp/o" 2>/dev/null || fail "run --ab: no logs.tgz"
ab="$tmp/o/logs/ab.txt"
[ "$(grep '^== A/B: ' "$ab" 2>/dev/null | grep -vc ', dequant')" = 2 ] && grep -q '^== A/B: --cols 1$' "$ab" &&
  grep -q '^== A/B: --cols 8 --x bf16$' "$ab" || fail "run --ab: not one comparison a set: $(cat "$ab" 2>/dev/null)"
for set in "--cols 1" "--cols 8 --x bf16"; do # each set's section names its own record, base 12 us over 10
  sed -n "/^== A\/B: $set\$/,/^== A\/B: /p" "$ab" | grep -q -- "^$set " ||
    fail "run --ab: the '$set' section lacks its record: $(cat "$ab")"
done
grep -q "1.200" "$ab" || fail "run --ab: base's times over the staged build's (1.200) not printed: $(cat "$ab")"
[ "$(grep -c '^== A/B: .*, dequant' "$ab")" = 1 ] && grep -q "2.500T" "$ab" ||
  fail "run --ab: the dequant not compared once: $(cat "$ab")"
exit $status
