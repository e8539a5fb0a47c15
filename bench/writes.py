#!/usr/bin/env python3
"""Checkpoint-write benchmark (issue 14), run by `bench/run.sh writes`.

One checkpoint file of --size-gib (default 4 GiB), written in 1 MiB writes by
one process, and --writers (default 8) processes writing --writer-gib (1 GiB)
each at once. For each system and run, on a fresh mount and a fresh server:

- close: seconds from open() until close() returned (the training step may go
  on); for lakemount the bytes are then in staging on local disk.
- durable: seconds from open() until S3 holds the object: lakemount opens the
  file again and fsyncs it (fsync = durable in S3); rclone is polled by
  HeadObject (`rawget wait`) until the object has its size.

Systems: local-disk (the same writes to a file on the disk that holds
staging; `durable` there is write + fsync to the local disk), raw-mpu (the
same bytes uploaded from a local file by one multipart upload of 8 MiB parts,
16 in flight: the server's multipart-upload limit), lakemount (--read-write,
defaults), rclone-writes (--vfs-cache-mode writes, its write-back mode, with
--vfs-write-back 1s like lakemount's upload delay), mount-s3 (Mountpoint for
Amazon S3: sequential writes of new files, uploaded while written; close()
returns once the object is in S3, so close = durable).

The server is the in-memory one of testserver/, restarted for every
measurement so it holds one checkpoint at a time. Writes its section of
bench/RESULTS.md (the other sections are kept).
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

GIB = 1 << 30
SYSTEMS = ["local-disk", "raw-mpu", "lakemount", "rclone-writes", "mount-s3"]
BUCKET = "lakebench-full"

# The writer: `files` written at once (one process each), 1 MiB writes of a
# random 64 MiB block, timed from open to close; with `fsync`, fsync before
# close. Prints one JSON line per file.
WRITER = r"""
import json, os, sys, time
path, size, fsync = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
block = os.urandom(64 << 20)
mv = memoryview(block)
t = time.monotonic()
fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
done = 0
while done < size:
    n = min(1 << 20, size - done)
    off = done % len(block)
    os.write(fd, mv[off:off + n])
    done += n
written = time.monotonic() - t
if fsync:
    os.fsync(fd)
os.close(fd)
print(json.dumps({"written": written, "close": time.monotonic() - t, "start": t}))
"""

# fsync through a read-only descriptor: on lakemount it waits for S3.
SYNCER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.fsync(fd)
os.close(fd)
print(time.monotonic())
"""


