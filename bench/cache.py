#!/usr/bin/env python3
"""Epoch benchmark of the data cache (issue 6), run by `bench/run.sh cache`.

For each system, N runs of: an empty cache, a fresh mount, epoch 1 (2 GiB of
shards, then the 20,000 JPEG-sized files), unmount, the page cache of the
cache directory dropped (posix_fadvise DONTNEED), a fresh mount on the same
cache directory, epoch 2 (same reads). So epoch 2 reads the cache from the
disk, as after a restart, not from kernel memory. The limit is the same bytes
read from the local copy of the data set, also with its page cache dropped.

Systems: local-disk (the limit), lakemount (--cache-dir; fully cached files
by FUSE passthrough), lakemount-no-pt (the same with `cache.passthrough =
false`: every read through lakemount and its CRC32C checks), rclone-full
(--vfs-cache-mode full). The server is the in-memory one of testserver/ by
default (`--server garage` for Garage); GETs per epoch are the server's own
counts.
Writes its section of bench/RESULTS.md (the other sections are kept).
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as h  # noqa: E402

SHARDS = h.SHARD_KEYS[:2]  # 2 x 1 GiB
SYSTEMS = ["local-disk", "lakemount", "lakemount-no-pt", "rclone-full"]
GIB = 1 << 30
# Room one system's cache needs: the 2 GiB of shards, the 20,000 small files
# (40-200 KB: ~2.3 GiB), and allocation slack.
CACHE_NEED = 5 * GIB


def read_shards(root):
    """Two readers, one shard each, 1 MiB reads (dd). Returns MiB/s and bytes."""
    t = time.monotonic()
    procs = [subprocess.Popen(["dd", f"if={os.path.join(root, k)}", "of=/dev/null", "bs=1M"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for k in SHARDS]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"dd exited {p.returncode}: {err.decode()[-300:]}")
    secs = time.monotonic() - t
    n = sum(os.stat(os.path.join(root, k)).st_size for k in SHARDS)
    return {"value": n / h.MIB / secs, "bytes": n, "secs": secs}


# Epoch-2 shard reads per run, each paired with a local-disk read of the same
# bytes (page caches dropped before each): one pair is ~3 s of reading, and this
# VM's disk drifts by 2x between minutes, so a run takes the median of several.
SHARD_PAIRS = 3


def shard_pair(mnt, data, cache_dir, local_first):
    """(mount read, local-disk read) of the shards, page caches dropped first:
    the local copy's, the cache directory's, and the mount's own (without
    passthrough the kernel keeps the FUSE file's pages across opens)."""
    evict(cache_dir, os.path.join(mnt, "shards"), os.path.join(data, "shards"))
    if local_first:
        local = read_shards(data)
        evict(cache_dir, os.path.join(mnt, "shards"))
        through = read_shards(mnt)
    else:
        through = read_shards(mnt)
        evict(os.path.join(data, "shards"))
        local = read_shards(data)
    return through, local


def read_small(root, m):
    cmd = [sys.executable, os.path.join(HERE, "workloads.py"), "loader-small", "--root", root,
           "--dirs", str(m["jpeg_dirs"]), "--per-dir", str(m["jpeg_per"]), "--workers", "8", "--secs", "600"]
    r = h.run_group(cmd, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"loader-small exited {r.returncode}: {r.stderr.strip()[-500:]}")
    j = h.last_json(r.stdout)
    if not j.get("complete"):
        raise RuntimeError("loader-small did not read every file")
    return {"value": j["files_per_s"], "mib_per_s": j["mib_per_s"], "secs": j["secs"]}


def evict(*paths):
    h.run([sys.executable, os.path.join(HERE, "workloads.py"), "evict", *paths])


def gets(g, before):
    return h.diff(g.counters(), before).get("GetObject", 0)


def du_bytes(path):
    r = h.run(["du", "-sb", path], check=False)
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else 0


