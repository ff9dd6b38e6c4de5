#!/usr/bin/env bash
# Run wsitool's native code paths under valgrind memcheck and check that nothing is
# "definitely lost" through wsitool's own C code or its ctypes calls into OpenJPEG.
#
# Usage (from anywhere; the repository's .venv is used when it exists):
#
#     scripts/valgrind_native.sh                     # all paths: boxfilter jpegloop openjpeg
#     scripts/valgrind_native.sh openjpeg            # one or more named paths
#
# For each path it runs `python scripts/valgrind_native.py --path NAME --calls N` under
# `valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite
# --errors-for-leak-kinds=definite --suppressions=scripts/valgrind.supp --xml=yes`
# with PYTHONMALLOC=malloc (every Python object a malloc block memcheck can see), the
# paths two at a time, then `valgrind_native.py --summarize` on each XML file, which
# prints one line per path:
#
#     openjpeg: 0 bytes definitely lost in 0 records through wsitool's native code (12 calls;
#     valgrind total definitely lost: 0 bytes in 0 records; ...)
#
# Exit status: 0 when no path lost bytes through wsitool's native code and every driver
# ran to the end (took its native path); 1 otherwise.
#
# Environment:
#   BOXFILTER_CALLS, JPEGLOOP_CALLS, OPENJPEG_CALLS  calls per path (defaults 40, 12, 12:
#                      a few minutes each under valgrind on 2 cores)
#   VALGRIND_OUT       folder of the XML files and logs (default build/valgrind)
#   VALGRIND_SUPP      suppression file (default scripts/valgrind.supp; "none" for none)
#   VALGRIND_JOBS      paths run at the same time (default 2)
#   GEN_SUPP=1         also ask memcheck for suppressions (--gen-suppressions=all) and print
#                      those of the definite leaks not through wsitool's native code, to
#                      maintain scripts/valgrind.supp
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
cd "$repo" || exit 1
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
command -v valgrind >/dev/null || { echo "valgrind_native.sh: valgrind is not installed" >&2; exit 1; }

out=${VALGRIND_OUT:-build/valgrind}
supp=${VALGRIND_SUPP:-scripts/valgrind.supp}
jobs=${VALGRIND_JOBS:-2}
mkdir -p "$out"
declare -A calls=([boxfilter]=${BOXFILTER_CALLS:-40} [jpegloop]=${JPEGLOOP_CALLS:-12}
                  [openjpeg]=${OPENJPEG_CALLS:-12})
if [[ $# -gt 0 ]]; then paths=("$@"); else paths=(boxfilter jpegloop openjpeg); fi
for p in "${paths[@]}"; do
    [[ -n "${calls[$p]:-}" ]] || { echo "valgrind_native.sh: unknown path '$p' (boxfilter, jpegloop, openjpeg)" >&2; exit 1; }
done

vg=(valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite
    --errors-for-leak-kinds=definite --num-callers=50 --xml=yes)
if [[ "$supp" != none ]]; then vg+=(--suppressions="$supp"); fi
if [[ "${GEN_SUPP:-0}" == 1 ]]; then vg+=(--gen-suppressions=all); fi

run_one() {  # run_one PATH: the driver under memcheck; its exit status in $out/PATH.rc
    local p=$1 start=$SECONDS
    rm -f "$out/$p.xml" "$out/$p.rc"
    PYTHONMALLOC=malloc "${vg[@]}" --xml-file="$out/$p.xml" --log-file="$out/$p.valgrind.log" \
        "$PYTHON" scripts/valgrind_native.py --path "$p" --calls "${calls[$p]}" >"$out/$p.out" 2>&1
    echo $? >"$out/$p.rc"
    echo "valgrind_native.sh: $p: driver exited $(cat "$out/$p.rc") after $((SECONDS - start)) s" \
         "($(tail -n 1 "$out/$p.out"))"
}

running=0
for p in "${paths[@]}"; do
    run_one "$p" &
    running=$((running + 1))
    if [[ $running -ge $jobs ]]; then wait -n; running=$((running - 1)); fi
done
wait

status=0
for p in "${paths[@]}"; do
    rc=$(cat "$out/$p.rc" 2>/dev/null || echo missing)
    if [[ "$rc" != 0 ]]; then
        echo "$p: FAILED: the driver exited $rc under valgrind; see $out/$p.out and $out/$p.valgrind.log"
        status=1
    fi
    extra=()
    if [[ "${GEN_SUPP:-0}" == 1 ]]; then extra=(--print-suppressions); fi
    "$PYTHON" scripts/valgrind_native.py --summarize "$out/$p.xml" --path "$p" --calls "${calls[$p]}" \
        "${extra[@]}" || status=1
done
exit $status
