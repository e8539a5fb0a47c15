#!/usr/bin/env python3
"""Soak under faults (issue 13), hand-run: is anything growing?

lakemount (defaults) is mounted through the fault proxy (--rate of the
requests broken, every kind, as bench/faults.py) in front of the in-memory
server or Garage, and --readers threads read the data set of
bench/faults.py (4 x 256 MiB shards, 2,000 small files) over and over for
--seconds, in random order, each file's page cache dropped before it is
read and its bytes hashed against the local copy. Every --every seconds
the daemon's RSS, open descriptors and threads are sampled.

    python3 bench/soak.py [--seconds 600] [--readers 16] [--rate 0.01]
                          [--server memory|garage]

Prints one line per sample, then the first and last fifth of the samples
side by side, files read, wrong and failed. Builds nothing.
"""

import argparse
import hashlib
import os
import random
import subprocess
import sys
import threading
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faults  # noqa: E402
import harness  # noqa: E402


def digest(path, chunk=1 << 20):
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        while b := f.read(chunk):
            h.update(b)
    return h.digest()


def sample(pid):
    status = open(f"/proc/{pid}/status").read()
    field = lambda k: int(next(l.split()[1] for l in status.splitlines() if l.startswith(k + ":")))  # noqa: E731
    return {"rss_mib": field("VmRSS") / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": field("Threads")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", choices=["garage", "memory"], default="memory")
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--readers", type=int, default=16)
    p.add_argument("--rate", type=float, default=0.01)
    p.add_argument("--every", type=float, default=10)
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(harness.REPO),
                                                                                      "bench-data"))
    p.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "39800")))
    p.add_argument("--garage", default=os.environ.get("GARAGE_BIN") or os.path.expanduser("~/.cargo/bin/garage"))
    p.add_argument("--memserver", default=os.path.join(harness.REPO, "target", "release", "lakemount-testserver"))
    a = p.parse_args()
    rawget = os.path.join(harness.HERE, "rawget", "target", "release", "rawget")
    os.makedirs(os.path.join(a.bench_dir, "logs"), exist_ok=True)
    data = faults.make_data(a, rawget)
    rel = sorted(os.path.relpath(os.path.join(d, f), data) for sub in ("shards", "small")
                 for d, _, fs in os.walk(os.path.join(data, sub)) for f in fs)
    want = {r: digest(os.path.join(data, r)) for r in rel}
    g = harness.make_server(a)
    bucket = "faults" if a.server == "garage" else "lakebench-quick"
    port = a.port_base + 41
    proxy = m = None
    try:
        g.start()
        g.bucket(bucket)
        faults.upload(a, g, bucket, data, rawget)
        proxy = subprocess.Popen(
            [faults.PROXY, "--upstream", g.endpoint.removeprefix("http://"), "--port", str(port), "--rate",
             str(a.rate), "--seed", "7", "--stall-ms", "20000", "--slow-ms", "2000"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proxy.stdout.readline()
        via = types.SimpleNamespace(**vars(g))
        via.endpoint = f"http://127.0.0.1:{port}"
        make, _ = harness.mount_factory("lakemount", a, via, bucket)
        m = make()
        m.start()
        stop = time.monotonic() + a.seconds
        counts = {"ok": 0, "wrong": 0, "failed": 0}
        lock = threading.Lock()

        def reader(seed):
            rng = random.Random(seed)
            while time.monotonic() < stop:
                r = rng.choice(rel)
                try:
                    res = "ok" if digest(os.path.join(m.mnt, r)) == want[r] else "wrong"
                except OSError:
                    res = "failed"
                with lock:
                    counts[res] += 1
                if res != "ok":
                    print(f"{res}: {r}", flush=True)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(a.readers)]
        for t in threads:
            t.start()
        samples = []
        t0 = time.monotonic()
        while time.monotonic() < stop:
            time.sleep(a.every)
            s = sample(m.proc.pid)
            s["t"] = time.monotonic() - t0
            with lock:
                s.update(counts)
            samples.append(s)
            print(f"t={s['t']:.0f}s rss={s['rss_mib']:.0f}MiB fds={s['fds']} threads={s['threads']} "
                  f"files ok={s['ok']} wrong={s['wrong']} failed={s['failed']}", flush=True)
        for t in threads:
            t.join()
    finally:
        if m:
            m.stop()
        if proxy:
            proxy.send_signal(2)
            tail, _ = proxy.communicate(timeout=30)
            print("proxy:", " ".join(l for l in tail.splitlines() if l.startswith(("injected", "requests"))))
        g.stop()
    fifth = max(1, len(samples) // 5)
    for name, part in (("first fifth", samples[:fifth]), ("last fifth", samples[-fifth:])):
        print(f"{name}: rss {min(s['rss_mib'] for s in part):.0f}-{max(s['rss_mib'] for s in part):.0f} MiB, "
              f"fds {min(s['fds'] for s in part)}-{max(s['fds'] for s in part)}, "
              f"threads {min(s['threads'] for s in part)}-{max(s['threads'] for s in part)}")
    print(f"files: ok={counts['ok']} wrong={counts['wrong']} failed={counts['failed']}")


if __name__ == "__main__":
    main()
