#!/bin/sh
# nwc-models.sh - make a node's nwcd hold the models a models.conf declares for it: pull the
# missing ones from an OCI registry, load or pin them as declared, unpin (and with prune = true,
# remove) those no longer declared.  Runs as a sidecar of the nwcd DaemonSet
# (deploy/kubernetes/daemonset.yaml) or from systemd units (deploy/fleet/); docs/cluster.md.
#
# models.conf: # comments, a setting `prune = true|false` (default false; `prune: true` too), and
# one model a line:
#
#   NAME      REF                                          ACTION  DEVICE  NODES
#   qwen3-4b  registry.example.com/models/qwen3-4b:v1      pin     cuda:0  nwc.example.com/gpu=h200
#   use-lite  registry.example.com/models/use-lite@sha256:…  load  cpu     all
#
#   NAME    the model's name in the node's store ([A-Za-z0-9][A-Za-z0-9._-]*, as `nwcctl ls`)
#   REF     host[:port]/repo[:tag|@digest], given to `nwcctl pull REF NAME`
#   ACTION  store (pulled only), load (resident while the budget's LRU keeps it), pin (resident,
#           never evicted)
#   DEVICE  cpu, cuda:N, a comma-separated list of them (a replica on each, read once) or all
#           (every GPU), each optionally split:PLACES (each tensor at ONE of the places, filled
#           in order within their budgets: nwcctl load --split), or - (nwcd's default: GPU 0
#           with the cuda backend, else host memory)
#   NODES   all, or comma-separated node label terms that must all hold: key=value or key
#
# Rules: a NAME already in the store is never pulled again (whatever REF it came from): give a
# new version a new name.  Only models this script declared before are unpinned or removed
# when they leave the list (it remembers them in STATE/managed); models imported or pinned by
# hand, or by nwcd.conf's [preload], are left alone.  Nothing is removed unless prune = true.
#
# A pull that fails (registry down, credentials refused) fails its line (logged, exit 1) and the
# rest of the pass goes on; the next pass tries again.
set -eu
set -f # no globbing: model lines are split on blanks

usage() {
  cat <<'USAGE'
usage: nwc-models.sh [--config FILE] [--state DIR] [--labels FILE] [--socket PATH]
                     [--interval SECONDS] [--resync SECONDS] [--wait SECONDS] [--once] [--dry-run]
Makes the local nwcd hold the models FILE declares for this node (pull, load, pin; unpin and,
with prune = true, remove those no longer declared).  Without --once it reconciles at start,
then whenever FILE or the node's labels change, nwcd restarts (its pins are lost) or --resync
seconds pass, checking every --interval seconds.
  --config FILE    models.conf (default $NWC_MODELS_CONFIG, else /etc/nwc/models.conf)
  --state DIR      where the names it manages are remembered, and the last pass's result
                   (DIR/status: "ok TIME" or "failed N TIME"; default $NWC_MODELS_STATE,
                   else /var/lib/nwc-models)
  --labels FILE    the node's labels, key=value a line; default: read from the Kubernetes API
                   when NODE_NAME is set (in a pod with a service account), else none (only
                   NODES = all matches)
  --socket PATH    nwcd's socket (default $NWC_SOCKET, else nwcctl's default)
  --interval N     seconds between checks (default 30)
  --resync N       seconds between full passes when nothing changed (default 600)
  --wait N         seconds to wait for nwcd to serve before giving up (default 300; 0: forever)
  --once           one pass, then exit with its status
  --dry-run        print what would be done (nwcctl commands marked "dry-run:"), change nothing
Exit status: 0 all done; 1 some action failed (logged); 2 bad usage or models.conf;
3 nwcd did not answer within --wait.
USAGE
}

config=${NWC_MODELS_CONFIG:-/etc/nwc/models.conf}
state=${NWC_MODELS_STATE:-/var/lib/nwc-models}
labels_file=""
interval=30
resync=600
wait_s=300
once=0
dry=0
nwcctl=${NWCCTL:-nwcctl}

log() { printf 'nwc-models: %s\n' "$*"; }
die_usage() { printf 'nwc-models: %s (--help)\n' "$*" >&2; exit 2; }
is_count() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }

while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --once) once=1 ;;
    --dry-run) dry=1 ;;
    --config | --state | --labels | --socket | --interval | --resync | --wait)
      [ $# -ge 2 ] || die_usage "$1 needs a value"
      case $1 in
        --config) config=$2 ;;
        --state) state=$2 ;;
        --labels) labels_file=$2 ;;
        --socket) NWC_SOCKET=$2; export NWC_SOCKET ;;
        --interval) interval=$2 ;;
        --resync) resync=$2 ;;
        --wait) wait_s=$2 ;;
      esac
      shift ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
  shift
done
for n in "$interval" "$resync" "$wait_s"; do is_count "$n" || die_usage "'$n' is not a number of seconds"; done
[ "$interval" -gt 0 ] || die_usage "--interval must be at least 1"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nwc-models.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# ---- nwcd ------------------------------------------------------------------------------------

