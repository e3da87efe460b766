#!/usr/bin/env bash
# Issue 19's scaling table (workloads 4 and 5 at 2, 4, 8 and 16 workers, every library) on a
# machine of 16 or more cores that has no network, as one prepared command.
#
#   here, with network:   bash benchmarks/device_scaling.sh fetch
#                         (the wheels that machine lacks, into .whl/, which git ignores)
#   there:                bash benchmarks/device_scaling.sh run [harness arguments...]
#                         (results into $OUT, or ./scaling-out: scaling.md, scaling.json,
#                         scaling.png, machine.txt)
#
# The device machines of this project run Python 3.12 with numpy, msgpack, cloudpickle, torch,
# psutil, tabulate, six, tqdm, etils, absl-py and protobuf, but without pyzmq, tensorpack, grain,
# SPDL or torchdata: `fetch` downloads those (CPython 3.12, manylinux x86-64) without their
# dependencies; `run` installs them into a private directory and runs the harness from this
# checkout (dataflow is imported from it, not installed). A peer that still cannot import is
# skipped by the harness with a note in the report. `run` ends within 9 minutes (its harness
# runs under `timeout`); the harness arguments default to the scaling run below and may be
# replaced, e.g. `run --workloads 4 --workers 16` for a shorter check.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(pyzmq termcolor msgpack-numpy tensorpack==0.11 grain==0.2.18 array-record portpicker
        spdl==0.8.0 spdl_core==0.8.0 spdl_io==0.8.0 torchdata==0.11.0)
SITE=/tmp/dataflow-bench-site

case "${1:-}" in
fetch)
    exclude=.git/info/exclude
    if [ -d .git ] && ! grep -qx '/.whl/' "$exclude" 2>/dev/null; then
        echo '/.whl/' >> "$exclude"
    fi
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
    echo "wheels in .whl/ ($(du -sh .whl | cut -f1)); on the device machine, carry .whl and run:"
    echo "    bash benchmarks/device_scaling.sh run"
    ;;
run)
    shift
    out=${OUT:-scaling-out}
    mkdir -p "$out"
    if ls .whl/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl
        export PYTHONPATH="$SITE:$PWD"
    else
        echo "no .whl/: running with the packages this machine has" >&2
        export PYTHONPATH="$PWD"
    fi
    export PYTHONUNBUFFERED=1
    { date -u; nproc; lscpu 2>/dev/null || true; free -g 2>/dev/null || true; python3 -VV;
      python3 -m pip list 2>/dev/null | grep -i -E \
          '^(numpy|pyzmq|msgpack|torch|tensorpack|grain|spdl|torchdata) ' || true; } \
        > "$out/machine.txt" 2>&1
    if [ $# -eq 0 ]; then
        set -- --quick --workloads 4,5 --workers 2,4,8,16
    fi
    status=0
    timeout 530 python3 -m benchmarks "$@" --json "$out/scaling.json" \
        --png "$out/scaling.png" > "$out/scaling.md" 2> "$out/scaling.log" || status=$?
    cat "$out/scaling.md"
    tail -n 20 "$out/scaling.log" >&2
    exit $status
    ;;
*)
    echo "usage: bash benchmarks/device_scaling.sh fetch | run [harness arguments...]" >&2
    exit 2
    ;;
esac
