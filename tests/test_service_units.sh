#!/bin/sh
# test_service_units.sh - `systemd-analyze verify` on systemd/nwcd.socket and nwcd.service, with
# ExecStart pointed at the nwcd just built (the installed path does not exist in a build tree).
# Any message from verify fails the test; 77 (skip) where systemd-analyze is missing.
# usage: test_service_units.sh SOURCE_DIR NWCD_PATH
set -eu
src=$1 nwcd=$2
command -v systemd-analyze >/dev/null 2>&1 || { echo "no systemd-analyze; skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/nwc-units-XXXXXX")
trap 'rm -rf "$dir"' EXIT
sed "s|^ExecStart=/usr/sbin/nwcd|ExecStart=$nwcd|" "$src/systemd/nwcd.service" > "$dir/nwcd.service"
cp "$src/systemd/nwcd.socket" "$dir/nwcd.socket"
grep -q "^ExecStart=$nwcd " "$dir/nwcd.service" || { echo "ExecStart not found in nwcd.service"; exit 1; }
out=$(cd "$dir" && systemd-analyze verify --man=no ./nwcd.socket ./nwcd.service 2>&1) || {
  echo "systemd-analyze verify failed:"; echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "systemd-analyze verify printed:"; echo "$out"; exit 1; fi
# Every hardening directive in the service carries a comment line right above it.
awk '/^\[Service\]/{s=1;next} /^\[/{s=0} s && /^[A-Za-z]/ && prev !~ /^#/ && prev !~ /^[A-Za-z]/ {
       print "uncommented: " $0; bad=1 } {prev=$0} END{exit bad}' "$src/systemd/nwcd.service"
echo "units verified with $(systemd-analyze --version | head -1)"
