#!/usr/bin/env bash
# Installs what the tests and the ARM cross build need on a fresh Debian 12
# machine with Rust (via rustup). Idempotent: does nothing that is already done.
#
#   scripts/setup.sh            a C toolchain, Mosquitto, systemd-analyze, openssl,
#                               buildah, podman, catatonit, skopeo and docker-registry,
#                               headless Chromium with chromedriver
#                               and the tests' npm packages (axe-core), moto (a second
#                               S3 server, in target/moto); checks that kubectl (1.27+)
#                               is there
#   scripts/setup.sh --cross    the above plus the aarch64/armv7 cross toolchain
#                               (K8S4R_SKIP_ARMV7=1 leaves armv7 out, saying so)
#
# The cross toolchain is Debian's rustc 1.85 (rustc-web) plus Debian's
# standard library for the target, because the agent must also build with
# 1.85 and rustup cannot download targets here.
set -euo pipefail

RUST_WEB_VERSION="1.85.0+dfsg3-1~deb12u3"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

apt_updated=""
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "${pkg%%=*}" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ -z "$apt_updated" ]; then
        # A mirror caught mid-sync fails one index; the others still serve.
        $SUDO apt-get update -qq || echo "setup: warning: apt-get update reported errors; trying with the lists it has"
        apt_updated=1
    fi
    echo "setup: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The tests drive the machine's kubectl. Debian's own (kubernetes-client) is
# 1.20, too old for server-side apply as the tests use it, and it cannot be
# installed over a newer one; so kubectl is checked, not installed.
check_kubectl() {
    local minor
    if ! command -v kubectl >/dev/null; then
        echo "setup: kubectl 1.27 or newer is needed by the tests and is not on PATH;" >&2
        echo "setup: install it from https://kubernetes.io/docs/tasks/tools/install-kubectl-linux/" >&2
        exit 1
    fi
    minor=$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n 1) || true
    if [ -z "$minor" ] || [ "$minor" -lt 27 ]; then
        echo "setup: kubectl $(command -v kubectl) is older than 1.27 (minor ${minor:-unknown}); the tests need 1.27 or newer" >&2
        exit 1
    fi
}

base() {
    # gcc and libc6-dev: the linker rustc calls, and ring's C parts.
    # mosquitto-clients: mosquitto_pub and _sub, to poke a broker by hand
    # (e.g. the oversized-message check in RELIABILITY.md).
    # libfaketime: the randomized fault run steps robots' wall clocks with
    # it (tests/src/chaos.rs). util-linux: mount (a tmpfs per robot for the
    # full-disk faults) and ipcmk (the task uid clean-up test).
    apt_install gcc libc6-dev mosquitto mosquitto-clients systemd openssl libfaketime util-linux python3
    # The container image, built without a registry (scripts/image.sh:
    # buildah, and the CA bundle it copies in) and started by its test
    # (podman with runc: crun 1.8 refuses a hybrid cgroup hierarchy).
    apt_install ca-certificates buildah podman runc
    # The podman driver's tests: catatonit (the PID 1 podman's --init
    # gives each task's container), a real registry the test image is
    # pushed to and pulled from by digest, and skopeo (`k8s4r image push`
    # makes its OCI archives with it).
    apt_install catatonit docker-registry skopeo
    # Tests start their own broker on a free port; the packaged service is
    # not needed and would hold port 1883.
    if command -v systemctl >/dev/null && systemctl is-active --quiet mosquitto 2>/dev/null; then
        $SUDO systemctl stop mosquitto || true
    fi
    # Likewise the packaged registry (port 5000): tests start their own.
    if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
        $SUDO systemctl stop docker-registry || true
    fi
}

