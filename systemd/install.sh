#!/usr/bin/env bash
# Installs the k8s4r agent as a systemd service on a robot: the first
# install, or an upgrade by hand (later ones can come through an
# AgentRollout, which needs upgrade_public_keys in agent.toml).
#
#   systemd/install.sh [--binary PATH] [--config PATH] [--no-start]
#
# --binary  the agent binary (default: target/robot/k8s4r-agent, else
#           target/release/k8s4r-agent, else the aarch64 build under target/cross)
# --config  a config file to install as /etc/k8s4r/agent.toml (default: the
#           example next to this script, only when none is installed yet)
# --no-start  install and enable the unit, but do not start it
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
binary=""
config=""
start=1
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --config) config=$2; shift 2 ;;
        --no-start) start=0; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$binary" ]; then
    for candidate in "$root/target/robot/k8s4r-agent" "$root/target/release/k8s4r-agent" \
        "$root/target/cross/aarch64-unknown-linux-gnu/robot/k8s4r-agent"; do
        [ -x "$candidate" ] && binary=$candidate && break
    done
fi
[ -n "$binary" ] && [ -x "$binary" ] || { echo "install.sh: no agent binary; build one (cargo build --profile robot -p k8s4r-agent or cross/build.sh) or pass --binary" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }

# The binary goes into its upgrade slot and becomes both the current and
# the confirmed one: an install by hand is trusted. Each link is replaced
# by a rename, so a power cut leaves the old link or the new one.
version=$("$binary" --version | awk '{ print $2 }')
case "$version" in
    ""|.*|*/*) echo "install.sh: $binary --version did not name a version" >&2; exit 1 ;;
esac
agent_dir=/var/lib/k8s4r/agent
install -d -m 0750 /etc/k8s4r /var/lib/k8s4r
install -d -m 0700 "$agent_dir" "$agent_dir/slots/$version"
install -m 0700 "$binary" "$agent_dir/slots/$version/k8s4r-agent.new"
mv -f "$agent_dir/slots/$version/k8s4r-agent.new" "$agent_dir/slots/$version/k8s4r-agent"
for link in confirmed current; do
    ln -sfn "slots/$version/k8s4r-agent" "$agent_dir/.$link.new"
    mv -Tf "$agent_dir/.$link.new" "$agent_dir/$link"
done
rm -f "$agent_dir/trial.json"
sync -f "$agent_dir"
# For people: `k8s4r-agent --check-config` runs the current binary.
ln -sfn "$agent_dir/current" /usr/local/bin/k8s4r-agent
if [ -n "$config" ]; then
    install -m 0600 "$config" /etc/k8s4r/agent.toml
elif [ ! -e /etc/k8s4r/agent.toml ]; then
    install -m 0600 "$here/agent.toml.example" /etc/k8s4r/agent.toml
    echo "install.sh: wrote /etc/k8s4r/agent.toml from the example: set the broker and the bootstrap token"
fi
# Refuse a config the agent cannot read before systemd starts it in a loop.
/usr/local/bin/k8s4r-agent --config /etc/k8s4r/agent.toml --check-config
install -m 0644 "$here/k8s4r-agent.service" /etc/systemd/system/k8s4r-agent.service
systemctl daemon-reload
if [ "$start" -eq 1 ]; then
    if systemctl is-active --quiet k8s4r-agent; then
        # An upgrade: the new binary takes over. Services keep running (the
        # new agent re-adopts them); batch tasks are stopped and reported.
        echo "install.sh: restarting k8s4r-agent on the new binary (services keep running)"
        systemctl enable k8s4r-agent
        systemctl restart k8s4r-agent
    else
        systemctl enable --now k8s4r-agent
    fi
    systemctl --no-pager status k8s4r-agent || true
else
    systemctl enable k8s4r-agent
fi
