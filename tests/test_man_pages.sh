#!/bin/sh
# test_man_pages.sh BUILD_DIR - the man pages are built, render with man(1), and document every
# command nwcctl --help lists, every option of each command's --help (in nwcctl --help too) and
# every option nwcd --help lists.
set -u
b="$1"
fail=0
for page in nwcd.8 nwcctl.1; do
  [ -s "$b/docs/man/$page" ] || { echo "missing $b/docs/man/$page"; exit 1; }
done
command -v man >/dev/null 2>&1 || { echo "man(1) not installed; skipped"; exit 77; }
nwcctl_man=$(MANWIDTH=200 man -l "$b/docs/man/nwcctl.1" 2>/dev/null)
nwcd_man=$(MANWIDTH=200 man -l "$b/docs/man/nwcd.8" 2>/dev/null)
for cmd in $("$b/client/nwcctl" --help 2>&1 | sed -n 's/^  \([a-z]*\).*/\1/p'); do
  echo "$nwcctl_man" | grep -q "^       $cmd\b" || { echo "nwcctl.1 does not document '$cmd'"; fail=1; }
done
# Every option of a command's --help is in nwcctl --help and in nwcctl.1.
nwcctl_help=$("$b/client/nwcctl" --help 2>&1)
for cmd in $(echo "$nwcctl_help" | sed -n 's/^  \([a-z]*\).*/\1/p'); do
  for opt in $("$b/client/nwcctl" "$cmd" --help 2>&1 | grep -o -- '--[a-z0-9-]*' | sort -u); do
    echo "$nwcctl_help" | grep -q -- "$opt" || { echo "nwcctl --help does not show $cmd's '$opt'"; fail=1; }
    echo "$nwcctl_man" | grep -q -- "$opt" || { echo "nwcctl.1 does not document $cmd's '$opt'"; fail=1; }
  done
done
for opt in $("$b/daemon/nwcd" --help 2>&1 | grep -o -- '--[a-z-]*' | sort -u); do
  echo "$nwcd_man" | grep -q -- "$opt" || { echo "nwcd.8 does not document '$opt'"; fail=1; }
done
[ $fail -eq 0 ] && echo "test_man_pages: ok"
exit $fail
