#!/usr/bin/env bash
# One-call GPU check of wsitool's device="cuda" path (issue 7).
#
# Usage: scripts/gpu_check.sh OUTDIR
#
# On a machine with an NVIDIA GPU (x86-64, Python 3.12; no internet needed when
# the wheels travel in .whl/, see scripts/gpu_fetch_wheels.sh):
#   1. installs what is missing: wheels from .whl/ (pip --no-index --no-deps into
#      a --target folder put first on PYTHONPATH) if that folder holds any, else
#      from PyPI (nvImageCodec + nvJPEG + nvJPEG2000, and CuPy only if no CuPy is
#      importable yet: two CuPy packages must never be installed side by side);
#   2. records the GPU, CuPy, nvImageCodec and `wsitool info` backend report;
#   3. runs the GPU tests (tests/read/test_cuda.py, nothing skipped expected);
#   4. compares GPU and CPU region reads on every sample slide (max / mean abs
#      difference per slide; targets: JPEG max 4 mean < 0.5, JPEG 2000 max 2,
#      CPU-decoded levels identical) and times CPU vs GPU reads;
#   5. runs a short `wsitool stress --device cuda --workers 16` (if the stress
#      command has --device);
#   6. runs scripts/bench_read_region.py with the device as a column (if the
#      script exists; its own --device if it has one, else the timing of step 4
#      is the device column);
# then prints a compact table.  Every step runs under `timeout`; the whole run
# stays under 8 minutes (steps are skipped when the time is nearly spent).
#
# Samples: $WSITOOL_SHARED/samples if set, else ../shared/samples, shared/samples
# or .gpu-shared/samples in the repository (the last two travel with a checkout;
# copy the slides there when ../shared is not on the GPU machine).
#
# OUTDIR receives: summary.txt (the table), logs.txt (every step's full output),
# compare.json, stress.json and bench.json when those steps ran -- at most six files.
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 on usage errors.
# Environment: PYTHON (default python3), WSITOOL_GPU_SITE (wheel target folder),
# WSITOOL_GPU_CHECK_BUDGET (seconds, default 450), WSITOOL_GPU_CHECK_SKIP_INSTALL=1
# (use the environment as it is), WSITOOL_SHARED (folder holding samples/).

set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: scripts/gpu_check.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUTDIR=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
PY=${PYTHON:-python3}
SITE=${WSITOOL_GPU_SITE:-/tmp/wsitool-gpu-site}
BUDGET=${WSITOOL_GPU_CHECK_BUDGET:-450}   # seconds for all steps (under 8 minutes)
START=$(date +%s)
STEPDIR=$(mktemp -d /tmp/wsitool-gpu-check.XXXXXX)
: >"$OUTDIR/logs.txt"
SUMMARY=()
FAILED=0

export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

elapsed() { echo $(( $(date +%s) - START )); }

# step NAME LIMIT_SECONDS COMMAND...: run under timeout, log, record one summary row.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$(( BUDGET - $(elapsed) ))
    if [ "$left" -lt 15 ]; then
        SUMMARY+=("$(printf '%-9s %-7s %5s  %s' "$name" "SKIP" "-" "time budget spent")")
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local log="$STEPDIR/$name.log" t0 rc dt last
    t0=$(date +%s)
    if declare -F "$1" >/dev/null; then  # a shell function: run it in a child bash
        timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $1" >"$log" 2>&1
    else
        timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    fi
    rc=$?
    dt=$(( $(date +%s) - t0 ))
    { echo "===== $name (rc=$rc, ${dt}s): $*"; cat "$log"; echo; } >>"$OUTDIR/logs.txt"
    last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-100)
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then last="TIMEOUT after ${limit}s; $last"; fi
    SUMMARY+=("$(printf '%-9s %-7s %4ss  %s' "$name" "$([ $rc -eq 0 ] && echo ok || echo "rc=$rc")" "$dt" "$last")")
    [ "$rc" -ne 0 ] && FAILED=1
    return "$rc"
}

skip() { SUMMARY+=("$(printf '%-9s %-7s %5s  %s' "$1" "SKIP" "-" "$2")"); }

# ------------------------------------------------------------------ 1. install
install_wheels() {
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || return
    # The cu12 wheels ship nvidia/__init__.py (a regular package): first on the path it
    # would hide the environment's other nvidia.* packages.  Make it extend its path.
    [ -d "$SITE/nvidia" ] && \
        echo '__path__ = __import__("pkgutil").extend_path(__path__, __name__)' >"$SITE/nvidia/__init__.py"
    ls "$SITE"
}
install_online() {
    local pkgs=(nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12 nvidia-nvjpeg2k-cu12 imagecodecs tifffile
                typer rich psutil pytest)
    "$PY" -c "import cupy" 2>/dev/null || pkgs+=(cupy-cuda12x)
    "$PY" -m pip install -q "${pkgs[@]}"
}
export PY SITE
if [ -n "${WSITOOL_GPU_CHECK_SKIP_INSTALL:-}" ]; then
    skip install "WSITOOL_GPU_CHECK_SKIP_INSTALL is set"
elif compgen -G ".whl/*.whl" >/dev/null; then
    step install 150 install_wheels
    export PYTHONPATH="$REPO:$SITE${PYTHONPATH#"$REPO"}"
else
    step install 240 install_online
fi
# nvImageCodec finds nvJPEG / nvJPEG2000 beside itself; the loader path is a second way.
for lib in "$SITE"/nvidia/nvjpeg/lib "$SITE"/nvidia/nvjpeg2k/lib; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

