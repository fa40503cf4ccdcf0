# registry_env.sh - sourced by tests/test_registry.sh and bench/bench_registry.sh: a real
# docker-registry and real nwcd started on this machine's loopback and temporary directories.
# Needs: $t (a temporary directory), $py, $nwcd, $nwcctl, and an array pids (each process
# started is added, for the caller's cleanup).
free_port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# registry NAME PORT: starts one (storage $t/NAME), records its pid in reg_NAME
registry() {
  cat >"$t/$1.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $t/$1
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$2
log:
  level: info
  accesslog:
    disabled: false
EOF
  docker-registry serve "$t/$1.yml" >>"$t/$1.log" 2>&1 &
  pids+=($!)
  eval "reg_$1=$!"
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$2/v2/" >/dev/null && return 0; sleep 0.1; done
  echo "registry $1 did not start"; cat "$t/$1.log"; exit 1
}
daemon() { # NAME: nwcd on store $t/NAME, socket $t/NAME.sock
  NWCD_CONFIG= "$nwcd" --store "$t/$1" --socket "$t/$1.sock" --backend cpu --threads 2 >"$t/$1.d.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do "$nwcctl" --socket "$t/$1.sock" stats >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "nwcd $1 did not start"; cat "$t/$1.d.log"; exit 1
}
# make_model SEED PATH ROWS: a safetensors file of random BF16 weights: ROWS x 4096 ("big.weight"),
# 96 x 512 with a bias, 7 x 9.
make_model() {
$py - "$1" "$2" "$3" <<'EOF'
import json, struct, sys, numpy as np
rng = np.random.default_rng(int(sys.argv[1]))
def bf16(shape):
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32).__rshift__(16).astype(np.uint16)
ts = {"big.weight": bf16((int(sys.argv[3]), 4096)), "small.weight": bf16((96, 512)), "small.bias": bf16((96,)), "odd": bf16((7, 9))}
hdr, off, blobs = {}, 0, []
for k, v in ts.items():
    b = v.tobytes(); hdr[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
    off += len(b); blobs.append(b)
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
EOF
}