def run_mount_system(name, a, g, bucket, m, cache_dir, data, local_first):
    """One run of epoch 1 + epoch 2 through `name`. Returns a dict of results.

    Epoch 2 is paired with a read of the same bytes from the local copy, right
    before (`local_first`) or right after the mount's, each with its page cache
    dropped: on this shared VM the disk's speed drifts by 2x between minutes
    (and whichever read comes first after a drop tends to be faster), so the
    per-run ratio of the pair, with the order alternating between runs, is the
    figure to compare; the medians of separate runs are shown too."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir, exist_ok=True)
    mnt = os.path.join(a.bench_dir, "mnt", name)
    logpath = os.path.join(a.bench_dir, "logs", f"{name}-cache.log")
    env = h.s3_env(g)
    env.pop("AWS_ENDPOINT_URL", None)
    if name.startswith("lakemount"):
        binary = os.path.join(h.REPO, "target", "release", "lakemount")
        cmd = [binary, "mount", f"s3://{bucket}", mnt, "--endpoint-url", g.endpoint, "--region", g.region,
               "--cache-dir", cache_dir, "--cache-max-size", "20GiB"]
        if name == "lakemount-no-pt":
            conf = os.path.join(a.bench_dir, "no-passthrough.toml")
            with open(conf, "w") as f:
                f.write("[cache]\npassthrough = false\n")
            cmd += ["--config", conf]
        shown = "target/release/lakemount " + " ".join(cmd[1:])
        if name == "lakemount-no-pt":
            shown += "  # the file holds [cache] passthrough = false"
    else:
        make, why = h.mount_factory("rclone-full", a, g, bucket)
        if make is None:
            raise RuntimeError(why)
        base = make()
        cmd = [c if c != os.path.join(a.bench_dir, "rclone-cache") else cache_dir for c in base.cmd]
        env = base.env
        shown = base.shown.replace(os.path.join(a.bench_dir, "rclone-cache"), cache_dir)
    res = {"cmd": shown}
    for epoch in (1, 2):
        mount = h.Mount(name, cmd, env, mnt, logpath, shown)
        log_from = os.path.getsize(logpath) if os.path.exists(logpath) else 0
        mount.start()
        try:
            paired = epoch == 2
            before = g.counters()
            if paired:
                # SHARD_PAIRS pairs (mount, local disk), the order alternating.
                pairs = [shard_pair(mount.mnt, data, cache_dir, local_first ^ (k % 2 == 1))
                         for k in range(SHARD_PAIRS)]
                res["shards2_pairs"] = [[a_["value"], b_["value"]] for a_, b_ in pairs]
                res["shards2"] = {"value": statistics.median(a_["value"] for a_, _ in pairs)}
                res["shards2_local"] = {"value": statistics.median(b_["value"] for _, b_ in pairs)}
            else:
                res[f"shards{epoch}"] = read_shards(mount.mnt)
            res[f"shards{epoch}"]["gets"] = gets(g, before)
            if paired and local_first:
                evict(os.path.join(data, "jpeg"))
                res["small2_local"] = read_small(data, m)
                evict(cache_dir)
            before = g.counters()
            res[f"small{epoch}"] = read_small(mount.mnt, m)
            res[f"small{epoch}"]["gets"] = gets(g, before)
            if paired and not local_first:
                evict(os.path.join(data, "jpeg"))
                res["small2_local"] = read_small(data, m)
            res[f"rss{epoch}"] = mount.peak_rss_mib()
        finally:
            mount.stop()
        with open(logpath, "rb") as f:
            f.seek(log_from)
            log = f.read().decode("utf-8", "replace")
        if "data cache is not storing anything new" in log:
            # The disk is at cache.min_free: a run that measured S3, not the cache.
            raise RuntimeError(f"{name}: the cache's disk is at its free-space reserve "
                               f"(see {logpath}); free space and run again")
        res[f"cache_bytes{epoch}"] = du_bytes(cache_dir)
        evict(cache_dir)
    return res


def check_space(path, need):
    """Stops the run when the file system of `path` cannot hold `need` more
    bytes above lakemount's default free-space reserve (cache.min_free = 5%)."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    reserve = st.f_blocks * st.f_frsize * 5 // 100
    if free < reserve + need:
        sys.exit(f"cache benchmark: {path} has {free / GIB:.1f} GiB free; it needs "
                 f"{need / GIB:.1f} GiB for a cache above the default 5% reserve "
                 f"({reserve / GIB:.1f} GiB): free space first")


def run_local(data, m):
    evict(os.path.join(data, "shards"))
    s = read_shards(data)
    evict(os.path.join(data, "jpeg"))
    f = read_small(data, m)
    return {"shards1": s, "small1": f, "shards2": s, "small2": f}


