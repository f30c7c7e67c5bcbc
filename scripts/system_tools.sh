#!/usr/bin/env bash
# Install the system programs the tests drive (Chromium with chromedriver, Prometheus with promtool, Docker
# with docker-compose and mmdebstrap)
# from Debian's packages when they are missing and this user can; say so when it cannot: the tests
# that need them then skip with that reason (fail, where CI is set).
set -u
missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || { [[ " ${missing[*]} " == *" prometheus "* ]] || missing+=(prometheus); }
# The compose test: a Docker engine, the Python docker-compose, and mmdebstrap for a base image built here.
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system tools: ${missing[*]} missing and no apt-get here; the browser, Prometheus and compose tests will skip (and fail in CI)" >&2
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
        echo "system tools: ${missing[*]} missing and no root to install them; the browser, Prometheus and compose tests will skip (and fail in CI)" >&2
        exit 0
    fi
fi
echo "system tools: installing ${missing[*]} (Debian packages)"
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/tmp/seam-system-tools.log 2>&1; then
    echo "system tools: installing ${missing[*]} failed (see /tmp/seam-system-tools.log); the tests that need them will skip (and fail in CI)" >&2
fi
exit 0
