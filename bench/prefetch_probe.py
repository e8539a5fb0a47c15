#!/usr/bin/env python3
"""Times `metadata.prefetch_tree` against the benchmark's Garage: mounts the
benchmark bucket (whole, and prefixes of it) with the prefetch on and reports
what the daemon logged ("tree listed": objects, LIST pages, key ranges, pages
one after the other, seconds) and the ListObjectsV2 count Garage saw.

  python3 bench/prefetch_probe.py [PREFIX ...]     (after bench/run.sh built everything)
"""
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402


def main():
    bench_dir = os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(h.REPO), "bench-data")
    garage = os.environ.get("GARAGE_BIN") or os.path.expanduser("~/.cargo/bin/garage")
    preload = os.path.join(bench_dir, "nodelay.so")
    g = h.Garage(bench_dir, garage, int(os.environ.get("BENCH_PORT_BASE", "39800")),
                 preload if os.path.exists(preload) else None)
    bucket = "lakebench-full"
    prefixes = sys.argv[1:] or ["", "flat/", "tree/"]
    binary = os.path.join(h.REPO, "target", "release", "lakemount")
    g.start()
    try:
        g.bucket(bucket)
        env = h.s3_env(g)
        env.pop("AWS_ENDPOINT_URL", None)
        for prefix in prefixes:
            with tempfile.TemporaryDirectory() as tmp:
                conf = os.path.join(tmp, "c.toml")
                with open(conf, "w") as f:
                    f.write("[metadata]\nprefetch_tree = true\n")
                mnt = os.path.join(bench_dir, "mnt", "prefetch-probe")
                os.makedirs(mnt, exist_ok=True)
                log = os.path.join(tmp, "log")
                cmd = [binary, "mount", f"s3://{bucket}/{prefix}", mnt, "--endpoint-url", g.endpoint,
                       "--region", g.region, "--config", conf]
                before = g.counters()
                m = h.Mount("lakemount", cmd, env, mnt, log, "")
                m.start()
                try:
                    line = None
                    for _ in range(600):
                        with open(log) as f:
                            line = next((x for x in f if "tree listed" in x), None)
                        if line:
                            break
                        time.sleep(0.1)
                    lists = h.diff(g.counters(), before).get("ListObjectsV2", 0)
                finally:
                    m.stop()
                fields = dict(re.findall(r"(\w+)=([\d.]+)", line or ""))
                print(f"s3://{bucket}/{prefix}: {fields} ; ListObjectsV2 counted by Garage (probe included): {lists}",
                      flush=True)
    finally:
        g.stop()


if __name__ == "__main__":
    main()
