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

# One real task through raw_exec (which a robot offers only when told to):
# the host runs `k8s4r up` without a local agent, the aarch64 agent under
# qemu registers with it over MQTT, and a Job selecting that robot must
# complete with the task's output on its Task.
echo "cross: running a task on the aarch64 agent through k8s4r up"
(unset RUSTC; cargo build --quiet --locked -p k8s4r)
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# A port nothing listens on (a connection to it is refused).
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
    done
}
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
"${qemu[@]}" "$bin" --robot-id qemu-arm64 --token "$(cat "$work/up/bootstrap-token")" \
    --broker-url "mqtt://127.0.0.1:$mqtt_port" --state-dir "$work/agent" --label arch=arm64 \
    --heartbeat-interval 5s --raw-exec true --allow-root true >"$work/agent.log" 2>&1 &
pids+=($!)
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: robot.k8s4r.io/v1alpha1
kind: Job
metadata:
  name: hello-arm64
  namespace: default
spec:
  robotSelector:
    matchLabels:
      arch: arm64
  taskGroups:
    - name: hello
      count: 1
      task:
        driver: raw_exec
        command: /bin/sh
        args: ["-c", "echo hello from the arm64 agent"]
        timeout: 1m
YAML
if ! kubectl wait --for=jsonpath='{.status.state}'=completed jobs.robot.k8s4r.io/hello-arm64 --timeout=120s; then
    echo "cross: the job did not complete; agent log:" >&2
    tail -40 "$work/agent.log" >&2
    kubectl get robots,rtask -A -o wide >&2 || true
    exit 1
fi
out=$(kubectl get rtask -n default -l robot.k8s4r.io/job=hello-arm64 -o jsonpath='{.items[0].status.outputTail}')
robot=$(kubectl get rtask -n default -l robot.k8s4r.io/job=hello-arm64 -o jsonpath='{.items[0].spec.targetRobot}')
# The agent is the emulated aarch64 binary (it reports its own arch); the
# task's /bin/sh is a host binary, which qemu-user runs natively.
arch=$(kubectl get robot qemu-arm64 -o jsonpath='{.status.device.arch}')
echo "cross: task ran on $robot (agent arch $arch): $out"
case "$robot/$arch/$out" in
    "qemu-arm64/aarch64/hello from the arm64 agent"*) echo "cross: ok: a raw_exec task ran through the aarch64 agent" ;;
    *) echo "cross: expected output 'hello from the arm64 agent' from robot qemu-arm64 reporting arch aarch64" >&2; exit 1 ;;
esac
