#!/usr/bin/env python3
"""Reads through injected faults (issue 13), hand-run; see bench/README.md.

Every system (lakemount, rclone mount without cache, s3fs, Mountpoint) reads
4 shards of 256 MiB and 2,000 small files (4-12 KiB, 20 directories) with 8
reader threads, through the fault proxy of testserver/src/faults.rs
(target/release/lakemount-faultproxy) in front of Garage or the in-memory
server: fault-free, then with --rate of the requests broken (every kind of
the proxy: 500 and 503 with XML bodies, reset before and mid-body, body cut
short, a 20 s stall mid-body, a 2 s slow first byte, a 200 instead of a
206, a wrong Content-Range). A fresh mount, a new proxy and a cold page
cache per measurement; each run uses its own proxy seed. Peers are mounted
with the flags of bench/harness.py. A read phase longer than --timeout is
stopped (the mount is torn down) and reported as such.

    python3 bench/faults.py [--server garage|memory] [--runs 3] [--rate 0.1]
                            [--systems lakemount,rclone-off,s3fs,mount-s3]

One line per measurement, then a Markdown table of medians. Builds nothing:
`cargo build --release --workspace` (and bench/mountpoint for mount-s3) first.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

REPO = harness.REPO
PROXY = os.path.join(REPO, "target", "release", "lakemount-faultproxy")

READER = r"""
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
            res = "ok" if got == f.read() else "wrong"
    except OSError as e:
        res = "failed"
    sys.stdout.write(f"{res} {r}\n")  # one write: lines of 8 threads do not mix
    sys.stdout.flush()
t = time.time()
with cf.ThreadPoolExecutor(8) as ex:
    list(ex.map(check, rel))
