#!/usr/bin/env bash
# The README's first command as a newcomer meets it: a clean clone of this
# repository's HEAD (committed work only), then the README's first `cargo run`
# line exactly as it is written there (`cargo run --profile local -p k8s4r --
# up --demo`), until the demo job finishes.
#
#   scripts/bench-first-command.sh [--timings]
#
# Prints
#   BENCH first_command_build_s   start of the command to cargo's "Running" line
#   BENCH first_command_demo_s    cargo's "Running" line to "job ... completed"
# and the load average. Crates come from cargo's own cache (CARGO_HOME) when
# they are there, so a first download is not counted; `cargo fetch` shows
# what that adds. --timings keeps cargo's build timings report (the path is
# printed). The demo runs with a home of its own (a fresh data dir) and on free
# ports, set through the command's K8S4R_* variables, not its arguments.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
timings=0
[ "${1:-}" = "--timings" ] && timings=1

work=$(mktemp -d)
pid=""
cleanup() {
    [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    [ "$timings" -eq 1 ] || rm -rf "$work"
}
trap cleanup EXIT

git clone -q "$root" "$work/k8s4r"
echo "bench: clean clone of $(git -C "$root" rev-parse --short HEAD) in $work/k8s4r"
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo} RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
export HOME="$work/home"
mkdir -p "$HOME"
# shellcheck source=free-port.sh
. "$root/scripts/free-port.sh"
K8S4R_API_BIND="127.0.0.1:$(free_port)"
K8S4R_MQTT_BIND="127.0.0.1:$(free_port)"
K8S4R_DASHBOARD_LISTEN="127.0.0.1:$(free_port)"
export K8S4R_API_BIND K8S4R_MQTT_BIND K8S4R_DASHBOARD_LISTEN

cd "$work/k8s4r"
command=$(grep -m 1 '^cargo run ' README.md | sed 's/[[:space:]]*#.*$//')
[ -n "$command" ] || { echo "bench: no 'cargo run' line in README.md" >&2; exit 1; }
# With --timings only when asked, right after `cargo run`.
[ "$timings" -eq 1 ] && command="cargo run --timings ${command#cargo run }"
echo "bench: $command"
start=$(date +%s.%N)
bash -c "$command" >"$work/out.log" 2>"$work/err.log" &
pid=$!
built=""
deadline=$((SECONDS + 3600))
while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    if [ -z "$built" ] && grep -q 'Running `target/[a-z]*/k8s4r' "$work/err.log"; then
        built=$(date +%s.%N)
        awk -v a="$start" -v b="$built" 'BEGIN { printf "BENCH first_command_build_s %.1f s\n", b - a }'
    fi
    if [ -n "$built" ] && grep -qE '^job .* (completed|failed)$' "$work/out.log"; then
        done_at=$(date +%s.%N)
        grep -E '^job ' "$work/out.log"
        awk -v a="$built" -v b="$done_at" 'BEGIN { printf "BENCH first_command_demo_s %.1f s\n", b - a }'
        echo "bench: load average $(cut -d' ' -f1-3 /proc/loadavg)"
        [ "$timings" -eq 1 ] && echo "bench: timings in $work/k8s4r/target/cargo-timings/cargo-timing.html"
        grep -qE '^job .* completed$' "$work/out.log" || exit 1
        exit 0
    fi
    sleep 0.5
done
echo "bench: the command ended (or an hour passed) before the demo job finished" >&2
tail -30 "$work/err.log" "$work/out.log" >&2
exit 1
