#!/bin/sh
# test_bench_stops.sh - nwc-bench daemon ends, stops its nwcd, and its JSON lines reach a pipe:
# it runs a short round of every measurement with stdout into a pipe, and must exit 0 within
# 60 s with its last throughput line written and no nwcd of its own left running.
# (nwc_bench_nwcd_stop called itself instead of stopping nwcd: the compiler made that a return,
# so every bench left its nwcd running; on the H200 gpu-daemon hung after its summary, and its
# stdout, fully buffered into a pipe, was lost.)
#   test_bench_stops.sh NWC_BENCH
bench="$1"
if [ -z "$NWC_SAMPLE" ] || [ ! -r "$NWC_SAMPLE" ]; then
  echo "no sample model (NWC_SAMPLE=$NWC_SAMPLE): skipped"
  exit 77
fi
out="$(mktemp)"
before="$(pgrep -f 'nwcd --store /tmp/nwc-bench-daemon-' | sort)"
timeout 60 "$bench" daemon "$NWC_SAMPLE" --seconds 0.02 | cat >"$out"
rc=$?
status=0
if ! grep -q '"bench":"throughput","clients":16,"mode":"pipelined"' "$out"; then
  echo "nwc-bench daemon: its last JSON line did not come through the pipe"
  status=1
fi
code="$(timeout 60 "$bench" daemon "$NWC_SAMPLE" --seconds 0.02 >/dev/null; echo $?)"
if [ "$code" != 0 ]; then
  echo "nwc-bench daemon: exit $code (124: it hung and was killed after 60 s)"
  status=1
fi
after="$(pgrep -f 'nwcd --store /tmp/nwc-bench-daemon-' | sort)"
left="$after"
if [ -n "$before" ]; then left="$(printf '%s\n' "$after" | grep -vxF "$before" || true)"; fi
if [ -n "$left" ]; then
  echo "nwc-bench daemon left its nwcd running: pid(s) $left (killed now)"
  kill $left
  status=1
fi
rm -f "$out"
[ $status = 0 ] && echo "test_bench_stops: ok (pipe status $rc)"
exit $status
