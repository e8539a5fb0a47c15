#!/usr/bin/env python3
"""Prices the FUSE transport alone: classic /dev/fuse against FUSE over io_uring.

Serves one trivial tree (bench/fuse_transport/src/main.rs: no I/O in any
handler) over each transport in turn and has a loader read every file once,
the way a PyTorch DataLoader's workers read small samples: WORKERS processes,
each a shuffled share of the files, `open(path, 'rb').read()` (Python's open:
open, ioctl TCGETS, read, release) or `os.open`/`os.read`/`os.close` (open,
read, release). Per run: a fresh mount, every file stat-ed once (the index),
the page cache dropped, then the timed reads; the daemon's CPU from
/proc/PID/stat over the timed part. Every file's size and bytes are checked.

Run as root (mounts, drop_caches, the fuse module's `enable_uring`, which is
set to Y for the run and put back after). Needs a kernel with
CONFIG_FUSE_IO_URING (6.14+).

    python3 bench/fuse_transport/run.py --runs 5
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "target", "release", "fuse_transport")
URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


def cpu_secs(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


PATTERN = {}


def expected(ino, size):
    """File `ino`'s bytes: `(ino * 31 + i) % 251`, a slice of one pattern."""
    pattern = PATTERN.get(size)
    if pattern is None:
        pattern = PATTERN[size] = bytes(i % 251 for i in range(size + 251))
    start = ino * 31 % 251
    return pattern[start:start + size]


def read_share(job):
    """One worker: reads its files, returns the bytes read; checks each."""
    share, size, loader = job
    total = 0
    for path, ino in share:
        if loader == "open":
            with open(path, "rb") as f:
                data = f.read()
        else:
            fd = os.open(path, os.O_RDONLY)
            data = os.read(fd, size + 1)
            os.close(fd)
        if data != expected(ino, size):
            raise SystemExit(f"{path}: wrong bytes ({len(data)} bytes read)")
        total += len(data)
    return total


def one_run(transport, threads, loader, a):
    mnt = tempfile.mkdtemp(prefix="fuse-transport-")
    daemon = subprocess.Popen([BIN, transport, mnt, str(threads), str(a.dirs), str(a.files), str(a.size)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.ismount(mnt):
                break
            if daemon.poll() is not None:
                raise SystemExit(f"{transport}: the daemon exited ({daemon.returncode}) before mounting"
                                 + (" (is enable_uring Y and the kernel 6.14+?)" if transport == "uring" else ""))
            time.sleep(0.05)
        files = [f"{mnt}/d{d}/f{f}" for d in range(a.dirs) for f in range(a.files)]
        index = [(p, os.stat(p).st_ino) for p in files]
        random.Random(1).shuffle(index)
        shares = [(index[w::a.workers], a.size, loader) for w in range(a.workers)]
        with Pool(a.workers) as pool:
            open("/proc/sys/vm/drop_caches", "w").write("1\n")
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
            try:
                c0, t0 = cpu_secs(daemon.pid), time.monotonic()
                total = sum(pool.map(read_share, shares))
                secs, cpu = time.monotonic() - t0, cpu_secs(daemon.pid) - c0
            finally:
                for s in spinners:
                    s.kill()
                    s.wait()
        if total != len(files) * a.size:
            raise SystemExit(f"read {total} bytes, expected {len(files) * a.size}")
        return secs, cpu
    finally:
        subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL)
        daemon.wait()
        os.rmdir(mnt)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--transports", default="classic:1,classic:2,uring:0",
                   help="TRANSPORT:THREADS,...: classic session threads; uring workers, 0 = one per CPU")
    p.add_argument("--loaders", default="open,os")
    p.add_argument("--dirs", type=int, default=100)
    p.add_argument("--files", type=int, default=200, help="files per directory")
    p.add_argument("--size", type=int, default=8192, help="bytes per file")
    p.add_argument("--workers", type=int, default=4, help="loader processes")
    p.add_argument("--busy", type=int, default=0,
                   help="processes spinning on the CPU during the reads (a machine busy with other work, "
                        "as an epoch 1 is with the S3 client and server)")
    a = p.parse_args()
    if not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release", "--manifest-path", os.path.join(HERE, "Cargo.toml")], check=True)
    cells = [(t.split(":")[0], int(t.split(":")[1]), l) for t in a.transports.split(",") for l in a.loaders.split(",")]
    before = open(URING_PARAM).read().strip()
    open(URING_PARAM, "w").write("Y\n")
    results = {c: [] for c in cells}
    try:
        for r in range(a.runs):
            for c in cells:
                secs, cpu = one_run(*c, a)
                results[c].append((secs, cpu))
                print(f"run {r + 1} {c[0]}:{c[1]} {c[2]}: {secs:.3f} s, daemon {cpu:.2f} CPU-s", flush=True)
    finally:
        open(URING_PARAM, "w").write(before + "\n")
    n = a.dirs * a.files
    print(f"\n{n:,} files of {a.size:,} bytes, {a.workers} loader processes, {a.busy} spinning, medians of {a.runs}\n")
    print("| transport | threads | loader | seconds | files/s | daemon CPU-s | CPU-s per 1,000 files |")
    print("|---|---|---|---|---|---|---|")
    for c in cells:
        secs = statistics.median(s for s, _ in results[c])
        cpu = statistics.median(x for _, x in results[c])
        print(f"| {c[0]} | {c[1] or 'one per CPU'} | {c[2]} | {secs:.3f} | {n / secs:,.0f} | {cpu:.2f} | {cpu / n * 1000:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
