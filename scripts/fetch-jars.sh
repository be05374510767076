#!/usr/bin/env bash
# Fetch the jars pinned in icegate_dagster/spark/jars.lock from Maven Central, once.
#   scripts/fetch-jars.sh DEST
# A jar already in DEST with the pinned SHA-256 is kept (no request); any other is
# downloaded beside it, verified, then moved into place. A checksum mismatch fails, naming
# the jar, the expected and the actual SHA-256, and leaves nothing in DEST.
# ICEGATE_MAVEN_REPOSITORY: another repository with Maven's layout (a mirror);
# ICEGATE_JARS_LOCK: another lock file (the tests use both).
set -euo pipefail
dest="${1:?usage: fetch-jars.sh DEST}"
repo="${ICEGATE_MAVEN_REPOSITORY:-https://repo1.maven.org/maven2}"
lock="${ICEGATE_JARS_LOCK:-$(dirname "$0")/../icegate_dagster/spark/jars.lock}"
mkdir -p "$dest"

while read -r coordinates sha256 _; do
  case "$coordinates" in ''|'#'*) continue ;; esac
  IFS=: read -r group artifact version <<<"$coordinates"
  jar="$artifact-$version.jar"
  if [ -f "$dest/$jar" ] && [ "$(sha256sum "$dest/$jar" | cut -d' ' -f1)" = "$sha256" ]; then
    continue
  fi
  echo "setup: fetching $coordinates"
  partial="$dest/.$jar.partial"
  url="$repo/${group//.//}/$artifact/$version/$jar"
  if ! curl -fsSL --retry 3 -o "$partial" "$url"; then
    rm -f "$partial"
    echo "setup: could not fetch $coordinates from $url" >&2
    exit 1
  fi
  actual="$(sha256sum "$partial" | cut -d' ' -f1)"
  if [ "$actual" != "$sha256" ]; then
    rm -f "$partial"
    echo "setup: $coordinates ($jar) failed its checksum: expected SHA-256 $sha256, got $actual" >&2
    exit 1
  fi
  mv -f "$partial" "$dest/$jar"
done <"$lock"