# Runs a command that changes nwcd's state, or prints it under --dry-run.  1 when it failed.
act() {
  if [ "$dry" = 1 ]; then
    log "dry-run: $*"
    return 0
  fi
  log "run: $*"
  "$@" </dev/null >"$tmp/out" 2>&1 && { sed 's/^/  /' "$tmp/out"; return 0; }
  sed 's/^/  /' "$tmp/out"
  log "failed: $*"
  return 1
}

# nwcd's uptime in ms, or nothing when it does not answer.
uptime_ms() { "$nwcctl" stats 2>/dev/null | awk '$1 == "uptime_ms" { print $2 }'; }

wait_for_nwcd() {
  waited=0
  until [ -n "$(uptime_ms)" ]; do
    if [ "$wait_s" -gt 0 ] && [ "$waited" -ge "$wait_s" ]; then
      log "nwcd does not answer on ${NWC_SOCKET:-the default socket} after ${wait_s}s"
      return 1
    fi
    [ "$waited" = 0 ] && log "waiting for nwcd on ${NWC_SOCKET:-the default socket}"
    sleep 2
    waited=$((waited + 2))
  done
}

# ---- the node's labels -----------------------------------------------------------------------

# Writes the labels (key=value lines) to $tmp/labels; 1 when they cannot be had.
read_labels() {
  if [ -n "$labels_file" ]; then
    cat "$labels_file" >"$tmp/labels" || return 1
  elif [ -n "${NODE_NAME:-}" ]; then
    sa=/var/run/secrets/kubernetes.io/serviceaccount
    host=${KUBERNETES_SERVICE_HOST:?KUBERNETES_SERVICE_HOST is not set}
    case $host in *:*) host="[$host]" ;; esac # an IPv6 address
    curl -sSf --max-time 20 --cacert "$sa/ca.crt" -H "Authorization: Bearer $(cat "$sa/token")" \
      "https://$host:${KUBERNETES_SERVICE_PORT:-443}/api/v1/nodes/$NODE_NAME" |
      jq -r '.metadata.labels // {} | to_entries[] | "\(.key)=\(.value)"' >"$tmp/labels" || {
      log "cannot read the labels of node $NODE_NAME from the Kubernetes API"
      return 1
    }
  else
    : >"$tmp/labels"
  fi
}

# Does the node match NODES (all, or key=value / key terms, comma-separated, all must hold)?
node_matches() {
  [ "$1" = all ] && return 0
  old_ifs=$IFS
  IFS=,
  for term in $1; do
    IFS=$old_ifs
    case $term in
      *=*) grep -qxF -- "$term" "$tmp/labels" || return 1 ;;
      *) grep -q "^$(printf '%s' "$term" | sed 's/[].[*^$\\/]/\\&/g')=" "$tmp/labels" || return 1 ;;
    esac
  done
  IFS=$old_ifs
  return 0
}

# ---- models.conf -----------------------------------------------------------------------------

# Parses $config into $tmp/declared ("NAME REF ACTION DEVICE" for the models of this node) and
# $prune.  2 (after a "FILE:LINE: why" line) when the file is bad: nothing is done then.
parse_config() {
  prune=false
  : >"$tmp/declared"
  : >"$tmp/names"
  [ -r "$config" ] || { log "$config: cannot be read"; return 2; }
  lineno=0
  while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    line=${line%%#*}
    # shellcheck disable=SC2086 # split on blanks on purpose (globbing is off)
    set -- $line
    [ $# -eq 0 ] && continue
    where="$config:$lineno"
    if case $1 in prune | prune[=:]*) true ;; *) false ;; esac; then
      v=$(printf '%s' "$*" | sed 's/^prune *[=:] *//')
      case $v in true | false) prune=$v ;; *) log "$where: prune = true or false, got '$v'"; return 2 ;; esac
      continue
    fi
    [ $# -eq 5 ] || { log "$where: expected NAME REF ACTION DEVICE NODES, got $# fields"; return 2; }
    name=$1 ref=$2 action=$3 device=$4 nodes=$5
    printf '%s' "$name" | grep -qE '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' ||
      { log "$where: '$name' is not a model name ([A-Za-z0-9][A-Za-z0-9._-]*)"; return 2; }
    grep -qxF -- "$name" "$tmp/names" && { log "$where: model '$name' is declared twice"; return 2; }
    echo "$name" >>"$tmp/names"
    printf '%s' "$ref" | grep -qE '^[A-Za-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9_.-]+|@[a-z0-9]+:[0-9a-fA-F]+)?$' ||
      { log "$where: '$ref' is not a reference host[:port]/repo[:tag|@digest]"; return 2; }
    case $action in store | load | pin) ;; *) log "$where: ACTION is store, load or pin, not '$action'"; return 2 ;; esac
    printf '%s' "$device" | grep -qE '^(-|(split:)?(all|(cpu|cuda:[0-9]+)(,(cpu|cuda:[0-9]+))*))$' ||
      { log "$where: DEVICE is cpu, cuda:N, a list of them, all, split:PLACES or -, not '$device'"; return 2; }
    if node_matches "$nodes"; then
      echo "$name $ref $action $device" >>"$tmp/declared"
    else
      log "$name: not for this node ($nodes)"
    fi
  done <"$config"
}

