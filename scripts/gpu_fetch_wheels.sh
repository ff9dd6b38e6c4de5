#!/usr/bin/env bash
# Prepare what scripts/gpu_check.sh needs on a GPU machine without internet.
#
# Usage (here, with internet, in the repository root): scripts/gpu_fetch_wheels.sh [DIR]
#
# Also copies the TIFF-based sample slides of ../shared/samples (not DICOM, not
# the 3.5 MB QPTIFF, about 7 MB) into .gpu-shared/samples (ignored by git), as
# ../shared does not travel with a checkout.  Send both folders along
# (device tool: carry [".whl", ".gpu-shared"]) and run
#     scripts/gpu_check.sh $OUT
#
# Writes x86-64 / CPython 3.12 wheels into DIR (default .whl, which .gitignore
# ignores): nvImageCodec with its nvJPEG and nvJPEG2000 libraries and tifffile,
# the same versions as this environment's nvImageCodec where one is installed.
# About 47 MB.  CuPy, numpy, typer, rich and psutil are expected on the GPU
# machine already (an image with CuPy of any CUDA flavour is fine: wsitool only
# needs `import cupy`); imagecodecs (26 MB) is left out to stay under a 64 MiB
# transfer limit -- without it the GPU machine cannot decode the tifffile
# levels (LZW, zstd, WebP...), and the tests and comparison skip those.
# Set WITH_IMAGECODECS=1 to fetch it too.
set -euo pipefail
DIR=${1:-.whl}
PY=${PYTHON:-python3}
NVIMGCODEC=$("$PY" -c "import importlib.metadata as m; print(m.version('nvidia-nvimgcodec-cu12'))" 2>/dev/null || echo 0.9.0.20)
PKGS=("nvidia-nvimgcodec-cu12==$NVIMGCODEC" "nvidia-nvjpeg-cu12==12.4.0.76"
      "nvidia-nvjpeg2k-cu12==0.11.0.51" "tifffile>=2024.1.30")
[ -n "${WITH_IMAGECODECS:-}" ] && PKGS+=("imagecodecs>=2024.1.1")
mkdir -p "$DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR" "${PKGS[@]}"
ls -l "$DIR"
SRC=${WSITOOL_SHARED:-../shared}/samples
if [ -d "$SRC" ]; then
    mkdir -p .gpu-shared/samples
    for f in "$SRC"/*.svs "$SRC"/*.tif "$SRC"/*.tiff; do
        [ -f "$f" ] && cp -p "$f" .gpu-shared/samples/
    done
fi
du -sh "$DIR" .gpu-shared 2>/dev/null