print("seconds", f"{time.time() - t:.2f}", flush=True)
"""


def tally(text):
    """What READER printed: ({"ok": n, "wrong": n, "failed": n}, seconds or None)."""
    lines = text.splitlines()
    res = [line.split(" ", 1)[0] for line in lines if line.startswith(("ok ", "wrong ", "failed "))]
    secs = next((float(line.split()[1]) for line in lines if line.startswith("seconds ")), None)
    return {k: res.count(k) for k in ("ok", "wrong", "failed")}, secs


def make_data(a, rawget):
    d = os.path.join(a.bench_dir, "data", "faults")
    if not os.path.exists(os.path.join(d, ".done")):
        harness.run([rawget, "gen-shards", "--dir", f"{d}/shards", "--count", "4", "--size", str(256 << 20),
                     "--seed", "21"])
        harness.run([rawget, "gen-files", "--dir", f"{d}/small", "--dirs", "20", "--per-dir", "100",
                     "--min", "4096", "--max", "12288", "--ext", "jpg", "--seed", "22"])
        open(os.path.join(d, ".done"), "w").close()
    return d


def upload(a, g, bucket, data, rawget):
    marker = os.path.join(a.bench_dir, f"faults-uploaded-{a.server}-{bucket}")
    if a.server != "memory" and os.path.exists(marker):
        return
    env = harness.s3_env(g)
    for sub in ("shards", "small"):
        harness.run([rawget, "put", "--bucket", bucket, "--dir", f"{data}/{sub}", "--prefix", f"{sub}/",
                     "--concurrency", "32", "--endpoint", g.endpoint, "--region", g.region], env=env)
    open(marker, "w").close()


def measure(a, g, bucket, name, rate, seed, data):
    """One read of everything through a fresh proxy and mount: a dict."""
    port = a.port_base + 40
    trace = os.path.join(a.bench_dir, "logs", f"faults-proxy-{name}-{rate}-{seed}.trace")
    proxy = subprocess.Popen(
        [PROXY, "--upstream", g.endpoint.removeprefix("http://"), "--port", str(port), "--rate", str(rate),
         "--seed", str(seed), "--stall-ms", "20000", "--slow-ms", "2000"],
        stdout=subprocess.PIPE, stderr=open(trace, "w"), text=True,
        env=dict(os.environ, LAKEMOUNT_FAULTPROXY_TRACE="1"))
    proxy.stdout.readline()  # endpoint=...
    via = types.SimpleNamespace(**vars(g))
    via.endpoint = f"http://127.0.0.1:{port}"
    make, why = harness.mount_factory(name, a, via, bucket)
    if make is None:
        proxy.kill()
        return {"system": name, "skipped": why}
    m = make()
    out = {"system": name, "rate": rate, "seed": seed}
    try:
        m.start()
        harness.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        r = subprocess.Popen([sys.executable, "-c", READER, m.mnt, data], stdout=subprocess.PIPE, text=True)
        try:
            text, _ = r.communicate(timeout=a.timeout)
            out["timed_out"] = False
        except subprocess.TimeoutExpired:
            # Tear the mount down: blocked reads fail and the reader ends.
            harness.run(["umount", "-l", m.mnt], check=False)
            if m.proc:
                m.proc.kill()
            text, _ = r.communicate()
            out["timed_out"] = True
        counts, secs = tally(text)
        out.update(counts)
        out["secs"] = secs if secs is not None and not out["timed_out"] else float(a.timeout)
    finally:
        m.stop()
        proxy.send_signal(2)
        tail, _ = proxy.communicate(timeout=30)
    out["injected"] = sum(int(l.split()[2]) for l in tail.splitlines() if l.startswith("injected "))
    out["requests"] = next((int(l.split()[1]) for l in tail.splitlines() if l.startswith("requests ")), 0)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", choices=["garage", "memory"], default="garage")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--systems", default="lakemount,rclone-off,s3fs,mount-s3")
    p.add_argument("--timeout", type=float, default=600.0, help="longest read phase, seconds")
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(REPO),
                                                                                      "bench-data"))
    p.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "39800")))
    p.add_argument("--garage", default=os.environ.get("GARAGE_BIN") or os.path.expanduser("~/.cargo/bin/garage"))
    p.add_argument("--memserver", default=os.path.join(REPO, "target", "release", "lakemount-testserver"))
    a = p.parse_args()
    rawget = os.path.join(harness.HERE, "rawget", "target", "release", "rawget")
    os.makedirs(os.path.join(a.bench_dir, "logs"), exist_ok=True)
    data = make_data(a, rawget)
    g = harness.make_server(a)
    bucket = "faults" if a.server == "garage" else "lakebench-quick"
    results = []
    try:
        g.start()
        g.bucket(bucket)
        upload(a, g, bucket, data, rawget)
        for run in range(1, a.runs + 1):
            for rate in (0.0, a.rate):
                for name in a.systems.split(","):
                    r = measure(a, g, bucket, name, rate, run, data)
                    print(r, flush=True)
                    results.append(r)
    finally:
        g.stop()
    print(f"\n| system | fault-free s | {a.rate:.0%} faults s | ratio | wrong | failed | timed out |")
    print("|---|---|---|---|---|---|---|")
    for name in a.systems.split(","):
        rs = [r for r in results if r["system"] == name and "secs" in r]
        free = [r["secs"] for r in rs if r["rate"] == 0]
        bad = [r for r in rs if r["rate"] > 0]
        if not free or not bad:
            continue
        bad_secs = [r["secs"] for r in bad]
        f, b = statistics.median(free), statistics.median(bad_secs)
        each = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        wrong = ", ".join(str(r["wrong"]) for r in bad)
        failed = ", ".join(str(r["failed"]) for r in bad)
        timed_out = sum(r["timed_out"] for r in bad)
        print(f"| {name} | {f:.2f} ({each(free)}) | {b:.2f} ({each(bad_secs)}) | {b / f:.1f}x | "
              f"{wrong} | {failed} | {timed_out} of {len(bad)} |")


if __name__ == "__main__":
    main()
