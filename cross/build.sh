#!/usr/bin/env bash
# Cross-builds the agent for ARM with Debian's rustc 1.85 and runs the
# aarch64 binary under qemu: `--version`, then one real task through the
# raw_exec driver.
#
#   cross/build.sh            aarch64 (and armv7 when its std is installed)
#
# Installs the toolchain first when it is missing (scripts/setup.sh --cross).
# Binaries land in target/cross/<triple>/release/k8s4r-agent, stripped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ ! -x /usr/bin/rustc ] || [ ! -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || ! command -v qemu-aarch64-static >/dev/null; then
    scripts/setup.sh --cross
fi

# Debian's rustc, not rustup's: the agent must build with 1.85. Its own
# target dir keeps these artifacts from invalidating the host build.
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_LINKER=arm-linux-gnueabihf-gcc
export CC_armv7_unknown_linux_gnueabihf=arm-linux-gnueabihf-gcc
target_dir="$root/target/cross"

targets=(aarch64-unknown-linux-gnu)
if [ -d /usr/lib/rustlib/armv7-unknown-linux-gnueabihf/lib ]; then
    targets+=(armv7-unknown-linux-gnueabihf)
else
    echo "cross: armv7 skipped: Debian's armhf Rust standard library is not installed"
fi

for triple in "${targets[@]}"; do
    echo "cross: building k8s4r-agent for $triple with $($RUSTC --version)"
    cargo build --release --locked --target "$triple" -p k8s4r-agent --target-dir "$target_dir"
    bin="$target_dir/$triple/release/k8s4r-agent"
    size=$(stat -c %s "$bin")
    echo "cross: $bin: $(file -b "$bin" | cut -d, -f1-2), $size bytes"
    if [ "$triple" = aarch64-unknown-linux-gnu ]; then
        awk -v s="$size" 'BEGIN { printf "BENCH agent_aarch64_binary_mib %.2f MiB\n", s / 1048576 }'
    fi
done

bin="$target_dir/aarch64-unknown-linux-gnu/release/k8s4r-agent"
qemu=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
echo "cross: running the aarch64 agent under qemu"
"${qemu[@]}" "$bin" --version
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$("${qemu[@]}" "$bin" run-task --state-dir "$work" --driver raw_exec -- /bin/sh -c 'echo "hello from $(uname -m)"')
echo "$out"
case "$out" in
    *"hello from aarch64"*) echo "cross: ok: a raw_exec task ran on the aarch64 agent" ;;
    *) echo "cross: the task's output is missing from the agent's report" >&2; exit 1 ;;
esac
