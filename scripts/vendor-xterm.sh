#!/bin/sh
# Fetches the dashboard terminal's emulator (xterm.js and its fit addon)
# from npm at pinned versions, checks each package against the integrity
# pinned here, and writes the files the dashboard compiles into the
# binary under cli/src/dashboard/assets/vendor/. Run it to move to a new
# version (change the versions and integrities below); the build never
# reaches the network.
set -eu

XTERM=6.0.0
XTERM_SHA512=TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==
FIT=0.11.0
FIT_SHA512=jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/cli/src/dashboard/assets/vendor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fetch() { # package version sha512 -> unpacked in $work/$1
    name=$1 version=$2 sum=$3
    (cd "$work" && npm pack --silent "$name@$version" >/dev/null)
    tgz=$(ls "$work"/*.tgz)
    got=$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)
    if [ "$got" != "$sum" ]; then
        echo "vendor-xterm: $name@$version is not the package pinned here (sha512 $got)" >&2
        exit 1
    fi
    mkdir -p "$work/$name"
    tar xzf "$tgz" -C "$work/$name"
    rm "$tgz"
}

fetch @xterm/xterm "$XTERM" "$XTERM_SHA512"
fetch @xterm/addon-fit "$FIT" "$FIT_SHA512"
mkdir -p "$out"
cp "$work/@xterm/xterm/package/lib/xterm.js" "$out/xterm.js"
cp "$work/@xterm/xterm/package/css/xterm.css" "$out/xterm.css"
cp "$work/@xterm/xterm/package/LICENSE" "$out/LICENSE-xterm"
cp "$work/@xterm/addon-fit/package/lib/addon-fit.js" "$out/addon-fit.js"
cp "$work/@xterm/addon-fit/package/LICENSE" "$out/LICENSE-addon-fit"
printf 'xterm.js %s (@xterm/xterm), fit addon %s (@xterm/addon-fit), from npm by scripts/vendor-xterm.sh\n' "$XTERM" "$FIT" > "$out/VERSIONS"
echo "vendor-xterm: wrote $out"
