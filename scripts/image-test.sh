#!/usr/bin/env bash
# Builds the container image offline from the debug binaries
# (scripts/image.sh) and runs the test that starts the image's programs as
# the Deployments in deploy/ run them (tests/tests/image.rs). scripts/test.sh
# calls it. Needs buildah, podman and runc: scripts/setup.sh installs them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

for tool in buildah podman runc; do
    command -v "$tool" >/dev/null || {
        echo "image-test.sh: $tool is not installed: run scripts/setup.sh" >&2
        exit 1
    }
done
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
# Debug binaries: a release build would add minutes on a 2-core machine,
# and the image is the same but for them.
cargo build --locked -p k8s4r-server -p k8s4r-manager
archive=$target_dir/image/k8s4r-debug.oci.tar
scripts/image.sh --bin-dir "$target_dir/debug" --output "$archive"
K8S4R_IMAGE_ARCHIVE=$archive cargo test --locked -p k8s4r-e2e --test image -- --ignored
