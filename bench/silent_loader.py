#!/usr/bin/env python3
"""Small files read by a loader that sends no request per file (hand-run).

A mount without opens (`read.no_open`) learns that a loader got to a file
pushed into the page cache from the loader's own requests (Python <= 3.13's
`open` sends an ioctl) or, from a loader that sends none (C, Rust, CPython
3.14+), from the GETATTR it asks for (docs/READAHEAD.md, "A silent loader is
asked for a sign"). This compares both kinds of loader over the torch data
set when the data set is larger than prefetch's bound (half the data cache):

    python3 bench/silent_loader.py [--runs 2] [--bin target/release/lakemount]

Per run and case: the in-memory test server with 20 ms to first byte
(started once, data uploaded with bench/rawget), a fresh mount and cache,
the tree listed (as a loader's index does), the page cache dropped, then 4
worker processes read every file once in a shuffled order, with `open()`
(`open` mode: the ioctl) or `os.open`/`os.read` (`os` mode: no request per
file). Printed: seconds, GETs, FUSE reads (files prefetch missed), GETATTRs.
Needs root (mount, drop_caches), target/release/lakemount-testserver,
bench/rawget/target/release/rawget and $BENCH_DIR/data/torch-20000 (made by
`bench/run.sh torch`).
"""
import argparse
import json
import multiprocessing as mp
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.environ.get("BENCH_DIR", "/work/bench-data")
PORT, METRICS = 39940, "127.0.0.1:39944"
KEYS = {"AWS_ACCESS_KEY_ID": "lakemount-test", "AWS_SECRET_ACCESS_KEY": "lakemount-test-secret",
        "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{PORT}"}
# The bound is half the cache: 40 MiB, a quarter of the 157 MiB data set.
CASES = {
    "prefetch": '[read]\nno_open = true\nsmall_budget = "16MiB"\n[cache]\nmax_size = "80MiB"\n',
    "prefetch-off": '[read]\nno_open = true\nsmall_max_size = 0\n[cache]\nmax_size = "80MiB"\n',
}


def read_files(args):
    paths, mode = args
    n = 0
    for p in paths:
        if mode == "open":
            with open(p, "rb") as f:
                n += len(f.read())
        else:
            fd = os.open(p, os.O_RDONLY)
            try:
                while b := os.read(fd, 1 << 20):
                    n += len(b)
            finally:
                os.close(fd)
    return n


def metrics():
    body = urllib.request.urlopen(f"http://{METRICS}/metrics").read().decode()
    out = {}
    for name, label in [("gets", r'lakemount_s3_requests_total\{op="GET",status="20[06]"\}'),
                        ("reads", r'lakemount_fuse_requests_total\{op="read"\}'),
                        ("getattrs", r'lakemount_fuse_requests_total\{op="getattr"\}')]:
        out[name] = sum(float(m) for m in re.findall(rf"^{label} (\S+)$", body, re.M))
    return out


def run(binary, config, mode, names, seed):
    env = dict(os.environ, **KEYS)
    env.pop("AWS_CA_BUNDLE", None)
    mnt = tempfile.mkdtemp(prefix="silent-mnt")
    cache = tempfile.mkdtemp(prefix="silent-cache", dir=BENCH_DIR)
    conf = cache + ".toml"
    with open(conf, "w") as f:
        f.write(config)
    d = subprocess.Popen([binary, "mount", "s3://silentbench", mnt, "--endpoint-url", KEYS["AWS_ENDPOINT_URL"],
                          "--region", "us-east-1", "--cache-dir", cache, "--foreground", "--config", conf,
                          "--metrics-addr", METRICS], env=env, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(100):
            if os.path.ismount(mnt):
                break
            time.sleep(0.1)
        root = os.path.join(mnt, "torch-small")
        for e in os.scandir(root):
            os.listdir(e.path)
        open("/proc/sys/vm/drop_caches", "w").write("1\n")
        order = list(names)
        random.Random(seed).shuffle(order)
        parts = [([os.path.join(root, n) for n in order[i::4]], mode) for i in range(4)]
        t = time.time()
        with mp.Pool(4) as pool:
            total = sum(pool.map(read_files, parts, chunksize=1))
        secs = time.time() - t
        return secs, total, metrics()
    finally:
        subprocess.run(["umount", mnt])
        d.wait()
        subprocess.run(["rm", "-rf", cache, conf])
        os.rmdir(mnt)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--bin", default=os.path.join(REPO, "target/release/lakemount"))
    a = p.parse_args()
    data = os.path.join(BENCH_DIR, "data/torch-20000")
    manifest = json.load(open(os.path.join(data, "manifest.json")))
    names = [s["name"] for s in manifest["samples"]]
    want = sum(s["size"] for s in manifest["samples"])
    env = dict(os.environ, **KEYS)
    env.pop("AWS_CA_BUNDLE", None)
    srv = subprocess.Popen([os.path.join(REPO, "target/release/lakemount-testserver"), "--port", str(PORT),
                            "--stats-port", str(PORT + 3), "--bucket", "silentbench", "--ttfb-ms", "20"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(1)
        subprocess.run([os.path.join(REPO, "bench/rawget/target/release/rawget"), "put", "--bucket", "silentbench",
                        "--dir", os.path.join(data, "files"), "--prefix", "torch-small/", "--concurrency", "32"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        print("| case | loader | run | seconds | GETs | FUSE reads | GETATTRs |\n|---|---|---|---|---|---|---|")
        for r in range(a.runs):
            for case, config in CASES.items():
                for mode in ("os", "open"):
                    if case == "prefetch-off" and mode == "open":
                        continue
                    secs, total, m = run(a.bin, config, mode, names, seed=r + 1)
                    if total != want:
                        sys.exit(f"{case} {mode}: read {total} bytes, want {want}")
                    print(f"| {case} | {mode} | {r + 1} | {secs:.1f} | {m['gets']:,.0f} | {m['reads']:,.0f} "
                          f"| {m['getattrs']:,.0f} |", flush=True)
    finally:
        srv.terminate()


if __name__ == "__main__":
    main()
