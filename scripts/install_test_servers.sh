#!/usr/bin/env bash
# The system packages the test suite's real servers and oracles need, from Debian (the README's test
# command runs this first; .ci/run runs that command).  Each test that needs one skips with the reason
# where it is absent, so on a machine without apt (or without root) this says what it skipped and the
# suite still runs.
#   nginx-light            HTTP range reads (tests/remote)
#   default-jre-headless   Bio-Formats reads the exports (tests/export/test_export_bioformats.py)
#   chromium, chromium-driver   the viewer page in a headless browser (tests/serve/test_viewer_browser.py)
#   orthanc, orthanc-dicomweb   a DICOMweb archive (tests/remote/test_dicomweb*.py)
# and, from npm where node and npm are there, Azurite (Microsoft's Azure Blob Storage emulator) for the
# az:// tests (tests/remote/test_remote_gcs_azure.py) into ~/.cache/wsitool-test/azurite, outside the
# repository (WSITOOL_AZURITE_DIR overrides the folder).
set -u
AZURITE_DIR="${WSITOOL_AZURITE_DIR:-$HOME/.cache/wsitool-test/azurite}"
if [ ! -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ]; then
    if command -v npm >/dev/null 2>&1; then
        { mkdir -p "$AZURITE_DIR" && (cd "$AZURITE_DIR" && timeout 300 npm install --no-audit --no-fund --silent azurite@3); } \
            >/dev/null 2>&1 || echo "install_test_servers: npm could not install azurite; the az:// emulator tests will skip" >&2
    else
        echo "install_test_servers: no npm; the az:// emulator tests will skip" >&2
    fi
fi
PACKAGES="nginx-light default-jre-headless chromium chromium-driver orthanc orthanc-dicomweb"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_test_servers: no apt-get; the tests needing$missing will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "install_test_servers: not root and no sudo; the tests needing$missing will skip" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# The packages' own services are not wanted (the tests start their own on free ports).
if [ ! -e /usr/sbin/policy-rc.d ] && [ -z "$SUDO" ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
fi
{ $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $missing; } >/dev/null 2>&1 \
    || echo "install_test_servers: apt-get could not install$missing; those tests will skip" >&2
[ "${made_policy:-0}" = 1 ] && rm -f /usr/sbin/policy-rc.d
exit 0
