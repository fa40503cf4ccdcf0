#!/bin/sh
# test_client_install.sh BUILD_DIR SOURCE_DIR - `cmake --install` into a temporary root, then a
# program outside the tree (client_consumer.c) is built against the installed header and
# nwc-client.pc twice, with the shared and with the static libnwc-client, and both talk to the
# installed nwcd: one imports a random BF16 safetensors file (fresh each run, seed printed), both
# dequantize its tensors, and the bytes must equal the file's own; the installed nwcctl lists
# them with no LD_LIBRARY_PATH, and the installed Python package (nwc) lists them too.
set -u
b=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
die() { echo "test_client_install: $*" >&2; [ -f "$tmp/nwcd.log" ] && tail -20 "$tmp/nwcd.log" >&2; exit 1; }

DESTDIR="$tmp/root" cmake --install "$b" >"$tmp/install.log" 2>&1 ||
  { tail -5 "$tmp/install.log" >&2; die "cmake --install failed"; }
pc=$(find "$tmp/root" -name nwc-client.pc | head -1)
[ -n "$pc" ] || die "nwc-client.pc not installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir nwc-client)
prefix=$(pkg-config --variable=prefix nwc-client)
[ -f "$libdir/libnwc-client.a" ] || die "libnwc-client.a not installed in $libdir"
cc=${CC:-cc}
# NWC_CONSUMER_FLAGS: what the build's own objects need at link time (the sanitizer build's).
cflags="-std=c11 -Wall -Werror ${NWC_CONSUMER_FLAGS:-} $(pkg-config --cflags nwc-client)"
# shellcheck disable=SC2086
$cc $cflags "$src/tests/client_consumer.c" -o "$tmp/consumer-shared" $(pkg-config --libs nwc-client) \
  || die "building against the shared library failed"
static_libs=$(pkg-config --static --libs nwc-client | sed 's/-lnwc-client//')
# shellcheck disable=SC2086
$cc $cflags "$src/tests/client_consumer.c" -o "$tmp/consumer-static" "$libdir/libnwc-client.a" \
  $static_libs || die "building against the static library failed"
ldd "$tmp/consumer-static" | grep -q libnwc-client && die "the static consumer still needs libnwc-client.so"

