#!/bin/sh
# test_deploy_manifests.sh SRC NWCD NWCCTL - checks deploy/: every YAML file parses (python3-yaml)
# and each object has apiVersion, kind and metadata.name; the DaemonSet mounts the store and
# /run/nwc from the host; the ConfigMap's nwcd.conf is accepted by nwcd itself (started on it,
# with a temporary store and socket); nwc-models.sh --dry-run against that nwcd prints the
# expected actions for a sample models.conf and changes nothing; the fleet's systemd units
# verify.  kubectl is not used: its client-side dry run still needs a cluster.
set -eu
src=$1 nwcd=$2 nwcctl=$3
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" -c 'import yaml' 2>/dev/null || { echo "SKIP: python3-yaml is not installed"; exit 77; }

dir=$(mktemp -d /tmp/nwc-deploy.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ---- the manifests ---------------------------------------------------------------------------
"$py" - "$src" "$dir" <<'EOF'
import glob, os, re, sys, yaml
src, out = sys.argv[1], sys.argv[2]
bad = []
objs = {}
files = sorted(glob.glob(os.path.join(src, "deploy", "**", "*.y*ml"), recursive=True))
if not files: bad.append("no YAML files under deploy/")
for f in files:
    rel = os.path.relpath(f, src)
    with open(f) as fh:
        text = fh.read()
    if not text.startswith("#"): bad.append(f"{rel}: does not start with a comment")
    try: docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        bad.append(f"{rel}: {e}"); continue
    for d in docs:
        if not isinstance(d, dict): bad.append(f"{rel}: a document that is not a mapping"); continue
        kind = d.get("kind")
        if kind == "Kustomization":
            for r in d.get("resources", []):
                if not os.path.exists(os.path.join(os.path.dirname(f), r)):
                    bad.append(f"{rel}: resource {r} does not exist")
            continue
        name = (d.get("metadata") or {}).get("name")
        if not d.get("apiVersion") or not kind or not name:
            bad.append(f"{rel}: an object without apiVersion, kind or metadata.name"); continue
        objs[(kind, name)] = (rel, d)
        print(f"ok {rel}: {kind} {name}")

def need(cond, what):
    if not cond: bad.append(what)

ds = objs.get(("DaemonSet", "nwcd"), (None, None))[1]
need(ds is not None, "no DaemonSet nwcd")
if ds:
    spec = ds["spec"]["template"]["spec"]
    need(ds["metadata"].get("namespace") == "nwc-system", "DaemonSet not in nwc-system")
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    cs = {c["name"]: c for c in spec["containers"]}
    need("nwcd" in cs and "nwc-models" in cs, "DaemonSet lacks the nwcd or nwc-models container")
    for cname, path in (("nwcd", "/var/lib/nwc"), ("nwcd", "/run/nwc"), ("nwc-models", "/run/nwc")):
        mounts = {m["mountPath"]: m["name"] for m in cs.get(cname, {}).get("volumeMounts", [])}
        need(host.get(mounts.get(path)) == path, f"container {cname} does not mount hostPath {path} at {path}")
    need(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1, "maxUnavailable is not 1")
    need("nvidia.com/gpu" not in str(cs["nwcd"].get("resources")), "nwcd requests nvidia.com/gpu")
    need("IPC_LOCK" in cs["nwcd"]["securityContext"]["capabilities"]["add"], "nwcd lacks IPC_LOCK")
    for c in cs.values():
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in c: need(c[probe]["exec"]["command"][0] == "/usr/bin/nwcctl", f"{probe} is not nwcctl")
    need(spec.get("terminationGracePeriodSeconds", 30) >= 25, "terminationGracePeriodSeconds under nwcd's 20 s drain")
    need(spec["securityContext"]["runAsGroup"] == 4300, "runAsGroup is not the socket's group 4300")

cm = objs.get(("ConfigMap", "nwcd-config"), (None, {}))[1]
conf = cm.get("data", {}).get("nwcd.conf")
need(conf is not None, "no ConfigMap nwcd-config with nwcd.conf")
if conf:
    need(re.search(r"^socket = /run/nwc/", conf, re.M), "nwcd.conf's socket is not under /run/nwc")
    need(re.search(r"^store = /var/lib/nwc$", conf, re.M), "nwcd.conf's store is not /var/lib/nwc")
    open(os.path.join(out, "nwcd.conf"), "w").write(conf)
mm = objs.get(("ConfigMap", "nwc-models"), (None, {}))[1]
models = mm.get("data", {}).get("models.conf")
need(models is not None, "no ConfigMap nwc-models with models.conf")
if models: open(os.path.join(out, "models.conf"), "w").write(models)

# The image's build packages are scripts/lib/common.sh's -dev libraries.
cf = open(os.path.join(src, "deploy/container/Containerfile")).read()
common = open(os.path.join(src, "scripts/lib/common.sh")).read()
for p in re.findall(r"\b(lib[a-z0-9]+-dev)\b", common):
    need(p in cf, f"Containerfile lacks {p} (scripts/lib/common.sh)")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
EOF

# ---- nwcd.conf, read by nwcd ------------------------------------------------------------------
# admin_group must name a group of this machine (the image has nwc-admin); store, socket,
# backend and budget come from flags, which win over the file.
conf=$dir/nwcd.conf
if ! getent group nwc-admin >/dev/null; then
  sed "s/^admin_group = nwc-admin\$/admin_group = $(id -gn)/" "$dir/nwcd.conf" >"$dir/nwcd-here.conf"
  conf=$dir/nwcd-here.conf
fi
sock=$dir/nwcd.sock
export NWC_SOCKET="$sock"
"$nwcd" --config "$conf" --store "$dir/store" --socket "$sock" --backend cpu --budget 64M \
  >"$dir/nwcd.log" 2>&1 &
pid=$!
i=0
until "$nwcctl" stats >/dev/null 2>&1; do
  kill -0 "$pid" 2>/dev/null || { cat "$dir/nwcd.log"; fail "nwcd refused the ConfigMap's nwcd.conf"; }
  i=$((i + 1))
  [ $i -lt 100 ] || fail "nwcd did not serve within 10 s"
  sleep 0.1
done
grep -q "config $conf read" "$dir/nwcd.log" || { cat "$dir/nwcd.log"; fail "nwcd did not log reading $conf"; }
echo "ok nwcd started on the ConfigMap's nwcd.conf"

# ---- nwc-models.sh --dry-run against it -------------------------------------------------------
"$py" - "$dir/tiny.safetensors" <<'EOF'
import json, struct, sys
rows, cols = 16, 512
w = b"".join(struct.pack("<H", 0x3f80 ^ ((i * 7919) & 0xff)) for i in range(rows * cols))
h = json.dumps({"w.weight": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [0, len(w)]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + w)
EOF
"$nwcctl" import present "$dir/tiny.safetensors" >/dev/null
"$nwcctl" import gone "$dir/tiny.safetensors" >/dev/null
cat >"$dir/sample.conf" <<'EOF'
# a sample: one present model to pin, one absent to pull and load, one for other nodes
prune = false
present  registry.example.com/models/present:v1                  pin   cpu     all
absent   registry.example.com:5000/models/absent@sha256:0123abcd load  -       tier=big
other    registry.example.com/models/other:v1                    pin   cuda:0  tier=small,zone
wide     registry.example.com/models/wide:v1                     load  split:cpu  all
both     registry.example.com/models/both:v1                     pin   cuda:0,cpu tier=big
EOF
printf 'tier=big\nkubernetes.io/hostname=node-1\n' >"$dir/labels"
mkdir "$dir/state"
echo "gone pin" >"$dir/state/managed" # declared by an earlier pass, no longer listed
models="sh $src/deploy/kubernetes/nwc-models.sh"
export NWCCTL="$nwcctl"
rc=0
$models --config "$dir/sample.conf" --labels "$dir/labels" --state "$dir/state" --once --dry-run \
  >"$dir/out" 2>&1 || rc=$?
cat "$dir/out"
[ $rc -eq 0 ] || fail "nwc-models.sh --dry-run exited $rc"
expect() { grep -qxF -- "nwc-models: $1" "$dir/out" || fail "missing line: nwc-models: $1"; }
refuse() { ! grep -qF -- "$1" "$dir/out" || fail "unexpected: $1"; }
expect "present: present, no pull"
expect "dry-run: $nwcctl pin present --device cpu"
expect "dry-run: $nwcctl load wide --device cpu --split"
expect "dry-run: $nwcctl pin both --device cuda:0,cpu"
expect "absent: missing, pulling registry.example.com:5000/models/absent@sha256:0123abcd"
expect "dry-run: $nwcctl pull registry.example.com:5000/models/absent@sha256:0123abcd absent"
expect "dry-run: $nwcctl load absent"
expect "other: not for this node (tier=small,zone)"
expect "dry-run: $nwcctl unpin gone"
expect "gone: kept in the store (prune = false)"
refuse "pull registry.example.com/models/present"
refuse "$nwcctl rm"
refuse "nwc-models: run: "
[ "$(cat "$dir/state/managed")" = "gone pin" ] || fail "--dry-run changed the state file"
[ ! -e "$dir/state/status" ] || fail "--dry-run wrote a status"
"$nwcctl" ps | grep -q " yes " && fail "--dry-run pinned something"
echo "ok nwc-models.sh --dry-run"

# With prune = true the model no longer declared is removed too.
sed 's/^prune = false/prune = true/' "$dir/sample.conf" >"$dir/prune.conf"
$models --config "$dir/prune.conf" --labels "$dir/labels" --state "$dir/state" --once --dry-run >"$dir/out" 2>&1 ||
  fail "nwc-models.sh --dry-run (prune) failed"
expect "dry-run: $nwcctl rm gone"

# The ConfigMap's models.conf parses (its models are absent: each a pull).
$models --config "$dir/models.conf" --state "$dir/state" --once --dry-run >"$dir/out" 2>&1 ||
  { cat "$dir/out"; fail "nwc-models.sh refused the ConfigMap's models.conf"; }
grep -q "dry-run: $nwcctl pull " "$dir/out" || fail "the ConfigMap's models.conf pulls nothing"
echo "ok the ConfigMap's models.conf"

# A bad line: exit 2, naming the file and line, nothing done.
printf 'x registry.example.com/m:v1 pin\n' >"$dir/bad.conf"
rc=0
$models --config "$dir/bad.conf" --state "$dir/state" --once --dry-run >"$dir/out" 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat "$dir/out"; fail "a bad models.conf exited $rc, not 2"; }
grep -q "bad.conf:1: expected NAME REF ACTION DEVICE NODES" "$dir/out" || fail "no FILE:LINE for a bad line"
# and a DEVICE that is no place list (a list ending in a comma; split of nothing)
for dev in cuda:0, split: gpu1; do
  printf 'x registry.example.com/m:v1 pin %s all\n' "$dev" >"$dir/bad.conf"
  rc=0
  $models --config "$dir/bad.conf" --state "$dir/state" --once --dry-run >"$dir/out" 2>&1 || rc=$?
  [ $rc -eq 2 ] && grep -q "bad.conf:1: DEVICE is .*not '$dev'" "$dir/out" ||
    { cat "$dir/out"; fail "DEVICE '$dev' accepted (exit $rc)"; }
done
$models --help | grep -q -- "--dry-run" || fail "--help does not list --dry-run"
echo "ok nwc-models.sh errors and --help"

# ---- the fleet's systemd units ----------------------------------------------------------------
if command -v systemd-analyze >/dev/null; then
  mkdir "$dir/units"
  sed "s|/usr/local/bin/nwc-models|$src/deploy/kubernetes/nwc-models.sh|" \
    "$src/deploy/fleet/nwc-models.service" >"$dir/units/nwc-models.service"
  cp "$src/deploy/fleet/nwc-models.timer" "$src/deploy/fleet/nwc-models.path" "$dir/units/"
  out=$(cd "$dir/units" && systemd-analyze verify --man=no ./nwc-models.service ./nwc-models.timer \
    ./nwc-models.path 2>&1) || fail "systemd-analyze verify: $out"
  echo "ok deploy/fleet units verify"
fi
echo "PASS"
