#!/usr/bin/env bash
# The project's test command: everything CI checks, on a fresh Debian machine
# with Rust. Installs what the tests need first (scripts/setup.sh).
#
#   scripts/test.sh           setup, 32-bit check, format, lints, CRD drift, tests, image, unit file,
#                             ARM builds (aarch64, armv7) each running a task under qemu
#   scripts/test.sh --quick   skip the ARM cross builds and the 32-bit check
#
# K8S4R_SKIP_ARMV7=1 skips armv7 on purpose (a Debian mirror without armhf
# packages); without it, a machine that cannot build armv7 fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
[ "${1:-}" = "--quick" ] && quick=1

# Each step says when it began, in seconds since the run's start: where a
# slow run spent its time.
started=$SECONDS
step() { printf '\n==> [%ss] %s\n' "$((SECONDS - started))" "$*"; }

# A clean run of everything below needs about 10 GB in target/ (measured:
# 6.8 GB for the lints and the test build, 2 GB for the image's release
# build, 1 GB for the ARM builds and their 32-bit check). Without the room
# the linker dies mid-build, which does not say why: say it first.
avail_kb=$(df -Pk "$root" | awk 'NR == 2 { print $4 }')
if [ "${avail_kb:-0}" -lt $((11 * 1024 * 1024)) ]; then
    echo "warning: only $((avail_kb / 1024)) MiB free under $root; a clean run needs about 10 GB" >&2
fi

# No incremental compilation: a run of this script builds everything once,
# and the incremental caches are as large as the binaries (34 GB beside
# 30 GB in a developer's target/); with them CI ran out of disk linking a
# test. A developer who re-runs it often may set CARGO_INCREMENTAL=1.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step "setup"
if [ "$quick" -eq 1 ]; then scripts/setup.sh; else scripts/setup.sh --cross; fi

if [ "$quick" -eq 0 ]; then
    # Early and short: a 32-bit build of the agent fails on type errors a
    # 64-bit host never shows (rlim_t is 32 bits on armv7), in about a minute
    # instead of at the end of the run.
    step "the agent on a 32-bit target (cargo check, armv7)"
    cross/build.sh --check
fi

step "format"
cargo fmt --all --check

step "shape: the protocol's shells stay thin (scripts/shape.py)"
scripts/shape.py

step "lints"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "CRDs in deploy/crds match the Rust types"
cargo run --quiet --locked -p k8s4r-api --features kube --bin crdgen -- --check

step "systemd unit"
# verify insists that ExecStart exists; check a copy that points at a real binary.
unit_dir=$(mktemp -d)
sed -e "s#/var/lib/k8s4r/agent/current#$(command -v true)#" -e "s#/var/lib/k8s4r/agent/confirmed#$(command -v true)#" \
    systemd/k8s4r-agent.service > "$unit_dir/k8s4r-agent.service"
verify_out=$(systemd-analyze verify "$unit_dir/k8s4r-agent.service" 2>&1) || { echo "$verify_out"; exit 1; }
rm -rf "$unit_dir"
if [ -n "$verify_out" ]; then echo "$verify_out"; echo "systemd-analyze verify reported problems" >&2; exit 1; fi
echo "systemd-analyze verify: clean"

step "tests"
cargo test --workspace --all-features --locked

step "the container image: built without a registry, its programs started as deploy/ runs them"
scripts/image-test.sh

if [ "$quick" -eq 0 ]; then
    step "ARM cross builds of the agent (rustc 1.85, aarch64 and armv7) and a task on each under qemu"
    cross/build.sh
fi
echo
echo "all checks passed in $((SECONDS - started))s"
