#!/usr/bin/env bash
# Sets up everything shopstream needs on a fresh Debian machine, idempotently:
# a virtual environment with the pinned Python packages, the Debian packages
# (redis-server, Maven) when missing, and the JVM jars from Maven Central.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }

# --- Debian packages -------------------------------------------------------
need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
# javac compiles the project's Java classes (pipelines/infra/jvm): the validation's field
# reader (without it slower, not wrong) and the stream's dedup (without it the stream
# needs SHOPSTREAM_STREAM_DEDUP=spark)
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
if ((${#need_apt[@]})); then
  if [ "$(id -u)" = 0 ]; then
    log "installing Debian packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "missing: ${need_apt[*]} — install them (e.g. sudo apt-get install ${need_apt[*]}) and re-run" >&2
    exit 1
  fi
fi
# Debian's package starts a system-wide redis on 6379 when it can; shopstream runs
# its own, so stop the one this script just installed.
if [[ " ${need_apt[*]:-} " == *" redis-server "* ]] && command -v service >/dev/null 2>&1; then
  service redis-server stop >/dev/null 2>&1 || true
fi

# --- Python ----------------------------------------------------------------
stamp="$VENV/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "creating $VENV and installing pinned packages (first run takes a few minutes)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dev]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
else
  log "python packages up to date ($VENV)"
fi

# --- JVM jars (Kafka broker, Spark's Kafka connector, shopstream's jar) -
log "resolving and building JVM jars (cached under ~/.cache/shopstream)"
"$VENV/bin/shopstream" infra jars
# Spark's classes, parsed once for every driver JVM (a driver starts about a third faster);
# drivers start without it, so a failure here only warns
log "building Spark's class archive (cached; about a minute the first time)"
"$VENV/bin/shopstream" infra class-archive \
  || log "warning: no class archive; Spark drivers will start without it (slower)"
log "ready"
