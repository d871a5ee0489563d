#!/usr/bin/env bash
# Checks that vendor/glommio is the published glommio crate, minus the files we leave out, plus
# vendor/glommio.patch — byte for byte. With --write-patch, rewrites vendor/glommio.patch from
# the tree as it is (after a deliberate change to vendor/glommio), then checks.
#
# The published crate comes from cargo's registry cache; if it is not there, a `cargo fetch` of
# a throwaway project that depends on it downloads the .crate into the cache (network needed
# once). Needs: cargo, tar, diff, patch.
set -euo pipefail

version=0.9.0
here=$(cd "$(dirname "$0")" && pwd)
vendored="$here/glommio"
patchfile="$here/glommio.patch"
# Upstream files the build does not use, left out of vendor/glommio (the patch removes their
# [[bench]] entries from Cargo.toml). `.cargo-ok` is cargo's own extraction marker.
left_out=(Cargo.toml.orig benches liburing/debian liburing/examples liburing/man liburing/test)
ignored=(.cargo-ok)

write=false
case "${1:-}" in
  "") ;;
  --write-patch) write=true ;;
  *) echo "usage: $0 [--write-patch]" >&2; exit 2 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cache="${CARGO_HOME:-$HOME/.cargo}/registry/cache"
find_crate() { ls "$cache"/*/"glommio-$version.crate" 2>/dev/null | head -n 1; }
crate=$(find_crate || true)
if [ -z "$crate" ]; then
  echo "glommio-$version.crate is not in $cache: fetching it" >&2
  mkdir -p "$tmp/fetch/src"
  printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nglommio = "=%s"\n' \
    "$version" > "$tmp/fetch/Cargo.toml"
  echo 'fn main() {}' > "$tmp/fetch/src/main.rs"
  cargo fetch --quiet --manifest-path "$tmp/fetch/Cargo.toml"
  crate=$(find_crate)
fi

# a/: the published crate without the left-out files. b/: a copy of the vendored tree.
mkdir -p "$tmp/a"
tar -xzf "$crate" -C "$tmp/a" --strip-components=1
for p in "${left_out[@]}"; do rm -rf "${tmp:?}/a/$p"; done
cp -a "$vendored" "$tmp/b"
for p in "${ignored[@]}"; do rm -rf "${tmp:?}/b/$p"; done

if $write; then
  # No timestamps in the headers, so that the file changes only when the diff does.
  (cd "$tmp" && diff -ruN a b || true) | sed -E 's/^((---|\+\+\+) [^\t]*)\t.*$/\1/' > "$patchfile"
  echo "wrote $patchfile" >&2
fi

(cd "$tmp/a" && patch -p1 --quiet --forward --no-backup-if-mismatch < "$patchfile")
if diff -r "$tmp/a" "$tmp/b" > "$tmp/drift"; then
  echo "vendor/glommio = glommio $version (published, minus ${left_out[*]}) + vendor/glommio.patch"
else
  echo "vendor/glommio differs from glommio $version + vendor/glommio.patch:" >&2
  cat "$tmp/drift" >&2
  echo "a deliberate change? run $0 --write-patch and explain it in vendor/README.md" >&2
  exit 1
fi