seed=${NWC_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "test_client_install: seed $seed"
python3 - "$tmp/w.safetensors" "$seed" <<'PY' || die "writing the input failed"
import json, random, struct, sys
rng = random.Random(int(sys.argv[2]))
shapes = {"w.a": (24, 520), "w/b": (3, 1100), "bias": (1, 77)}
blobs, header, off = [], {}, 0
for name, (r, c) in shapes.items():
    vals = [rng.gauss(0.0, 0.02) for _ in range(r * c)]
    b = b"".join(struct.pack("<f", v)[2:] for v in vals)  # BF16 by truncation
    header[name] = {"dtype": "BF16", "shape": [r, c], "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
for name in shapes:
    s, e = header[name]["data_offsets"]
    with open(sys.argv[1] + "." + name.replace("/", "_") + ".ref", "wb") as f:
        f.write(b"".join(blobs)[s:e])
PY

nwcd=$(find "$tmp/root" -path '*bin/nwcd' | head -1)
[ -x "$nwcd" ] || die "nwcd not installed"
mkdir "$tmp/store"
NWCD_CONFIG= "$nwcd" --store "$tmp/store" --socket "$tmp/nwcd.sock" --backend cpu >"$tmp/nwcd.log" 2>&1 &
pid=$!
i=0
while [ ! -S "$tmp/nwcd.sock" ]; do
  i=$((i + 1)); [ $i -gt 100 ] && die "nwcd did not start"; sleep 0.1
done
LD_LIBRARY_PATH="$libdir" "$tmp/consumer-shared" "$tmp/nwcd.sock" import m "$tmp/w.safetensors" \
  || die "import through the shared library failed"
for kind in shared static; do
  for t in w.a w/b bias; do
    ref="$tmp/w.safetensors.$(echo "$t" | tr / _).ref"
    LD_LIBRARY_PATH="$libdir" "$tmp/consumer-$kind" "$tmp/nwcd.sock" dequant m "$t" "$tmp/out" \
      || die "dequant of $t through the $kind library failed"
    cmp -s "$tmp/out" "$ref" || die "$kind: dequant of $t differs from the file's bytes"
  done
done
# The installed nwcctl runs as installed, with no LD_LIBRARY_PATH (its RUNPATH finds the library).
ctl=$(find "$tmp/root" -path '*bin/nwcctl' | head -1)
env -u LD_LIBRARY_PATH "$ctl" --socket "$tmp/nwcd.sock" ls m >"$tmp/ls.out" 2>&1 && grep -q ' w/b$' "$tmp/ls.out" ||
  die "the installed nwcctl does not run: $(cat "$tmp/ls.out")"
# The Python package, installed into the target Python's site-packages under the prefix, with
# a _paths.py naming the installed libdir; from DESTDIR it needs NWC_CLIENT_LIBRARY to find it.
init=$(find "$tmp/root" -path '*-packages/nwc/__init__.py' | head -1)
if [ -x /usr/bin/python3 ] && [ -n "$init" ]; then
  site=$(dirname "$(dirname "$init")")
  want=$(cd "$prefix" && pwd)
  want=${want#"$tmp/root"}  # the prefix the package will live under, without DESTDIR
  grep -q "LIBDIR = \"$want/" "$site/nwc/_paths.py" ||
    die "nwc/_paths.py: $(cat "$site/nwc/_paths.py")"
  list="import nwc; c = nwc.connect('$tmp/nwcd.sock')
print(*[f'{m.name} {m.tensors}' for m in c.models()])"
  out=$(env LD_PRELOAD="${NWC_PY_PRELOAD:-}" ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$site" \
    PYTHONDONTWRITEBYTECODE=1 NWC_CLIENT_LIBRARY="$libdir/libnwc-client.so.0" \
    /usr/bin/python3 -c "$list" 2>&1)
  [ "$out" = "m 3" ] || die "the installed nwc package: $out"
elif [ -x /usr/bin/python3 ]; then
  die "the nwc package was not installed"
fi
kill -TERM "$pid"; wait "$pid"; st=$?; pid=
[ $st -eq 0 ] || die "nwcd exited with $st after SIGTERM"
# CUDA builds: libnwc-cuda is installed beside it (nwc_cuda.h, nwc-cuda.pc requiring nwc-client),
# exports only nwc_cuda_*, and a program built outside the tree links against it; libnwc-client
# itself needs no CUDA library.
readelf -d "$libdir/libnwc-client.so" | grep NEEDED | grep -qi cuda && die "libnwc-client.so needs a CUDA library"
gpu=""
if [ -f "$libdir/pkgconfig/nwc-cuda.pc" ]; then
  cat >"$tmp/gpu_consumer.c" <<'C'
#include <nwc_cuda.h>
#include <stdio.h>
int main(int argc, char **argv) {
  nwc_client *c;
  if (argc < 2 || nwc_client_connect(argv[1], &c) < 0) return 1;
  nwc_cuda_map *m;
  int rc = nwc_cuda_map_model(c, "m", 0, &m);
  printf("%d %s\n", rc, rc < 0 ? nwc_cuda_last_error() : "");
  if (rc == 0) nwc_cuda_unmap(m);
  nwc_client_free(c);
  return 0;
}
C
  # shellcheck disable=SC2046
  $cc -std=c11 -Wall -Werror ${NWC_CONSUMER_FLAGS:-} $(pkg-config --cflags nwc-cuda) "$tmp/gpu_consumer.c" \
    -o "$tmp/gpu-consumer" $(pkg-config --libs nwc-cuda) || die "building against libnwc-cuda failed"
  bad=$(nm -D --defined-only "$libdir/libnwc-cuda.so" | awk '$2 == "T" && $3 !~ /^nwc_cuda_/ {print $3}')
  [ -z "$bad" ] || die "libnwc-cuda.so exports $bad"
  gpu=", libnwc-cuda built against"
fi
echo "test_client_install: ok (shared and static libnwc-client$gpu, prefix $prefix)"
