#!/usr/bin/env bash
# Set up a fresh machine: Debian packages Spark's catalog needs, then a virtualenv in .venv.
# Safe to re-run: each step is skipped when already done.
# --test also installs what tests/surfaces starts: Chromium, a PostgreSQL and a MariaDB server,
# and Prometheus (its server and promtool, for the exporter's and the alert rules' tests).
# --spark4 also makes .venv-spark4: the same package on PySpark 4.1 (constraints-spark4.txt),
# with the jars of icegate_dagster/spark/jars-spark4.lock and its own class archive
# (scripts/test.sh passes it when it runs its Spark-4 tier).
set -euo pipefail
cd "$(dirname "$0")/.."
test_deps=false
spark4=false
for option in "$@"; do
  case "$option" in
    --test) test_deps=true ;;
    --spark4) spark4=true ;;
    *) echo "setup: unknown option $option (known: --test, --spark4)" >&2; exit 2 ;;
  esac
done

apt_packages=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || apt_packages+=(libxerial-sqlite-jdbc-java)
[ -f /usr/share/java/postgresql.jar ] || apt_packages+=(libpostgresql-jdbc-java)
command -v java >/dev/null 2>&1 || apt_packages+=(openjdk-17-jre-headless)
if "$test_deps"; then
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

# setup_line VENV CONSTRAINTS LOCK: a virtualenv with the package on one Spark line, the
# line's jars (by its lock) and its class-data sharing archive.
setup_line() {
  local venv="$1" constraints="$2" lock="$3"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

  # Reinstall only when the dependency files changed since the last set-up.
  local stamp="$venv/.icegate-setup-stamp" want
  want="$(cat pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing Python packages into $venv (first run takes a minute)"
    # (this machine kind's pip.conf names local indexes that may be absent: hide that noise)
    "$venv/bin/pip" install -q --disable-pip-version-check -c "$constraints" -e ".[dev,postgres,mysql,connect]" \
      2> >(grep -v "is neither a file nor a directory" >&2)
    rm -f "$venv"/share/icegate/spark-driver-classes*.jsa  # made from the packages just replaced
    echo "$want" > "$stamp"
  fi

  # Iceberg's and Hadoop's jars by their Maven coordinates, pinned by SHA-256 in the line's
  # lock: fetched once (a verified jar is never fetched again), never at session start.
  # ICEGATE_SPARK_JARS_DIR: another folder (Spark then looks there too).
  local jars_dir="${ICEGATE_SPARK_JARS_DIR:-$venv/share/icegate/jars}"
  ICEGATE_JARS_LOCK="$lock" scripts/fetch-jars.sh "$jars_dir"
  # The archive below is made over these jars: a new jar set needs a new archive. Its file
  # is named by the Spark line (icegate_dagster.spark.jvm_options.classes_archive).
  local jar_set jar_stamp="$venv/share/icegate/spark-driver-classes.jars"
  jar_set="$(sha256sum "$lock" | cut -d' ' -f1) $jars_dir"
  if [ ! -f "$jar_stamp" ] || [ "$(cat "$jar_stamp")" != "$jar_set" ]; then
    rm -f "$venv"/share/icegate/spark-driver-classes*.jsa
  fi

  # Spark's driver classes in a class-data sharing archive: every cold process (a CLI call, a
  # Dagster run) then starts its Spark session in about half the time. Without it, as before.
  local archive
  archive="$("$venv/bin/python" -c \
    'from icegate_dagster.spark.jvm_options import classes_archive; print(classes_archive())')"
  if [ ! -f "$archive" ]; then
    echo "setup: archiving Spark's classes for faster starts (a minute, once)"
    if "$venv/bin/python" -m icegate_dagster.spark.class_archive; then
      echo "$jar_set" > "$jar_stamp"
    fi
  fi
}

setup_line .venv constraints.txt icegate_dagster/spark/jars.lock
if "$spark4"; then
  # constraints.txt with constraints-spark4.txt's pins in place of its own for those packages.
  mkdir -p .venv-spark4
  replaced="$(grep -Eo '^[A-Za-z0-9_.-]+==' constraints-spark4.txt | sed 's/==$//' | paste -sd'|')"
  { grep -Eiv "^($replaced)==" constraints.txt; grep -Ev '^(#|$)' constraints-spark4.txt; } \
    > .venv-spark4/constraints.txt
  setup_line .venv-spark4 .venv-spark4/constraints.txt icegate_dagster/spark/jars-spark4.lock
fi
