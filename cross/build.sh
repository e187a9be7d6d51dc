#!/usr/bin/env bash
# Cross-builds the agent for every ARM target the project names, with
# Debian's rustc 1.85, and runs each binary under qemu: `--version`, then one
# real task through the raw_exec driver.
#
#   cross/build.sh            aarch64 and armv7: build (profile `robot`), run a task on each
#   cross/build.sh --check    `cargo check` of the agent for armv7 only: a 32-bit
#                             target catches the type errors (rlim_t, usize) that
#                             a 64-bit host build cannot, in about a minute
#
# armv7 is not optional: when Debian's armhf Rust standard library cannot be
# installed this fails, saying so. K8S4R_SKIP_ARMV7=1 skips armv7 on purpose
# (for a machine whose Debian mirror has no armhf packages), and says so.
#
# Installs the toolchain first when it is missing (scripts/setup.sh --cross).
# Binaries land in target/cross/<triple>/robot/k8s4r-agent, stripped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
check=0
[ "${1:-}" = "--check" ] && check=1

aarch64=aarch64-unknown-linux-gnu
armv7=armv7-unknown-linux-gnueabihf
skip_armv7=0
[ "${K8S4R_SKIP_ARMV7:-0}" = 1 ] && skip_armv7=1

if [ ! -x /usr/bin/rustc ] || [ ! -d "/usr/lib/rustlib/$aarch64" ] || ! command -v qemu-aarch64-static >/dev/null ||
    { [ "$skip_armv7" -eq 0 ] && [ ! -d "/usr/lib/rustlib/$armv7/lib" ]; }; then
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

targets=("$aarch64")
if [ "$skip_armv7" -eq 1 ]; then
    echo "cross: WARNING: armv7 skipped because K8S4R_SKIP_ARMV7=1: the 32-bit agent is neither checked nor run" >&2
elif [ -d "/usr/lib/rustlib/$armv7/lib" ]; then
    targets+=("$armv7")
else
    echo "cross: Debian's armhf Rust standard library is not installed (/usr/lib/rustlib/$armv7), so the armv7 agent" >&2
    echo "cross: cannot be built; scripts/setup.sh --cross installs it. To skip armv7 on purpose, set K8S4R_SKIP_ARMV7=1" >&2
    exit 1
fi

if [ "$check" -eq 1 ]; then
    [ "$skip_armv7" -eq 1 ] && exit 0
    echo "cross: cargo check of the agent for $armv7 (32-bit) with $($RUSTC --version)"
    cargo check --locked --target "$armv7" -p k8s4r-agent -p k8s4r-drivers --target-dir "$target_dir"
    exit 0
fi

for triple in "${targets[@]}"; do
    echo "cross: building k8s4r-agent for $triple with $($RUSTC --version)"
    cargo build --profile robot --locked --target "$triple" -p k8s4r-agent --target-dir "$target_dir"
    bin="$target_dir/$triple/robot/k8s4r-agent"
    size=$(stat -c %s "$bin")
    echo "cross: $bin: $(file -b "$bin" | cut -d, -f1-2), $size bytes"
    case "$triple" in
        "$aarch64") name=agent_aarch64_binary_mib ;;
        "$armv7") name=agent_armv7_binary_mib ;;
    esac
    awk -v s="$size" -v n="$name" 'BEGIN { printf "BENCH %s %.2f MiB\n", n, s / 1048576 }'
done

# One real task through raw_exec (which a robot offers only when told to) on
# each target: the host runs `k8s4r up` without a local agent, the agent
# under qemu registers with it over MQTT, and a Job selecting that robot
# must complete with the task's output on its Task.
(unset RUSTC; cargo build --quiet --locked -p k8s4r)
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=../scripts/free-port.sh
. "$root/scripts/free-port.sh"
api_port=$(free_port)
mqtt_port=$(free_port)
while [ "$mqtt_port" = "$api_port" ]; do mqtt_port=$(free_port); done
"$root/target/debug/k8s4r" --data-dir "$work/up" --log warn up --local-agent=false \
    --api-bind "127.0.0.1:$api_port" --mqtt-bind "127.0.0.1:$mqtt_port" >"$work/up.log" 2>&1 &
pids+=($!)
export KUBECONFIG="$work/up/kubeconfig"
for _ in $(seq 1 300); do
    grep -q "k8s4r is up" "$work/up.log" && break
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/up.log"; exit 1; }
    sleep 0.1
done
grep -q "k8s4r is up" "$work/up.log" || { echo "cross: k8s4r up did not start" >&2; cat "$work/up.log"; exit 1; }

# run_task TRIPLE QEMU SYSROOT LABEL ARCH: the agent built for TRIPLE, under
# QEMU with the target's libraries from SYSROOT, registers as robot
# qemu-LABEL and runs a task; its Robot must report ARCH (the agent's own
# std::env::consts::ARCH, so it is the emulated binary that answered).
run_task() {
    local triple=$1 qemu=$2 sysroot=$3 label=$4 arch=$5
    local bin="$target_dir/$triple/robot/k8s4r-agent" robot="qemu-$label" job="hello-$label"
    echo "cross: running the $triple agent under $qemu"
    "$qemu" -L "$sysroot" "$bin" --version
    "$qemu" -L "$sysroot" "$bin" --robot-id "$robot" --token "$(cat "$work/up/bootstrap-token")" \
        --broker-url "mqtt://127.0.0.1:$mqtt_port" --state-dir "$work/agent-$label" --label "arch=$label" \
        --heartbeat-interval 5s --raw-exec true --allow-root true >"$work/agent-$label.log" 2>&1 &
    pids+=($!)
    kubectl apply -f - >/dev/null <<YAML
apiVersion: robot.k8s4r.io/v1alpha1
kind: Job
metadata:
  name: $job
  namespace: default
spec:
  robotSelector:
    matchLabels:
      arch: $label
  taskGroups:
    - name: hello
      count: 1
      task:
        driver: raw_exec
        command: /bin/sh
        args: ["-c", "echo hello from the $label agent"]
        timeout: 1m
YAML
    if ! kubectl wait --for=jsonpath='{.status.state}'=completed "jobs.robot.k8s4r.io/$job" --timeout=120s; then
        echo "cross: the job did not complete; agent log:" >&2
        tail -40 "$work/agent-$label.log" >&2
        kubectl get robots,rtask -A -o wide >&2 || true
        exit 1
    fi
    local out ran reported
    out=$(kubectl get rtask -n default -l "robot.k8s4r.io/job=$job" -o jsonpath='{.items[0].status.outputTail}')
    ran=$(kubectl get rtask -n default -l "robot.k8s4r.io/job=$job" -o jsonpath='{.items[0].spec.targetRobot}')
    reported=$(kubectl get robot "$robot" -o jsonpath='{.status.device.arch}')
    # The task's /bin/sh is a host binary, which qemu-user runs natively.
    echo "cross: task ran on $ran (agent arch $reported): $out"
    case "$ran/$reported/$out" in
        "$robot/$arch/hello from the $label agent"*) echo "cross: ok: a raw_exec task ran through the $triple agent" ;;
        *)
            echo "cross: expected output 'hello from the $label agent' from robot $robot reporting arch $arch" >&2
            exit 1
            ;;
    esac
}

for triple in "${targets[@]}"; do
    case "$triple" in
        "$aarch64") run_task "$triple" qemu-aarch64-static /usr/aarch64-linux-gnu arm64 aarch64 ;;
        "$armv7") run_task "$triple" qemu-arm-static /usr/arm-linux-gnueabihf armv7 arm ;;
    esac
done
