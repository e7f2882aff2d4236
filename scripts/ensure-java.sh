#!/usr/bin/env bash
# Java 17+ is needed by the PySpark tests. Install Debian's JDK when we can; otherwise stop clearly.
set -euo pipefail
java_major() {
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
    exit 0
fi
echo "Java 17 not found: installing Debian's openjdk-17-jre-headless" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null \
        && exit 0
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null \
        && exit 0
fi
echo "ERROR: the PySpark tests need Java 17 or newer and it could not be installed automatically." >&2
echo "Install a JDK 17 (e.g. 'apt-get install openjdk-17-jre-headless') and set JAVA_HOME, then rerun." >&2
exit 1
