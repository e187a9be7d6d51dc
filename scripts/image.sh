#!/usr/bin/env bash
# Builds the cluster image (k8s4r-server and k8s4r-manager) without any
# container registry: the base is the binaries plus exactly the shared
# libraries they load (ldd), Debian's CA certificates and a passwd file
# with the nonroot user, put together by buildah from scratch. The result
# is an OCI archive of the image the Deployments in deploy/ name.
#
#   scripts/image.sh                       release build, then the archive
#   scripts/image.sh --bin-dir target/debug   binaries already built there
#   scripts/image.sh --output FILE         where the archive goes
#                                          (default: <target dir>/image/k8s4r-<tag>.oci.tar)
#
# Then `podman load -i FILE`, or push it on with
# `skopeo copy oci-archive:FILE docker://registry.example.com/k8s4r:<tag>`.
# The Containerfile describes the same image for a build that pulls its
# bases from a registry: binaries at /usr/local/bin, user 65532:65532,
# entrypoint k8s4r-server. Needs buildah (scripts/setup.sh installs it);
# run as a user other than root, it needs that user's /etc/subuid range.
# The same commit and binaries give the same image digest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# Paths given are the caller's, relative to where it stands.
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bin_dir=""
output=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir=$(absolute "${2:?--bin-dir needs a directory}"); shift 2 ;;
        --output) output=$(absolute "${2:?--output needs a file}"); shift 2 ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$root"

die() { echo "image.sh: $*" >&2; exit 1; }
command -v buildah >/dev/null || die "buildah is not installed: run scripts/setup.sh (or apt-get install buildah)"

# The image every Deployment under deploy/cluster names; they must agree.
images=$(sed -n 's/^ *image: *\([^ ]*\) *$/\1/p' deploy/cluster/*.yaml | sort -u)
[ -n "$images" ] || die "no 'image:' in deploy/cluster/*.yaml"
[ "$(printf '%s\n' "$images" | wc -l)" -eq 1 ] || die "the Deployments name different images: $(echo $images)"
image=$images
tag=${image##*:}

programs=(k8s4r-server k8s4r-manager)
if [ -z "$bin_dir" ] || [ -z "$output" ]; then
    target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    [ -n "$target_dir" ] || die "cargo metadata did not say where the target directory is"
fi
if [ -z "$bin_dir" ]; then
    # As the Containerfile builds them.
    cargo build --release --locked -p k8s4r-server -p k8s4r-manager
    bin_dir=$target_dir/release
fi
for program in "${programs[@]}"; do
    [ -x "$bin_dir/$program" ] || die "$bin_dir/$program is missing: build it (cargo build -p $program) or leave out --bin-dir for a release build"
done
[ -n "$output" ] || output=$target_dir/image/k8s4r-$tag.oci.tar
mkdir -p "$(dirname "$output")"

# Not root: go on inside buildah's user namespace, where files can belong
# to root and to the nonroot user (mapped through /etc/subuid).
if [ "$(id -u)" -ne 0 ]; then
    exec buildah unshare "$root/scripts/image.sh" --bin-dir "$bin_dir" --output "$output"
fi

# A private store, so that nothing is left in the machine's and two builds
# do not meet; vfs needs neither overlayfs nor fuse.
work=$(mktemp -d)
store=(--root "$work/root" --runroot "$work/run" --storage-driver vfs)
cleanup() {
    buildah "${store[@]}" rm --all >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

rootfs=$work/rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot"
for program in "${programs[@]}"; do
    install -m 0755 "$bin_dir/$program" "$rootfs/usr/local/bin/$program"
done
# The shared libraries the programs load, at the paths the loader finds them.
libraries=$(for program in "${programs[@]}"; do ldd "$bin_dir/$program"; done |
    sed -n 's#.*=> \(/[^ ]*\) .*#\1#p; s#^[[:space:]]*\(/[^ ]*\) (.*#\1#p' | sort -u)
[ -n "$libraries" ] || die "ldd found no libraries for ${programs[*]} (are they dynamically linked x86-64/arm64 programs?)"
for library in $libraries; do
    mkdir -p "$rootfs$(dirname "$library")"
    cp -L "$library" "$rootfs$library"
done
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca_bundle" ] || die "$ca_bundle is missing: apt-get install ca-certificates (scripts/setup.sh does)"
install -m 0644 "$ca_bundle" "$rootfs$ca_bundle"
# Users as distroless names them: root, and nonroot (65532) that the
# programs run as.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
chmod 1777 "$rootfs/tmp"
chown 65532:65532 "$rootfs/home/nonroot"

# The image's creation time is the last commit's, so that a rebuild of
# the same commit from the same binaries gives the same image.
created=$(git log -1 --format=%ct 2>/dev/null || date +%s)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
container=$(buildah "${store[@]}" from scratch)
# Copied into the mounted container (rather than `buildah copy`, which
# would make every file root's) so that owners and modes stay as set.
cp -a "$rootfs/." "$(buildah "${store[@]}" mount "$container")/"
buildah "${store[@]}" umount "$container" >/dev/null
buildah "${store[@]}" config \
    --user 65532:65532 \
    --entrypoint '["/usr/local/bin/k8s4r-server"]' \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.title=k8s4r \
    --label "org.opencontainers.image.version=$version" \
    --label org.opencontainers.image.description="k8s4r-server and k8s4r-manager" \
    "$container"
buildah "${store[@]}" commit --quiet --format oci --timestamp "$created" "$container" "$image" >/dev/null
rm -f "$output"
buildah "${store[@]}" push --quiet "$image" "oci-archive:$output:$image"
echo "image.sh: $image written to $output ($(du -h "$output" | cut -f1))"
