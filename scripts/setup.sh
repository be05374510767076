#!/usr/bin/env bash
# Set up a fresh machine: Debian packages Spark's catalog needs, then a virtualenv in .venv.
# Safe to re-run: each step is skipped when already done.
# --test also installs what tests/surfaces starts: Chromium, a PostgreSQL and a MariaDB server,
# and Prometheus (its server and promtool, for the exporter's and the alert rules' tests).
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || apt_packages+=(libxerial-sqlite-jdbc-java)
[ -f /usr/share/java/postgresql.jar ] || apt_packages+=(libpostgresql-jdbc-java)
command -v java >/dev/null 2>&1 || apt_packages+=(openjdk-17-jre-headless)
if [ "${1:-}" = "--test" ]; then
  [ -x /usr/bin/chromium ] || apt_packages+=(chromium)
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || apt_packages+=(postgresql)
  [ -x /usr/sbin/mariadbd ] || apt_packages+=(mariadb-server)
  [ -x /usr/bin/promtool ] || apt_packages+=(prometheus)
fi
if [ "${#apt_packages[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing Debian packages: ${apt_packages[*]}"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
    "${apt_packages[@]}" >/dev/null
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "setup: Python 3.11 is required ($python is $("$python" --version 2>&1)); set PYTHON=" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

# Reinstall only when the dependency files changed since the last set-up.
stamp=.venv/.icegate-setup-stamp
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run takes a minute)"
  # (this machine kind's pip.conf names local indexes that may be absent: hide that noise)
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev,postgres,mysql,connect]" \
    2> >(grep -v "is neither a file nor a directory" >&2)
  rm -f .venv/share/icegate/spark-driver-classes.jsa  # made from the packages just replaced
  echo "$want" > "$stamp"
fi

# Iceberg's and Hadoop's jars by their Maven coordinates, pinned by SHA-256 in
# icegate_dagster/spark/jars.lock: fetched once (a verified jar is never fetched again),
# never at session start. ICEGATE_SPARK_JARS_DIR: another folder (Spark then looks there too).
jars_dir="${ICEGATE_SPARK_JARS_DIR:-.venv/share/icegate/jars}"
scripts/fetch-jars.sh "$jars_dir"
# The archive below is made over these jars: a new jar set needs a new archive.
jar_set="$(sha256sum icegate_dagster/spark/jars.lock | cut -d' ' -f1) $jars_dir"
jar_stamp=.venv/share/icegate/spark-driver-classes.jars
if [ ! -f "$jar_stamp" ] || [ "$(cat "$jar_stamp")" != "$jar_set" ]; then
  rm -f .venv/share/icegate/spark-driver-classes.jsa
fi

# Spark's driver classes in a class-data sharing archive: every cold process (a CLI call, a
# Dagster run) then starts its Spark session in about half the time. Without it, as before.
if [ ! -f .venv/share/icegate/spark-driver-classes.jsa ]; then
  echo "setup: archiving Spark's classes for faster starts (a minute, once)"
  if .venv/bin/python -m icegate_dagster.spark.class_archive; then
    echo "$jar_set" > "$jar_stamp"
  fi
fi