# ------------------------------------------------------------------ samples
SHARED=""
for cand in "${WSITOOL_SHARED:-}" "$REPO/../shared" "$REPO/shared" "$REPO/.gpu-shared"; do
    if [ -n "$cand" ] && [ -d "$cand/samples" ]; then SHARED=$(cd "$cand" && pwd); break; fi
done
if [ -n "$SHARED" ]; then
    export WSITOOL_SHARED="$SHARED"
    SAMPLES="$SHARED/samples"
else
    SAMPLES=""
fi
CMU1="$SAMPLES/aperio-cmu1-small-region-jpeg.svs"
[ -f "$CMU1" ] || CMU1="$REPO/samples/sample-aperio-jpeg.svs"
export SAMPLES CMU1

# ------------------------------------------------------------------ 2. environment
env_report() {
    echo "samples: ${SAMPLES:-none found, only samples/ of the repository}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || true
    "$PY" - "$CMU1" <<'EOF'
import json, sys
import cupy, numpy
from nvidia import nvimgcodec
from wsitool import device
from wsitool.codec import backends
from wsitool.read import cuda
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "nvimgcodec", getattr(nvimgcodec, "__version__", "?"))
print("cuda available:", device.cuda_available(), device.cuda_probe()[1])
print("device:", backends.gpu_name(0))
for entry in backends.backend_report():
    print(f"backend: {entry['name']:52} {'yes' if entry['available'] else 'no ':3}  {entry['detail']}")
print(json.dumps(cuda.gpu_memory_sample()))
sys.exit(0 if device.cuda_available() else 1)
EOF
}
step env 90 env_report

# ------------------------------------------------------------------ 3. GPU tests
step tests 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/read/test_cuda.py

# ------------------------------------------------------------------ bench slide (for 4 and 6)
BENCH_SLIDE=""
if [ -f scripts/make_bench_slide.py ] && [ -n "$SAMPLES" ]; then
    if step benchslide 90 "$PY" scripts/make_bench_slide.py /tmp/wsitool-gpu-bench.svs \
            --width 20000 --height 15000 --samples "$SAMPLES"; then
        BENCH_SLIDE=/tmp/wsitool-gpu-bench.svs
    fi
fi

# ------------------------------------------------------------------ 4. GPU vs CPU
COMPARE_ARGS=(--device cuda --regions 6 --json "$OUTDIR/compare.json" --bench)
[ -n "$BENCH_SLIDE" ] && COMPARE_ARGS+=(--bench-slide "$BENCH_SLIDE")
if [ -n "$SAMPLES" ]; then
    step compare 150 "$PY" scripts/gpu_compare.py "$SAMPLES" "$REPO/samples" "${COMPARE_ARGS[@]}"
else
    step compare 150 "$PY" scripts/gpu_compare.py "$REPO/samples" "${COMPARE_ARGS[@]}"
fi

# ------------------------------------------------------------------ 5. stress
if "$PY" -m wsitool.cli stress --help 2>/dev/null | grep -q -- "--device"; then
    step stress 120 "$PY" -m wsitool.cli stress "$CMU1" --device cuda --workers 16 --duration 60 \
        --report "$OUTDIR/stress.json"
else
    skip stress "wsitool stress with --device is not on this branch"
fi

# ------------------------------------------------------------------ 6. benchmark script
if [ -f scripts/bench_read_region.py ]; then
    BENCH_ARGS=("${BENCH_SLIDE:-$CMU1}" --tools wsitool --size 256,1024,4096 --threads 1,2
                --json "$OUTDIR/bench.json")
    if "$PY" scripts/bench_read_region.py --help 2>/dev/null | grep -q -- "--device"; then
        BENCH_ARGS+=(--device cuda)
    fi
    step bench 120 "$PY" scripts/bench_read_region.py "${BENCH_ARGS[@]}"
else
    skip bench "scripts/bench_read_region.py not on this branch (device column: compare step)"
fi

# ------------------------------------------------------------------ table
{
    echo "wsitool GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed)s, logs in $OUTDIR/logs.txt"
    grep -h '^device:\|^backend:\|^python' "$STEPDIR/env.log" 2>/dev/null
    echo
    printf '%-9s %-7s %5s  %s\n' step result time "last line"
    printf '%s\n' "${SUMMARY[@]}"
    if [ -f "$STEPDIR/compare.log" ]; then
        echo
        echo "GPU vs CPU (targets: jpeg max<=4 mean<0.5, j2k max<=2, cpu exact; alpha identical)"
        grep -v '^\s*$' "$STEPDIR/compare.log" | grep -v -i 'warning\|failed to load\|note:\|\[ERROR\]'
    fi
    if [ -f "$OUTDIR/stress.json" ]; then
        echo
        echo "stress --device cuda --workers 16:"
        "$PY" - "$OUTDIR/stress.json" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
def walk(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            walk(v, f"{prefix}{k}.")
    elif any(t in prefix.lower() for t in ("verdict", "gpu", "device", "rate", "per_s", "growth", "slope")):
        print(f"  {prefix[:-1]} = {obj}")
walk(data)
EOF
    fi
    if [ -f "$STEPDIR/bench.log" ]; then
        echo
        echo "bench_read_region.py:"
        tail -n 25 "$STEPDIR/bench.log"
    fi
} >"$OUTDIR/summary.txt" 2>&1
cat "$OUTDIR/summary.txt"
rm -rf "$STEPDIR"
exit "$FAILED"
