#!/usr/bin/env python3
"""Cold reads through a mount with a data cache: S3 GET bytes per byte read
and MiB/s, for one or more lakemount binaries side by side (e.g. before and
after a change), on the in-memory test server.

Per run and binary: a fresh mount with an empty cache directory, then one
cold object read by `dd bs=128k`, one by `dd bs=1M`, and one by 4 `dd bs=1M`
at once; the GET bytes are the daemon's own (`lakemount stats --json`,
`s3_get_bytes`). Objects of 256 MiB + 1,500 bytes (one per read, all in the
server's memory at once), uploaded with curl.

  python3 bench/cache_blocks.py --runs 3 [--size-mib 256] NAME=BINARY ...
      (as root; after `cargo build --release -p lakemount-testserver`)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

BUCKET = "lakebench-full"
READS = [("dd-128k", 1), ("dd-1m", 1), ("dd-1m-x4", 4)]


def upload(g, key, path):
    url = f"{g.endpoint}/{BUCKET}/{key}"
    h.run(["curl", "-sf", "-X", "PUT", "--aws-sigv4", f"aws:amz:{g.region}:s3", "--user",
           f"{g.key_id}:{g.secret}", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", path, url])


def read(path, bs, readers):
    cmd = ["dd", f"if={path}", "of=/dev/null", f"bs={bs}"]
    t = time.monotonic()
    procs = [subprocess.Popen(cmd, stderr=subprocess.DEVNULL) for _ in range(readers)]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError(f"dd of {path} failed")
    return time.monotonic() - t


def get_bytes(binary, mnt):
    out = h.run([binary, "stats", "--json", mnt]).stdout
    return json.loads(out)["read"]["s3_get_bytes"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("binaries", nargs="+", help="NAME=PATH of a lakemount binary")
    a = p.parse_args()
    systems = [b.split("=", 1) for b in a.binaries]
    bench_dir = os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(h.REPO), "bench-data")
    server_bin = os.path.join(h.REPO, "target", "release", "lakemount-testserver")
    g = h.MemServer(bench_dir, server_bin, int(os.environ.get("BENCH_PORT_BASE", "39800")))
    size = a.size_mib * (1 << 20) + 1500
    results = {}
    g.start()
    try:
        with tempfile.TemporaryDirectory(dir=bench_dir) as tmp:
            src = os.path.join(tmp, "obj")
            with open(src, "wb") as f:
                f.write(os.urandom(size))
            keys = [f"blocks/{r}-{i}" for r in range(a.runs) for i in range(len(systems) * len(READS))]
            for k in keys:
                upload(g, k, src)
            os.remove(src)
            env = h.s3_env(g)
            next_key = iter(keys)
            for run in range(a.runs):
                for name, binary in systems:
                    cache = os.path.join(tmp, f"cache-{name}-{run}")
                    mnt = os.path.join(bench_dir, "mnt", "cache-blocks")
                    cmd = [binary, "mount", f"s3://{BUCKET}", mnt, "--cache-dir", cache]
                    m = h.Mount(name, cmd, env, mnt, os.path.join(tmp, f"{name}.log"), " ".join(cmd))
                    m.start()
                    try:
                        for read_name, readers in READS:
                            key = next(next_key)
                            before = get_bytes(binary, mnt)
                            bs = "128k" if read_name == "dd-128k" else "1M"
                            secs = read(os.path.join(mnt, key), bs, readers)
                            fetched = get_bytes(binary, mnt) - before
                            results.setdefault((name, read_name), []).append((secs, fetched))
                            h.log(f"run {run + 1} {name} {read_name}: {secs:.2f} s, GET bytes {fetched / size:.3f}x")
                    finally:
                        m.stop()
                        shutil.rmtree(cache, ignore_errors=True)
    finally:
        g.stop()
    print(f"\nobject {size:,} bytes, medians of {a.runs} runs\n")
    print("| binary | read | MiB/s (of the bytes readers got) | GET bytes / object size |")
    print("|---|---|---|---|")
    for name, _ in systems:
        for read_name, readers in READS:
            runs = results[(name, read_name)]
            mibs = statistics.median(size * readers / s / (1 << 20) for s, _ in runs)
            ratio = statistics.median(f / size for _, f in runs)
            print(f"| {name} | {read_name} | {mibs:,.0f} | {ratio:.3f} |")
    print("\nEvery run (seconds, GET bytes / size):")
    for (name, read_name), runs in results.items():
        print(f"- {name} {read_name}: " + ", ".join(f"{s:.2f} s / {f / size:.3f}x" for s, f in runs))


if __name__ == "__main__":
    main()
