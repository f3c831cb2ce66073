#!/usr/bin/env bash
# What the GPU runs of issues 14 and 15 need on the lent GPU machine, which reaches no package
# registry and does not see ../shared: packed here, carried as .kit/, used there.
#
# Here:   bash benchmarks/gpu/kit.sh pack [CORPUS...]    multi30k always, and the CORPORA
#   .kit/whl   wheels the GPU image lacks (pydantic and its parts, sacremoses; jieba built
#              as a wheel here when tatoeba-zh-en is packed), for CPython 3.12 on x86-64
#   .kit/data  the raw corpora from ../shared/data (XINDA_SHARED_DATA there)
# There (the device tool's run; carry [".kit"] in a lease's FIRST call only: a carried path
# replaces the one there), from the repository root:
#   bash benchmarks/gpu/kit.sh run CMD...          CMD in the foreground, in the kit's environment
#   bash benchmarks/gpu/kit.sh start NAME CMD...   CMD detached (outlives the call), log
#                                                  runs/gpu/logs/NAME.log
#   bash benchmarks/gpu/kit.sh status              the tail of every log, GPU use
#   bash benchmarks/gpu/kit.sh collect PATH...     PATHs' results (json, md, png, hyp, log) and the
#                                                  logs into $OUT/results.tar.gz
#   bash benchmarks/gpu/kit.sh waitfor SECONDS N GLOB...   until N files match the GLOBs or
#                                                  SECONDS pass (then the call can collect)
# Runs, logs and kept results go under runs/gpu/ (git-ignored, never carried: kept there
# between the calls of a lease).
# benchmarks/gpu/README.md gives the calls of a 30-minute GPU session.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=$PWD/.kit
LOGS=$PWD/runs/gpu/logs
SHARED_DATA=${XINDA_SHARED_DATA:-$PWD/../shared/data}
PY=${PYTHON:-python3}

pack() {
    local corpora=(multi30k)
    for corpus in "$@"; do [ "$corpus" = multi30k ] || corpora+=("$corpus"); done
    mkdir -p "$KIT/whl" "$KIT/data"
    local wheels=(pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0
                  typing-inspection==0.4.2 typing-extensions==4.16.0 sacremoses==0.2.0
                  typer==0.29.2)  # typer: the image's is older than the CLI's TyperException
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$KIT/whl" "${wheels[@]}"
    for corpus in "${corpora[@]}"; do
        [ -d "$SHARED_DATA/$corpus" ] || { echo "kit: no corpus $SHARED_DATA/$corpus" >&2; exit 2; }
        cp -r "$SHARED_DATA/$corpus" "$KIT/data/"
        if [ "$corpus" = tatoeba-zh-en ]; then  # jieba is an sdist: built here (an offline
            "$PY" -m pip wheel -q --no-deps -w "$KIT/whl" jieba==0.42.1  # build needs setuptools)
        fi
    done
    # the code version (.git does not travel): the results' "code" there
    git describe --always --dirty > "$KIT/VERSION" 2>/dev/null || echo unknown > "$KIT/VERSION"
    du -sh "$KIT"
}

environment() {
    if [ ! -f /tmp/kit-site/.done ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/kit-site "$KIT"/whl/*
        touch /tmp/kit-site/.done
    fi
    export PYTHONPATH=/tmp/kit-site:$PWD PYTHONUNBUFFERED=1 XINDA_SHARED_DATA=$KIT/data
    XINDA_CODE_VERSION=$(cat "$KIT/VERSION" 2>/dev/null || echo unknown)
    export XINDA_CODE_VERSION
    mkdir -p "$LOGS"
}

collect() {
    [ -n "${OUT:-}" ] || { echo "kit: collect writes to \$OUT, which is unset" >&2; exit 2; }
    local found
    # relative paths (an absolute $LOGS put the logs in twice, once under the machine's path)
    # (not the checkpoints' json: training deletes them as it goes, and tar would fail on one)
    found=$(find "$@" runs/gpu/logs -type f -not -path '*/checkpoints/*' \( -name '*.json' \
            -o -name '*.md' -o -name '*.png' -o -name '*.hyp' -o -name '*.log' -o -name '*.csv' \) \
            2>/dev/null | sort -u || true)
    [ -n "$found" ] || { echo "kit: no results under $* $LOGS"; return 0; }
    tar -czf "$OUT/results.tar.gz" $found
    tar -tzf "$OUT/results.tar.gz" | wc -l
}

matches() {  # how many files the GLOBs (quoted by the caller: expanded here) match now
    local glob n=0 f
    shopt -s nullglob globstar
    for glob in "$@"; do for f in $glob; do n=$((n + 1)); done; done
    echo "$n"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    run) shift; environment; exec "$@" ;;
    start) shift; environment; name=$1; shift
        setsid "$@" > "$LOGS/$name.log" 2>&1 < /dev/null &
        echo "kit: started $name (pid $!), log runs/gpu/logs/$name.log" ;;
    status) shopt -s nullglob globstar
        for log in "$LOGS"/*.log; do echo "== $log"; tail -n 5 "$log"; done
        for log in runs/gpu/**/train.log; do echo "-- $log: $(tail -n 1 "$log")"; done
        nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv 2>/dev/null || true ;;
    collect) shift; collect "$@" ;;
    waitfor) shift; deadline=$((SECONDS + $1)); want=$2; shift 2
        until [ "$(matches "$@")" -ge "$want" ] || [ $SECONDS -ge $deadline ]; do sleep 10; done
        echo "kit: $(matches "$@") of $want found" ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
esac