def write_files(paths, size, fsync=False):
    """Writes every path at once (one process each): per-file results and the
    monotonic time the first started."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, p, str(size), "1" if fsync else "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in paths]
    out = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"writer exited {p.returncode}: {e[-400:]}")
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


def summary(res, end=None):
    """close (last close after the first open) and, given `end` (monotonic),
    durable seconds."""
    start = min(r["start"] for r in res)
    close = max(r["start"] + r["close"] for r in res) - start
    out = {"close": close}
    if end is not None:
        out["durable"] = end - start
    return out


def wait_port_free(port, limit=120):
    """Waits until `port` can be bound (the last server's sockets in
    TIME_WAIT are gone): the server binds without SO_REUSEADDR."""
    import socket
    t = time.monotonic()
    while time.monotonic() - t < limit:
        with socket.socket() as sk:
            try:
                sk.bind(("127.0.0.1", port))
                return
            except OSError:
                time.sleep(1)
    raise RuntimeError(f"port {port} still in use after {limit} s")


def names(n):
    return [f"ckpt-{i}.bin" for i in range(n)]


def run_local(a, n, size):
    d = os.path.join(a.bench_dir, "local-writes")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    paths = [os.path.join(d, f) for f in names(n)]
    r = summary(write_files(paths, size))
    for p in paths:
        os.remove(p)
    h.run(["sync"])
    rs = write_files(paths, size, fsync=True)
    r["durable"] = summary(rs)["close"]
    # Kept for raw-mpu: the same bytes, uploaded from local disk.
    return r, paths


def run_raw(a, g, paths):
    env = h.s3_env(g)
    t = time.monotonic()
    procs = [subprocess.Popen([a.rawget, "mpu", "--bucket", BUCKET, "--key", f"raw/{os.path.basename(p)}",
                               "--file", p, "--part", str(8 << 20), "--concurrency", "16",
                               "--endpoint", g.endpoint], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for p in paths]
    for p in procs:
        _, e = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"rawget mpu exited {p.returncode}: {e[-400:]}")
    secs = time.monotonic() - t
    return {"durable": secs}


def lakemount_mount(a, g):
    mnt = os.path.join(a.bench_dir, "mnt", "lakemount-rw")
    staging = os.path.join(a.bench_dir, "staging")
    shutil.rmtree(staging, ignore_errors=True)
    env = h.s3_env(g)
    env.pop("AWS_ENDPOINT_URL", None)
    binary = os.path.join(h.REPO, "target", "release", "lakemount")
    cmd = [binary, "mount", f"s3://{BUCKET}", mnt, "--endpoint-url", g.endpoint, "--region", g.region,
           "--read-write", "--staging-dir", staging]
    shown = " ".join(["target/release/lakemount", *cmd[1:]]).replace(a.bench_dir, "$BENCH_DIR")
    return h.Mount("lakemount", cmd, env, mnt, os.path.join(a.bench_dir, "logs", "lakemount-rw.log"), shown)


def rclone_mount(a, g):
    mnt = os.path.join(a.bench_dir, "mnt", "rclone-writes")
    cache = os.path.join(a.bench_dir, "rclone-write-cache")
    shutil.rmtree(cache, ignore_errors=True)
    env = h.s3_env(g)
    env.update({
        "RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
        "RCLONE_CONFIG_BENCH_ENDPOINT": g.endpoint, "RCLONE_CONFIG_BENCH_REGION": g.region,
        "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": g.key_id, "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": g.secret,
        "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true", "RCLONE_CONFIG_BENCH_LIST_VERSION": "2",
    })
    cmd = ["rclone", "mount", f"bench:{BUCKET}", mnt, "--vfs-cache-mode", "writes", "--cache-dir", cache,
           "--vfs-write-back", "1s", "--s3-chunk-size", "8M", "--s3-upload-concurrency", "16",
           "--log-level", "NOTICE"]
    shown = "RCLONE_CONFIG_BENCH_*=(s3, Other, path style) " + " ".join(cmd).replace(a.bench_dir, "$BENCH_DIR")
    return h.Mount("rclone-writes", cmd, env, mnt, os.path.join(a.bench_dir, "logs", "rclone-writes.log"), shown)


def mount_s3_mount(a, g):
    binary = h.mount_s3_binary()
    if not binary:
        raise RuntimeError(h.MOUNT_S3_MISSING)
    mnt = os.path.join(a.bench_dir, "mnt", "mount-s3-rw")
    env = h.s3_env(g)
    env.pop("AWS_ENDPOINT_URL", None)
    cmd = [binary, BUCKET, mnt, "--foreground", "--allow-writes", "--endpoint-url", g.endpoint,
           "--region", g.region, "--force-path-style"]
    shown = "AWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. " + " ".join(cmd).replace(h.HERE + "/", "bench/")
    return h.Mount("mount-s3", cmd, env, mnt, os.path.join(a.bench_dir, "logs", "mount-s3-rw.log"), shown)


def daemon_cpu(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_mount(a, g, system, n, size):
    m = {"lakemount": lakemount_mount, "rclone-writes": rclone_mount, "mount-s3": mount_s3_mount}[system](a, g)
    m.start()
    try:
        cpu0 = daemon_cpu(m.proc.pid)
        paths = [os.path.join(m.mnt, f) for f in names(n)]
        res = write_files(paths, size)
        if system == "lakemount":
            procs = [subprocess.Popen([sys.executable, "-c", SYNCER, p], stdout=subprocess.PIPE, text=True)
                     for p in paths]
            ends = [float(p.communicate()[0].strip()) for p in procs]
        elif system == "mount-s3":
            # close() returned once the upload completed.
            ends = [max(r["start"] + r["close"] for r in res)]
        else:
            env = h.s3_env(g)
            procs = [subprocess.Popen([a.rawget, "wait", "--bucket", BUCKET, "--key", f, "--size", str(size),
                                       "--endpoint", g.endpoint], env=env, stdout=subprocess.PIPE, text=True)
                     for f in names(n)]
            for p in procs:
                p.communicate()
            ends = [time.monotonic()]
        r = summary(res, max(ends))
        r["cpu"] = daemon_cpu(m.proc.pid) - cpu0
        r["rss_mib"] = m.peak_rss_mib()
        return r, m.shown
    finally:
        m.stop()


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, unit="s"):
    return "-" if v is None else f"{v:.2f} {unit}".strip()


def write(path, a, results, shown, started, finished, machine):
    lines = [
        f"Run {started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC, {a.runs} runs, medians. Machine: "
        f"{machine['cores']} cores, {machine['memory_gib']} GiB, kernel {machine['kernel']}. Server: "
        "lakemount-testserver (in-memory, loopback, no added latency), restarted per measurement.",
        "",
        "Command: `bench/run.sh writes " + " ".join(sys.argv[1:]) + "`",
        "",
        "`close`: seconds from open() to close() returning. `durable`: seconds from open() until S3",
        "holds the object (lakemount: an fsync after close returns; rclone: HeadObject shows it;",
        "mount-s3: close itself, which waits for the upload;",
        "local-disk: write + fsync on the local disk; raw-mpu: one multipart upload of the bytes from",
        "a local file, 8 MiB parts, 16 in flight). Ratios are to local-disk (close) and raw-mpu",
        "(rate: raw time / system time). CPU: the daemon's user+system seconds for the case.",
        "",
    ]
    for case, (n, gib) in (("one", (1, a.size_gib)), ("many", (a.writers, a.writer_gib))):
        title = f"{n} writer{'s' if n > 1 else ''} x {gib:g} GiB"
        lines += [f"## {title}", "", "| system | close | close / local | durable | raw rate / rate | daemon CPU | peak RSS |",
                  "|---|---|---|---|---|---|---|"]
        rows = results.get(case, {})
        local = med([r.get("close") for r in rows.get("local-disk", [])])
        raw = med([r.get("durable") for r in rows.get("raw-mpu", [])])
        for s in a.systems:
            rs = rows.get(s, [])
            errs = [r["error"] for r in rs if "error" in r]
            ok = [r for r in rs if "error" not in r]
            if not ok:
                lines.append(f"| {s} | {'error: ' + errs[0] if errs else 'not run'} |  |  |  |  |  |")
                continue
            c, d = med([r.get("close") for r in ok]), med([r.get("durable") for r in ok])
            ratio_c = f"{c / local:.2f}x" if c and local else "-"
            ratio_d = f"{raw / d:.2f}x" if d and raw else "-"
            cpu, rss = med([r.get("cpu") for r in ok]), med([r.get("rss_mib") for r in ok])
            lines.append(f"| {s} | {fmt(c)} | {ratio_c} | {fmt(d)} | {ratio_d} | {fmt(cpu)} | "
                         f"{'-' if rss is None else f'{rss:.0f} MiB'} |")
        lines.append("")
    lines += ["Mount commands:", ""] + [f"- {s}: `{c}`" for s, c in sorted(shown.items())] + [""]
    h.save_section(path, "writes", "Checkpoint writes (issue 14)", lines)


def main():
    p = argparse.ArgumentParser(description="checkpoint write benchmark (use bench/run.sh writes)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--size-gib", type=float, default=4.0)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--writer-gib", type=float, default=1.0)
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(h.REPO), "bench-data"))
    p.add_argument("--memserver", default=os.path.join(h.REPO, "target", "release", "lakemount-testserver"))
    p.add_argument("--rawget", default=os.path.join(HERE, "rawget", "target", "release", "rawget"))
    p.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "39800")))
    p.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    a = p.parse_args()
    a.bench_dir = os.path.abspath(a.bench_dir)
    a.systems = a.systems.split(",")
    for d in ("logs", "mnt"):
        os.makedirs(os.path.join(a.bench_dir, d), exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    results, shown = {}, {}
    cases = {"one": (1, int(a.size_gib * GIB)), "many": (a.writers, int(a.writer_gib * GIB))}
    for i in range(a.runs):
        for case, (n, size) in cases.items():
            local_paths = None
            for s in a.systems:
                g = h.MemServer(a.bench_dir, a.memserver, a.port_base)
                wait_port_free(g.s3_port)
                wait_port_free(g.stats_port)
                # Every measurement starts with no dirty pages of the last.
                h.run(["sync"])
                with open("/proc/sys/vm/drop_caches", "w") as f_:
                    f_.write("3\n")
                try:
                    g.start()
                    if s == "local-disk" or (s == "raw-mpu" and local_paths is None):
                        r, local_paths = run_local(a, n, size)
                        if s == "local-disk":
                            results.setdefault(case, {}).setdefault(s, []).append(r)
                            h.log(f"writes run {i + 1} {case} {s}: close {r['close']:.2f} s, durable {r['durable']:.2f} s")
                            continue
                    if s == "raw-mpu":
                        r = run_raw(a, g, local_paths)
                    elif s in ("lakemount", "rclone-writes", "mount-s3"):
                        if s == "rclone-writes" and not shutil.which("rclone"):
                            raise RuntimeError("not installed: rclone")
                        r, shown[s] = run_mount(a, g, s, n, size)
                    else:
                        raise ValueError(s)
                    results.setdefault(case, {}).setdefault(s, []).append(r)
                    h.log(f"writes run {i + 1} {case} {s}: " + json.dumps({k: round(v, 3) for k, v in r.items() if v is not None}))
                except Exception as e:  # noqa: BLE001 - recorded in the table
                    results.setdefault(case, {}).setdefault(s, []).append({"error": str(e)[:200]})
                    h.log(f"writes run {i + 1} {case} {s} FAILED: {e}")
                finally:
                    g.stop()
            if local_paths:
                for p_ in local_paths:
                    if os.path.exists(p_):
                        os.remove(p_)
    finished = datetime.datetime.now(datetime.timezone.utc)
    raw = os.path.join(a.bench_dir, "results", f"{started:%Y%m%dT%H%M%S}-writes.json")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    with open(raw, "w") as f:
        json.dump(results, f, indent=1)
    write(a.results, a, results, shown, started, finished, h.machine_info())
    h.log(f"wrote {a.results} (raw: {raw})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
