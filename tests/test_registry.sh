#!/bin/bash
# test_registry.sh SOURCE_DIR BUILD_DIR - nwcctl push and pull through real registries (Debian's
# docker-registry on loopback ports, storage of their own) between two real nwcd on stores of
# their own: a random model pushed from A and pulled into B is bit-exact, tensor by tensor; a
# second push uploads nothing, a second pull does nothing; a blob tampered with in the registry's
# storage is refused and leaves nothing; the registry killed mid-pull and restarted: the pull
# resumes and completes; killed for good: a clean error, and the next pull resumes where it stopped; skopeo (a tool we did
# not write) copies the artifact to a second registry, from which B pulls a model that verifies.
# Exit 77 without docker-registry or python3-numpy (the model is made with numpy).
set -u
src=$1 b=$2
nwcctl=$b/client/nwcctl nwcd=$b/daemon/nwcd
. "$src/tests/registry_env.sh"
command -v docker-registry >/dev/null || { echo "docker-registry not installed: skipped"; exit 77; }
py=/usr/bin/python3
$py -c 'import numpy' 2>/dev/null || { echo "python3-numpy not installed: skipped"; exit 77; }
seed=${NWC_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "test_registry: seed $seed (replay with NWC_SEED=$seed)"
t=$(mktemp -d "${TMPDIR:-/tmp}/nwc-registry-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$t"; }
trap cleanup EXIT
fail=0
check() { if eval "$1"; then :; else echo "FAILED: $2"; fail=1; fi; }
ctl() { local s=$1; shift; "$nwcctl" --socket "$t/$s.sock" "$@"; }
# same MODEL_A MODEL_B: every tensor of A's model in store a equals B's in store b, bit for bit
same() {
  local ok=0 n=0
  for tn in $(ctl a ls "$1" --json | $py -c 'import json,sys; [print(t["name"]) for t in json.load(sys.stdin)]'); do
    ctl a dequant "$1/$tn" -o "$t/x.npy" --bf16 >/dev/null && ctl b dequant "$2/$tn" -o "$t/y.npy" --bf16 >/dev/null &&
      cmp -s "$t/x.npy" "$t/y.npy" || { echo "tensor $tn differs"; ok=1; }
    n=$((n + 1))
  done
  [ $n -gt 0 ] && return $ok
}
leftovers() { ls "$t/b/containers" | grep -c '\.tmp$'; }

pa=$(free_port); registry ra "$pa"
daemon a; daemon b
# A model of random BF16 weights: a 64 MiB matrix (the resume test needs a transfer that takes
# a moment), smaller ones, a bias.
make_model "$seed" "$t/m.safetensors" 8192
check 'ctl a import m "$t/m.safetensors" >/dev/null' "import into a"
ref=127.0.0.1:$pa/nwc/m:v1

check 'ctl a push m "$ref" --plain-http' "push"
puts=$(grep -c '"PUT /v2/nwc/m/blobs/uploads' "$t/ra.log")
check 'ctl a push m "$ref" --plain-http >/dev/null' "second push"
check '[ "$(grep -c "\"PUT /v2/nwc/m/blobs/uploads" "$t/ra.log")" = "$puts" ]' "a second push uploaded blobs"
check 'ctl b pull "$ref" --plain-http' "pull"
check 'same m m' "pulled model differs"
check 'ctl b pull "$ref" --plain-http | grep -q "already have"' "a second pull did something"
check 'ctl b verify m >/dev/null' "verify of the pulled model"
check 'ctl b pull "$ref" other-name --plain-http >/dev/null && ctl b ls | grep -q "^other-name "' "pull under another name"
ctl b rm other-name >/dev/null
check '! ctl b pull "127.0.0.1:$pa/nwc/absent:v1" --plain-http 2>/dev/null' "pull of an absent tag succeeded"

# A tampered layer: refused, nothing left.
layer=$(curl -s -H "Accept: application/vnd.oci.image.manifest.v1+json" "http://127.0.0.1:$pa/v2/nwc/m/manifests/v1" |
  $py -c 'import json,sys; print(json.load(sys.stdin)["layers"][0]["digest"].split(":")[1])')
data=$t/ra/docker/registry/v2/blobs/sha256/${layer:0:2}/$layer/data
cp "$data" "$t/layer.orig"
pos=$(( seed % ($(stat -c %s "$data") - 4096) + 4096 ))
printf '\x5a' | dd of="$data" bs=1 seek=$pos conv=notrunc 2>/dev/null
cmp -s "$data" "$t/layer.orig" || {
  check '! ctl b pull "$ref" tampered --plain-http 2>"$t/err"' "a tampered layer was pulled"
  cat "$t/err"
  check '! ctl b ls | grep -q tampered && [ "$(leftovers)" = 0 ]' "a refused pull left something"
}
cp "$t/layer.orig" "$data"

# Killed mid-pull, restarted: the pull resumes where it stopped (HTTP Range) and completes.
ctl b rm m >/dev/null
ctl b pull "$ref" --plain-http >"$t/pull.out" 2>&1 &
pull=$!
for _ in $(seq 400); do [ -n "$(find "$t/b/containers" -name '*.tmp' -size +1M 2>/dev/null)" ] && break; sleep 0.01; done
kill -9 "$reg_ra"; wait "$reg_ra" 2>/dev/null
sleep 0.5
registry ra "$pa"
wait "$pull"; rc=$?
cat "$t/pull.out"
check '[ $rc = 0 ] && same m m' "the resumed pull failed or differs"
grep -q "resuming" "$t/b.d.log" && echo "(the pull was cut and resumed)" || echo "(the pull finished before the kill)"
# Killed for good: a clean error; what was taken is kept, and the next pull resumes from it.
ctl b rm m >/dev/null
ctl b pull "$ref" --plain-http >"$t/pull.out" 2>&1 &
pull=$!
for _ in $(seq 400); do [ -n "$(find "$t/b/containers" -name '*.tmp' -size +1M 2>/dev/null)" ] && break; sleep 0.01; done
kill -9 "$reg_ra"; wait "$reg_ra" 2>/dev/null
wait "$pull"; rc=$?
cat "$t/pull.out"
if [ $rc != 0 ]; then
  check '! ctl b ls | grep -q "^m " && [ "$(leftovers)" = 1 ]' "a failed pull published something, or kept no bytes"
  registry ra "$pa"
  check 'ctl b pull "$ref" --plain-http && same m m' "the pull after the failed one"
  check 'grep -q "resuming an earlier pull" "$t/b.d.log"' "the second pull did not resume the first"
else
  echo "(the pull finished before the kill)"
  registry ra "$pa"
fi
check '[ "$(leftovers)" = 0 ]' "a temporary file left behind"

# skopeo copies the artifact to a second registry; B pulls it from there.
if command -v skopeo >/dev/null; then
  pb=$(free_port); registry rb "$pb"
  check 'skopeo copy --src-tls-verify=false --dest-tls-verify=false "docker://$ref" "docker://127.0.0.1:$pb/copy/m:v1" >/dev/null' "skopeo copy"
  check 'ctl b pull "127.0.0.1:$pb/copy/m:v1" copied --plain-http >/dev/null' "pull from the copy"
  check 'ctl b verify copied >/dev/null && same m copied' "the copy's model"
else
  echo "skopeo not installed: its interoperability is not checked"
fi
[ $fail = 0 ] && echo "test_registry: ok"
exit $fail
