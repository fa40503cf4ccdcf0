# common.sh - sourced by scripts/test and scripts/demo: install what the build needs on Debian 12
# (only what is missing, so a prepared machine needs no network), then configure and build.
# python3-numpy, -torch, -pytest and -tqdm are for the Python package's tests (tests/python), run by
# Debian's /usr/bin/python3.  libcurl4-openssl-dev, libgcrypt20-dev and libssl-dev build oci/
# (nwc_oci); docker-registry, skopeo, apache2-utils (htpasswd), openssl and python3-jwt are for
# its test (tests/test_oci.c).

nwc_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# Debian packages the build and the tests need (strace and systemd-analyze for the service tests,
# scdoc and man-db for the man pages, python3-yaml for test_deploy_manifests; docker-registry,
# skopeo, htpasswd, openssl, curl and Python's jwt for the registry tests and the demo), and tools
# (command:package) that may also come from elsewhere (a machine with its own Node.js has npm without Debian's package).
nwc_packages=(build-essential cmake pkg-config clang strace systemd scdoc man-db
  libjansson-dev libxxhash-dev libsqlite3-dev libuv1-dev liburing-dev libsystemd-dev libinih-dev
  libcurl4-openssl-dev libgcrypt20-dev libssl-dev
  python3-numpy python3-torch python3-pytest python3-tqdm python3-yaml
  docker-registry skopeo apache2-utils openssl curl python3-jwt python3-cryptography)
nwc_tools=(python3:python3 npm:npm)

nwc_install_deps() {
  local missing=()
  for p in "${nwc_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  for t in "${nwc_tools[@]}"; do
    command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# nwc_build DIR [cmake options...]: configure (once) and build into DIR.
nwc_build() {
  local dir="$1"
  shift
  cmake -S "$nwc_root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
}
