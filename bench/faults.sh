#!/usr/bin/env bash
# Reads through injected faults (issue 13), hand-run: lakemount and mount-s3
# read 4 shards of 256 MiB and 2,000 small files (4-12 KiB, 20 directories)
# with 8 reader threads, through bench's fault proxy
# (target/release/lakemount-faultproxy) in front of the in-memory test
# server: fault-free, then with RATE of the requests broken (every kind of
# testserver/src/faults.rs, a 20 s stall, a 2 s slow first byte). RUNS runs
# of each; a fresh mount and a new proxy seed per run; no data cache.
#
#   bench/faults.sh [RUNS=3] [RATE=0.1] [SYSTEMS="lakemount mount-s3"]
#
# One line per run: system, fault rate, seconds, files wrong, files failed,
# faults injected. Builds nothing: run `cargo build --release --workspace`
# (and bench/mountpoint for mount-s3) first.
set -euo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
B=${BENCH_DIR:-/work/bench-data}
RUNS=${RUNS:-3}
RATE=${RATE:-0.1}
SYSTEMS=${SYSTEMS:-"lakemount mount-s3"}
RAWGET=$R/bench/rawget/target/release/rawget
SRV_PORT=39710
PROXY_PORT=39720
D=$B/data/faults
M=$B/mnt/faults
export AWS_ACCESS_KEY_ID=lakemount-test AWS_SECRET_ACCESS_KEY=lakemount-test-secret AWS_REGION=us-east-1
mkdir -p "$D" "$M" "$B/logs"

if [ ! -e "$D/.done" ]; then
    "$RAWGET" gen-shards --dir "$D/shards" --count 4 --size 268435456 --seed 21 >/dev/null
    "$RAWGET" gen-files --dir "$D/small" --dirs 20 --per-dir 100 --min 4096 --max 12288 --ext jpg --seed 22 >/dev/null
    touch "$D/.done"
fi

"$R/target/release/lakemount-testserver" --port $SRV_PORT --bucket faults >"$B/logs/faults-server.log" 2>&1 &
SRV=$!
PROXY=
cleanup() {
    umount -l "$M" 2>/dev/null || true
    [ -n "$PROXY" ] && kill "$PROXY" 2>/dev/null || true
    kill "$SRV" 2>/dev/null || true
}
trap cleanup EXIT
sleep 1
for sub in shards small; do
    "$RAWGET" put --bucket faults --dir "$D/$sub" --prefix "$sub/" --concurrency 32 \
        --endpoint "http://127.0.0.1:$SRV_PORT" >/dev/null
done

# Reads every file of the mount with 8 threads and compares it with the
# local copy; prints "SECONDS WRONG FAILED".
read_all() {
    python3 - "$1" "$D" <<'PY'
import os, sys, time, concurrent.futures as cf
mnt, local = sys.argv[1], sys.argv[2]
rel = sorted(os.path.relpath(os.path.join(d, f), local)
             for sub in ("shards", "small")
             for d, _, fs in os.walk(os.path.join(local, sub)) for f in fs)
def check(r):
    try:
        with open(os.path.join(mnt, r), "rb") as f:
            got = f.read()
        with open(os.path.join(local, r), "rb") as f:
            return "ok" if got == f.read() else "wrong"
    except OSError:
        return "failed"
t = time.time()
with cf.ThreadPoolExecutor(8) as ex:
    res = list(ex.map(check, rel))
print(f"{time.time() - t:.2f} {res.count('wrong')} {res.count('failed')}")
PY
}

mount_system() {
    local sys=$1 endpoint=$2
    case $sys in
    lakemount)
        "$R/target/release/lakemount" mount s3://faults "$M" --endpoint-url "$endpoint" \
            --region us-east-1 >"$B/logs/faults-$sys.log" 2>&1 &
        ;;
    mount-s3)
        "$R/bench/mountpoint/target/release/mount-s3" faults "$M" --foreground --read-only \
            --endpoint-url "$endpoint" --region us-east-1 --force-path-style \
            >"$B/logs/faults-$sys.log" 2>&1 &
        ;;
    esac
    MOUNT_PID=$!
    for _ in $(seq 200); do mountpoint -q "$M" && return 0; sleep 0.1; done
    echo "$sys did not mount" >&2
    return 1
}

for run in $(seq "$RUNS"); do
    for rate in 0 "$RATE"; do
        for sys in $SYSTEMS; do
            "$R/target/release/lakemount-faultproxy" --upstream 127.0.0.1:$SRV_PORT \
                --port $PROXY_PORT --rate "$rate" --seed "$run" --stall-ms 20000 \
                --slow-ms 2000 >"$B/logs/faults-proxy.out" 2>&1 &
            PROXY=$!
            sleep 0.5
            mount_system "$sys" "http://127.0.0.1:$PROXY_PORT"
            sync; echo 3 >/proc/sys/vm/drop_caches
            result=$(read_all "$M")
            umount "$M" 2>/dev/null || umount -l "$M"
            wait "$MOUNT_PID" 2>/dev/null || true
            kill -INT "$PROXY"; wait "$PROXY" 2>/dev/null || true
            PROXY=
            faults=$(grep -c '^injected' "$B/logs/faults-proxy.out" || true)
            injected=$(awk '/^injected/ {n += $3} END {print n + 0}' "$B/logs/faults-proxy.out")
            requests=$(awk '/^requests/ {print $2}' "$B/logs/faults-proxy.out")
            read -r secs wrong failed <<<"$result"
            echo "run=$run system=$sys rate=$rate secs=$secs wrong=$wrong failed=$failed" \
                "injected=$injected kinds=$faults requests=$requests"
        done
    done
done
