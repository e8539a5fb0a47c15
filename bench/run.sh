#!/usr/bin/env bash
# lakemount benchmark: bench/run.sh [--quick] [--runs N] [--systems a,b]
#                       [--link-gbit G --ttfb-ms T] [SUITE|WORKLOAD ...]
#
# Suites: seq rand loader meta all (default: all); `cache` (bench/cache.py),
# `torch` (bench/torch_bench.py) and `writes` (bench/writes.py) have their own drivers. Writes bench/RESULTS.md.
# Data, Garage, mount points and logs live in $BENCH_DIR (default: ../bench-data
# next to this checkout, never inside it). Run as root (FUSE mounts, apt-get).
# Not part of CI. See bench/README.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
export BENCH_DIR=${BENCH_DIR:-$(dirname "$repo")/bench-data}
mkdir -p "$BENCH_DIR"

say() { echo "[bench] $*" >&2; }

# Safety net if the driver dies hard: unmount whatever is still mounted under
# $BENCH_DIR/mnt, stop the Garage this harness started (by its pid file) and
# remove the link emulation (--link-gbit: an HTB root qdisc on lo with handle
# ae5:, see LinkShaper in harness.py; any other qdisc is left alone).
cleanup() {
    local m pid
    for m in "$BENCH_DIR"/mnt/*; do
        if mountpoint -q "$m" 2>/dev/null; then say "unmounting $m"; umount -l "$m" || true; fi
    done
    if [[ -f $BENCH_DIR/garage/garage.pid ]]; then
        pid=$(cat "$BENCH_DIR/garage/garage.pid")
        if [[ -n $pid ]] && grep -qa "$BENCH_DIR/garage/garage.toml" "/proc/$pid/cmdline" 2>/dev/null; then
            say "stopping Garage (pid $pid)"; kill "$pid" || true
        fi
    fi
    if command -v tc >/dev/null && tc qdisc show dev lo 2>/dev/null | grep -q '^qdisc htb ae5: root'; then
        say "removing the link emulation qdisc from lo"; tc qdisc del dev lo root || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM   # replaced below while the driver runs

# 1. Tools from Debian (only what is missing).
missing=()
command -v fio >/dev/null || missing+=(fio)
command -v rclone >/dev/null || missing+=(rclone)
command -v s3fs >/dev/null || missing+=(s3fs)
command -v python3 >/dev/null || missing+=(python3)
command -v fusermount3 >/dev/null || missing+=(fuse3)
command -v tc >/dev/null || missing+=(iproute2)   # --link-gbit (bench/README.md)
command -v cc >/dev/null || missing+=(gcc libc6-dev)
if ((${#missing[@]})); then
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

# 2. Garage, built once from crates.io (about 20 minutes on 2 cores), only where it
# is used: `--server garage` (also for the cache benchmark).
needs_garage=0
for arg in "$@"; do [[ $arg == garage || $arg == --server=garage ]] && needs_garage=1; done
garage_bin=${GARAGE_BIN:-$(command -v garage || true)}
if [[ -z $garage_bin && -x $HOME/.cargo/bin/garage ]]; then garage_bin=$HOME/.cargo/bin/garage; fi
if [[ -z $garage_bin && $needs_garage == 1 ]]; then
    say "garage not found: cargo install garage --locked (about 20 minutes, once)"
    cargo install garage --locked >&2
    garage_bin=$HOME/.cargo/bin/garage
fi
export GARAGE_BIN=$garage_bin

# 3. lakemount and the raw-GET client, release builds.
say "cargo build --release (lakemount, lakemount-testserver)"
(cd "$repo" && cargo build --release --quiet --bin lakemount && cargo build --release --quiet -p lakemount-testserver)
say "cargo build --release (bench/rawget)"
cargo build --release --quiet --manifest-path "$here/rawget/Cargo.toml"

# Mountpoint for Amazon S3 (the `mount-s3` column): bench/mountpoint, our small main.rs
# over Mountpoint's library crates from crates.io (its CLI crate is not published),
# built when missing or older than its sources (about 11 minutes on 2 cores, once;
# its C runtime, aws-crt, needs cmake, clang/libclang and libfuse3's headers). A failed
# build is not fatal: the column then says "not built". BENCH_NO_MOUNT_S3=1 skips it.
mp_bin=$here/mountpoint/target/release/mount-s3
if [[ ${BENCH_NO_MOUNT_S3:-0} != 1 ]]; then
    if [[ ! -x $mp_bin || -n $(find "$here/mountpoint/src" "$here/mountpoint/Cargo.toml" "$here/mountpoint/Cargo.lock" -newer "$mp_bin" 2>/dev/null) ]]; then
        mp_missing=()
        command -v cmake >/dev/null || mp_missing+=(cmake)
        command -v clang >/dev/null || mp_missing+=(clang libclang-dev)
        pkg-config --exists fuse3 2>/dev/null || mp_missing+=(libfuse3-dev pkg-config)
        if ((${#mp_missing[@]})); then
            say "apt-get install ${mp_missing[*]} (for bench/mountpoint)"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${mp_missing[@]}" >&2
        fi
        say "cargo build --release (bench/mountpoint: mount-s3; about 11 minutes the first time)"
        cargo build --release --quiet --manifest-path "$here/mountpoint/Cargo.toml" ||
            say "WARNING: bench/mountpoint did not build; the mount-s3 column will say why it is missing"
    fi
fi

# The TCP_NODELAY shim Garage is started with (see bench/nodelay/nodelay.c).
cc -shared -fPIC -O2 -o "$BENCH_DIR/nodelay.so" "$here/nodelay/nodelay.c" -ldl

# 4. The measurements. On INT/TERM the driver gets SIGTERM and cleans up
# (unmounts, stops Garage) before this script exits.
# `cache` (the epoch benchmark of the data cache) has its own driver.
if [[ ${1:-} == cache ]]; then
    shift
    python3 "$here/cache.py" "$@" &
elif [[ ${1:-} == writes ]]; then
    # Checkpoint writes (issue 14): close and durable times, rclone's write-back beside.
    shift
    python3 "$here/writes.py" "$@" &
elif [[ ${1:-} == torch ]]; then
    # The PyTorch DataLoader suite: torch in its own venv under $BENCH_DIR (~5.5 GB, once).
    shift
    "$here/torch/setup.sh"
    python3 "$here/torch_bench.py" "$@" &
else
    python3 "$here/harness.py" "$@" &
fi
driver=$!
trap 'kill -TERM "$driver" 2>/dev/null || true' INT TERM
status=0
wait "$driver" || status=$?
if kill -0 "$driver" 2>/dev/null; then wait "$driver" || status=$?; fi
exit "$status"
