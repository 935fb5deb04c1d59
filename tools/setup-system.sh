#!/usr/bin/env bash
# System packages tablequeue needs, installed only when missing (Debian/Ubuntu):
#   postgresql       server binaries for the throwaway test/demo cluster (no cluster is created:
#                    the tool runs its own, so nothing keeps running after tests or the demo)
#   unixodbc tdsodbc ODBC driver manager and FreeTDS, for pyodbc -> SQL Server
#   openjdk-17-jre-headless, libpostgresql-jdbc-java   Spark (PySpark) and its JDBC reader
#   openjdk-17-jdk-headless  the compiler module that runs examples/postgres/Example.java as one
#                    file (`java Example.java`), and compiles the SQL Server twin (tests/test_examples.py)
#   valgrind         the benchmark's instruction counts (callgrind runs a second throwaway server)
#   pgbouncer        the transaction-pooling tests (tests/test_pgbouncer.py starts its own, never the service)
#   python3-venv     only where the Python in use cannot create a virtual environment
set -euo pipefail

packages=(postgresql postgresql-contrib unixodbc tdsodbc openjdk-17-jre-headless openjdk-17-jdk-headless libpostgresql-jdbc-java valgrind pgbouncer)
if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    packages+=(python3-venv)
fi

missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "setup: missing system packages: ${missing[*]}; install them as root (apt-get install ...)" >&2
    exit 1
fi

echo "setup: installing ${missing[*]}"
# Debian's postgresql package would create and start a 'main' cluster on port 5432; we never use it.
"${sudo[@]}" mkdir -p /etc/postgresql-common
if [ ! -e /etc/postgresql-common/createcluster.conf ] || ! grep -q "^create_main_cluster" /etc/postgresql-common/createcluster.conf; then
    echo "create_main_cluster = false" | "${sudo[@]}" tee -a /etc/postgresql-common/createcluster.conf >/dev/null
fi
"${sudo[@]}" apt-get update -qq
# --force-confold keeps the createcluster.conf written above instead of stopping at dpkg's prompt.
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" >/dev/null
