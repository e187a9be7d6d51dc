#!/usr/bin/env bash
# Builds the container image offline (scripts/image.sh) from the debug
# binaries and runs the test that starts the image's programs as the
# Deployments in deploy/ run them (tests/tests/image.rs). scripts/test.sh
# calls it. Needs buildah, podman and runc: scripts/setup.sh installs them.
#
#   scripts/image-test.sh                  build as scripts/test.sh does, then test
#   scripts/image-test.sh --bin-dir DIR    k8s4r-server and k8s4r-manager already built in DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=""
case "${1:-}" in
    --bin-dir) bin_dir=$(cd "${2:?--bin-dir needs a directory}" && pwd) ;;
    "") ;;
    *) echo "image-test.sh: unknown argument $1" >&2; exit 2 ;;
esac
cd "$root"

for tool in buildah podman runc; do
    command -v "$tool" >/dev/null || {
        echo "image-test.sh: $tool is not installed: run scripts/setup.sh" >&2
        exit 1
    }
done
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
# The workspace's test build, as scripts/test.sh's: right after it nothing
# is rebuilt, and it leaves the two programs in target/debug (their
# integration tests need them). Building them alone would resolve the
# dependencies' features differently and rebuild much of the tree; a
# release build would add many minutes on a 2-core machine. The image is
# the same but for the binaries.
cargo_test=(cargo test --workspace --all-features --locked)
if [ -z "$bin_dir" ]; then
    "${cargo_test[@]}" --no-run
    bin_dir=$target_dir/debug
fi
archive=$target_dir/image/k8s4r-debug.oci.tar
scripts/image.sh --bin-dir "$bin_dir" --output "$archive"
K8S4R_IMAGE_ARCHIVE=$archive "${cargo_test[@]}" --test image -- --ignored