# ---- one pass --------------------------------------------------------------------------------

# 0, 1 (some action failed), 2 (bad models.conf) or 3 (nwcd not answering).
reconcile() {
  wait_for_nwcd || return 3
  read_labels || return 1
  rc=0
  parse_config || return $?
  "$nwcctl" ls >"$tmp/ls" 2>&1 || { sed 's/^/  /' "$tmp/ls"; log "nwcctl ls failed"; return 1; }
  awk 'NR > 1 { print $1 }' "$tmp/ls" >"$tmp/present"
  managed="$state/managed"
  [ -r "$managed" ] || managed=/dev/null
  : >"$tmp/managed"

  while read -r name ref action device; do
    # Remembered before acting: a model whose pull fails is still ours to unpin later.
    echo "$name $action" >>"$tmp/managed"
    if grep -qxF -- "$name" "$tmp/present"; then
      log "$name: present, no pull"
    else
      log "$name: missing, pulling $ref"
      act "$nwcctl" pull "$ref" "$name" || { rc=1; continue; }
    fi
    was=$(awk -v n="$name" '$1 == n { print $2 }' "$managed")
    on=""
    case $device in
      -) ;;
      split:*) on="--device ${device#split:} --split" ;;
      *) on="--device $device" ;;
    esac
    case $action in
      pin) # loads (a replica on each place of DEVICE, or the split) and keeps it resident
        # shellcheck disable=SC2086
        act "$nwcctl" pin "$name" $on || rc=1 ;;
      load)
        [ "$was" = pin ] && { act "$nwcctl" unpin "$name" || rc=1; }
        # shellcheck disable=SC2086
        act "$nwcctl" load "$name" $on || rc=1 ;;
      store)
        [ "$was" = pin ] && { act "$nwcctl" unpin "$name" || rc=1; }
        log "$name: stored, not loaded" ;;
    esac
  done <"$tmp/declared"

  # Models this script declared before that are no longer declared for this node.
  while read -r name was; do
    awk -v n="$name" '$1 == n { found = 1 } END { exit !found }' "$tmp/managed" && continue
    if ! grep -qxF -- "$name" "$tmp/present"; then
      log "$name: no longer declared, not in the store"
      continue
    fi
    log "$name: no longer declared"
    act "$nwcctl" unpin "$name" || rc=1
    if [ "$prune" = true ]; then
      act "$nwcctl" rm "$name" || { rc=1; echo "$name store" >>"$tmp/managed"; } # retried next pass
    else
      log "$name: kept in the store (prune = false)"
    fi
  done <"$managed"

  if [ "$dry" = 0 ]; then
    mkdir -p "$state"
    cp "$tmp/managed" "$state/managed.tmp" && mv "$state/managed.tmp" "$state/managed"
  fi
  return $rc
}

# ---- main ------------------------------------------------------------------------------------

pass() {
  log "pass: $config$([ "$dry" = 1 ] && echo ' (dry run)')"
  set +e
  reconcile
  status=$?
  set -e
  case $status in
    0) log "pass done" ;;
    1) log "pass done with failures (exit 1)" ;;
    2) log "pass not done: fix $config" ;;
    3) log "pass not done: nwcd not answering" ;;
  esac
  # STATE/status: whether the declared models are in place ("models ready"), for people and
  # probes: `ok`, or the pass's exit status, then the time.
  if [ "$dry" = 0 ] && mkdir -p "$state" 2>/dev/null; then
    word=ok
    [ "$status" = 0 ] || word="failed $status"
    echo "$word $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$state/status.tmp" && mv "$state/status.tmp" "$state/status"
  fi
  return $status
}

fingerprint() { { cat "$config" 2>/dev/null; cat "$tmp/labels" 2>/dev/null; } | cksum; }

if [ "$once" = 1 ]; then
  pass
  exit $?
fi

last_print="" last_uptime=0 last_pass=0 now=0 due=$resync
while :; do
  up=$(uptime_ms)
  read_labels >/dev/null 2>&1 || true
  print=$(fingerprint)
  why=""
  if [ "$last_pass" = 0 ]; then why="start"
  elif [ -n "$up" ] && [ "$up" -lt "$last_uptime" ]; then why="nwcd restarted"
  elif [ "$print" != "$last_print" ]; then why="$config or the node's labels changed"
  elif [ $((now - last_pass)) -ge "$due" ]; then why="resync"
  fi
  if [ -n "$why" ]; then
    log "reconciling: $why"
    # A failed pass is tried again after 2 minutes (or at the next change), not every interval.
    if pass; then due=$resync; else due=$((resync < 120 ? resync : 120)); fi
    last_pass=$now
    [ "$last_pass" = 0 ] && last_pass=1
    last_print=$(fingerprint)
    up=$(uptime_ms)
  fi
  [ -n "$up" ] && last_uptime=$up
  sleep "$interval"
  now=$((now + interval))
done