# The dashboard's end-to-end tests drive headless Chromium through
# chromedriver (testbed/src/browser.rs) and inject axe-core, pinned in
# tests/browser/package-lock.json, for the accessibility checks. npm runs
# only when node_modules is missing or the lock changed since it last ran,
# so a machine without the registry can run this again once it is set up.
browser() {
    apt_install chromium chromium-driver
    command -v npm >/dev/null || apt_install nodejs npm
    local dir="$ROOT/tests/browser"
    local stamp="$dir/node_modules/.setup-lock.sha256"
    local lock
    lock=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
    if [ -f "$dir/node_modules/axe-core/axe.min.js" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$lock" ]; then
        return 0
    fi
    echo "setup: installing the browser tests' npm packages (tests/browser)"
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
    echo "$lock" >"$stamp"
}

# The task outputs' tests run the upload path against a second S3
# implementation, independent of the embedded one (s3s): moto's server,
# from PyPI, pinned, in a virtualenv under target/ (Debian's python3
# refuses pip installs outside one).
MOTO_VERSION="5.2.1"
s3() {
    apt_install python3-venv
    local venv="$ROOT/target/moto"
    if [ -x "$venv/bin/moto_server" ] && "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
        return 0
    fi
    echo "setup: installing moto[server]==$MOTO_VERSION (a second S3 implementation for the tests) in $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION"
}

# Debian's libstd for a foreign architecture cannot be apt-installed beside
# the native one (multiarch version clash), so its rustlib is unpacked by hand.
install_target_std() {
    local deb_arch=$1 triple=$2
    [ -d "/usr/lib/rustlib/$triple/lib" ] && return 0
    if ! dpkg --print-foreign-architectures | grep -qx "$deb_arch"; then
        $SUDO dpkg --add-architecture "$deb_arch"
        apt_updated=""
    fi
    if [ -z "$apt_updated" ]; then
        $SUDO apt-get update -qq || return 1
        apt_updated=1
    fi
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -qq "libstd-rust-web-dev:$deb_arch=$RUST_WEB_VERSION" "libstd-rust-web-1.85:$deb_arch=$RUST_WEB_VERSION")
    for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/root"; done
    $SUDO mkdir -p /usr/lib/rustlib
    $SUDO cp -a "$tmp/root/usr/lib/rustlib/$triple" /usr/lib/rustlib/
    rm -rf "$tmp"
    echo "setup: installed Debian's Rust standard library for $triple"
}

cross() {
    apt_install "rustc-web=$RUST_WEB_VERSION" "cargo-web=$RUST_WEB_VERSION" \
        "libstd-rust-web-dev=$RUST_WEB_VERSION" "libstd-rust-web-1.85=$RUST_WEB_VERSION" \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross gcc-arm-linux-gnueabihf libc6-dev-armhf-cross \
        qemu-user-static file binutils-aarch64-linux-gnu binutils-arm-linux-gnueabihf
    install_target_std arm64 aarch64-unknown-linux-gnu
    # armv7 is a target the project names: a machine that cannot install
    # its standard library fails here, unless told to skip it on purpose
    # (K8S4R_SKIP_ARMV7=1, for a mirror without armhf packages). A target
    # skipped in silence is a target nobody tests.
    if [ "${K8S4R_SKIP_ARMV7:-0}" = 1 ]; then
        echo "setup: WARNING: armv7 skipped because K8S4R_SKIP_ARMV7=1"
    elif ! install_target_std armhf armv7-unknown-linux-gnueabihf; then
        echo "setup: Debian's armhf Rust standard library (libstd-rust-web-dev:armhf=$RUST_WEB_VERSION) could not be" >&2
        echo "setup: installed, so the armv7 agent cannot be built or tested. Fix the mirror, or set" >&2
        echo "setup: K8S4R_SKIP_ARMV7=1 to skip armv7 on purpose." >&2
        exit 1
    fi
    /usr/bin/rustc --version
}

base
browser
s3
if [ "${1:-}" = "--cross" ]; then
    cross
fi
# Last, so that everything else is installed when it stops the run.
check_kubectl