def med(runs, key, field="value"):
    vals = [r[key][field] for r in runs if key in r and r[key].get(field) is not None]
    return statistics.median(vals) if vals else None


def write(path, a, g, results, started, finished, load_before, load_after):
    L = []
    L.append(f"Run {started:%Y-%m-%d %H:%M}-{finished:%H:%M} UTC with `bench/run.sh cache --runs {a.runs}`; "
             f"load average {load_before:.1f} before, {load_after:.1f} after (2 shared cores).")
    mi = h.machine_info()
    L.append(f"Machine: {mi['cores']} cores ({mi['cpu']}), {mi['memory_gib']} GiB, kernel {mi['kernel']}. "
             f"Server: {g.version()} on loopback (bench/README.md); cache and local copy on the same ext4 disk.")
    L.append("")
    L.append("Each run: empty cache, fresh mount, epoch 1 = 2 x 1 GiB shards read by 2 parallel `dd bs=1M`, "
             "then 20,000 JPEG-sized files (40-200 KB) read by 8 worker processes in shuffled order; unmount; "
             "page cache of the cache directory dropped (posix_fadvise DONTNEED); fresh mount on the same "
             "cache directory; epoch 2 = the same reads. The limit is local-disk: the same files read from the "
             "local copy of the data set with its page cache dropped first; \"paired\" is the median over runs "
             "of epoch 2 / a local-disk read of the same bytes taken right before or after it in the same run "
             f"(order alternating; for shards the median of {SHARD_PAIRS} such pairs per run, each pair with "
             "both page caches dropped first). Medians of the runs; GETs counted "
             "by the server. lakemount serves fully cached files by FUSE passthrough (the kernel reads the "
             "cache file); lakemount-no-pt is the same mount with `cache.passthrough = false`.")
    L.append("")
    L.append("| system | shards epoch 1 MiB/s | shards epoch 2 MiB/s | epoch 2 / local disk | GETs epoch 2 (shards) "
             "| small epoch 1 files/s | small epoch 2 files/s | epoch 2 / local disk | GETs epoch 2 (small) "
             "| cache on disk | peak RSS MiB |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    local = results.get("local-disk", [])
    ls, lf = med(local, "shards1"), med(local, "small1")
    for s in SYSTEMS:
        runs = [r for r in results.get(s, []) if "error" not in r]
        errs = [r["error"] for r in results.get(s, []) if "error" in r]
        if not runs:
            L.append(f"| {s} | " + " | ".join(["n/a"] * 10) + f" |  <!-- {'; '.join(errs)} -->")
            continue
        s1, s2 = med(runs, "shards1"), med(runs, "shards2")
        f1, f2 = med(runs, "small1"), med(runs, "small2")
        if s == "local-disk":
            L.append(f"| local-disk (limit) | {s1:.0f} | (same) | 1.00 | - | {f1:.0f} | (same) | 1.00 | - | - | - |")
            continue
        ratio = (lambda x, y: f"{x / y:.2f}" if x and y else "n/a (no local-disk run)")
        def paired(key):
            rs = [statistics.median(a_ / b_ for a_, b_ in r[key + "_pairs"]) if key + "_pairs" in r
                  else r[key]["value"] / r[key + "_local"]["value"] for r in runs if key + "_local" in r]
            return f" (paired {statistics.median(rs):.2f})" if rs else ""
        g2s = statistics.median([r["shards2"]["gets"] for r in runs])
        g2f = statistics.median([r["small2"]["gets"] for r in runs])
        cb = statistics.median([r["cache_bytes2"] for r in runs])
        rss = max((r.get("rss2") or 0) for r in runs)
        L.append(f"| {s} | {s1:.0f} | {s2:.0f} | {ratio(s2, ls)}{paired('shards2')} | {g2s:.0f} | {f1:.0f} | {f2:.0f} "
                 f"| {ratio(f2, lf)}{paired('small2')} "
                 f"| {g2f:.0f} | {cb / 2**30:.2f} GiB | {rss:.0f} |")
    L.append("")
    L.append("Every run (shards MiB/s e1/e2, small files/s e1/e2, GETs e2):")
    L.append("")
    for s in SYSTEMS:
        for i, r in enumerate(results.get(s, [])):
            if "error" in r:
                L.append(f"- {s} run {i + 1}: FAILED: {r['error']}")
                continue
            pl = ""
            if "shards2_pairs" in r:
                pl = "; shard pairs (mount/local MiB/s) " + ", ".join(f"{x:.0f}/{y:.0f}" for x, y in r["shards2_pairs"])
                pl += f"; small paired local disk {r['small2_local']['value']:.0f} files/s"
            elif "shards2_local" in r:
                pl = (f"; paired local disk {r['shards2_local']['value']:.0f} MiB/s, "
                      f"{r['small2_local']['value']:.0f} files/s")
            L.append(f"- {s} run {i + 1}: {r['shards1']['value']:.0f}/{r['shards2']['value']:.0f} MiB/s, "
                     f"{r['small1']['value']:.0f}/{r['small2']['value']:.0f} files/s, GETs e2 "
                     f"{r['shards2'].get('gets', '-')}/{r['small2'].get('gets', '-')}{pl}")
    L.append("")
    L.append("Commands:")
    L.append("")
    for s in SYSTEMS:
        for r in results.get(s, []):
            if "cmd" in r:
                L.append(f"- {s}: `{r['cmd']}`")
                break
    h.save_section(path, "cache", f"Data cache epochs (issue 6), {started:%Y-%m-%d}", L)


def main():
    p = argparse.ArgumentParser(description="cache epoch benchmark (use bench/run.sh cache)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(h.REPO), "bench-data"))
    p.add_argument("--server", choices=["memory", "garage"], default="memory",
                   help="S3 server for epoch 1 (default: the in-memory one of testserver/)")
    p.add_argument("--memserver", default=os.path.join(h.REPO, "target", "release", "lakemount-testserver"))
    p.add_argument("--garage", default=os.environ.get("GARAGE_BIN") or shutil.which("garage") or os.path.expanduser("~/.cargo/bin/garage"))
    p.add_argument("--rawget", default=os.path.join(HERE, "rawget", "target", "release", "rawget"))
    p.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "39800")))
    p.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    a = p.parse_args()
    a.bench_dir = os.path.abspath(a.bench_dir)
    for d in ("logs", "mnt"):
        os.makedirs(os.path.join(a.bench_dir, d), exist_ok=True)
    systems = a.systems.split(",")
    m = h.MODES["full"]
    preload = os.path.join(a.bench_dir, "nodelay.so")
    g = h.make_server(a, preload if os.path.exists(preload) else None)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = h.loadavg()
    results = {}
    try:
        g.start()
        bucket = "lakebench-full"
        data = h.make_data(a, "full", g, bucket, a.rawget)
        check_space(a.bench_dir, CACHE_NEED)
        for i in range(a.runs):
            for s in systems:
                t = time.monotonic()
                try:
                    if s == "local-disk":
                        r = run_local(data, m)
                    else:
                        r = run_mount_system(s, a, g, bucket, m, os.path.join(a.bench_dir, f"cache-{s}"),
                                             data, local_first=(i % 2 == 1))
                    results.setdefault(s, []).append(r)
                    h.log(f"cache run {i + 1}/{a.runs} {s:12} shards {r['shards1']['value']:.0f}/"
                          f"{r['shards2']['value']:.0f} MiB/s, small {r['small1']['value']:.0f}/"
                          f"{r['small2']['value']:.0f} files/s, GETs e2 {r['shards2'].get('gets', '-')}/"
                          f"{r['small2'].get('gets', '-')} ({time.monotonic() - t:.0f} s, load {h.loadavg():.1f})")
                except Exception as e:  # noqa: BLE001 - recorded in the table
                    results.setdefault(s, []).append({"error": str(e)[:300]})
                    h.log(f"cache run {i + 1}/{a.runs} {s} FAILED: {e}")
        finished = datetime.datetime.now(datetime.timezone.utc)
        raw = os.path.join(a.bench_dir, "results", f"{started:%Y%m%dT%H%M%S}-cache.json")
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        with open(raw, "w") as f:
            json.dump(results, f, indent=1)
        write(a.results, a, g, results, started, finished, load_before, h.loadavg())
        h.log(f"wrote {a.results} (raw: {raw})")
    finally:
        for s in systems:
            mp_ = os.path.join(a.bench_dir, "mnt", s)
            if os.path.ismount(mp_):
                h.run(["umount", "-l", mp_], check=False)
            shutil.rmtree(os.path.join(a.bench_dir, f"cache-{s}"), ignore_errors=True)
        g.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
