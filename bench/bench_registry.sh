#!/bin/bash
# bench_registry.sh BUILD_DIR [ROWS] [ROUNDS] - a model through a registry, side by side in one
# run (JSON lines): `nwcctl pull` into a fresh store against `skopeo copy` of the same blobs to a
# directory (what a user of the registry would do to fetch the bytes) and against `nwcctl
# import` of the model's safetensors into the same store (what a node without the registry does).
# The model: random BF16 weights, ROWS x 4096 (default 65536: 512 MiB) plus small tensors
# (tests/registry_env.sh). Everything on this machine's loopback; the registry's files are in the
# page cache for both fetches. Times are wall seconds, rounds alternate, best and median printed.
set -u
b=$(cd "$1" && pwd) rows=${2:-65536} rounds=${3:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
nwcctl=$b/client/nwcctl nwcd=$b/daemon/nwcd py=/usr/bin/python3
command -v docker-registry >/dev/null && command -v skopeo >/dev/null ||
  { echo "bench_registry: needs docker-registry and skopeo" >&2; exit 77; }
t=$(mktemp -d "${TMPDIR:-/tmp}/nwc-bench-registry-XXXXXX")
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$t"' EXIT
. "$src/tests/registry_env.sh"
now() { date +%s.%N; }
ctl() { local s=$1; shift; "$nwcctl" --socket "$t/$s.sock" "$@"; }
# timed NAME CMD...: wall seconds of CMD appended to $t/NAME.times (CMD's output to $t/NAME.out)
timed() {
  local name=$1 t0 t1; shift
  t0=$(now); "$@" >"$t/$name.out" 2>&1 || { echo "bench_registry: $name failed:" >&2; cat "$t/$name.out" >&2; exit 1; }
  t1=$(now); echo "$t0 $t1" | awk '{printf "%.4f\n", $2 - $1}' >>"$t/$name.times"
}

port=$(free_port); registry r "$port"
daemon a; daemon b
make_model 1 "$t/m.safetensors" "$rows"
ctl a import m "$t/m.safetensors" >/dev/null
ref=127.0.0.1:$port/bench/m:v1
ctl a push m "$ref" --plain-http >/dev/null
layer_bytes=$(du -cb "$t"/r/docker/registry/v2/blobs/sha256/*/*/data | tail -1 | cut -f1)
src_bytes=$(stat -c %s "$t/m.safetensors")
for i in $(seq "$rounds"); do
  timed pull ctl b pull "$ref" --plain-http
  ctl b rm m >/dev/null
  timed skopeo skopeo copy --src-tls-verify=false "docker://$ref" "dir:$t/copy"
  rm -rf "$t/copy"
  timed import ctl b import imported "$t/m.safetensors"
  ctl b rm imported >/dev/null
done
stats() { sort -n "$t/$1.times" | awk '{v[NR] = $1} END {printf "%s %s", v[1], v[int((NR + 1) / 2)]}'; }
read -r pull_best pull_med <<<"$(stats pull)"
read -r sk_best sk_med <<<"$(stats skopeo)"
read -r im_best im_med <<<"$(stats import)"
line() { # what best median bytes
  awk -v w="$1" -v b="$2" -v m="$3" -v n="$4" 'BEGIN {printf "{\"bench\":\"registry\",\"what\":\"%s\",\"bytes\":%d,\"best_s\":%.4f,\"median_s\":%.4f,\"gbps_best\":%.3f}\n", w, n, b, m, n / b / 1e9}'
}
line pull "$pull_best" "$pull_med" "$layer_bytes"
line skopeo_copy "$sk_best" "$sk_med" "$layer_bytes"
line import "$im_best" "$im_med" "$src_bytes"
awk -v p="$pull_best" -v s="$sk_best" -v i="$im_best" -v pm="$pull_med" -v sm="$sk_med" -v im="$im_med" -v r="$rows" \
  'BEGIN {printf "{\"bench\":\"registry\",\"what\":\"summary\",\"rows\":%d,\"pull_vs_skopeo_best\":%.3f,\"pull_vs_skopeo_median\":%.3f,\"pull_vs_import_best\":%.3f,\"pull_vs_import_median\":%.3f}\n", r, s / p, sm / pm, i / p, im / pm}'
