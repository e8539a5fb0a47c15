#!/usr/bin/env python3
"""The `torch` suite: a real PyTorch DataLoader over 20,000 small files, run by
`bench/run.sh torch` (see bench/README.md, "The PyTorch DataLoader suite").

Per run (default 3; medians reported), per variant (files, tar), per system: a
fresh mount (and an empty cache directory), the loader of bench/torch_loader.py
(torch's DataLoader, 4 workers, batch 64) builds its index, then reads two
epochs; before each epoch the page cache is dropped (`echo 1 >
/proc/sys/vm/drop_caches`, the page cache only, for local disk as for the
mounts; see --drop-mounts), and the S3 server's request counters and the mount daemon's
CPU time (/proc/PID/stat utime+stime) are taken before and after it.
Every sample's size and CRC32 is checked against the data set's manifest in
both epochs. Beside the mounts, the same run measures local disk (the same
files) and the raw limit: bench/rawget GETs every object of the prefix with 32
and 64 in flight (files) or the shards in 8 MiB ranges with 16 in flight (tar).

The server (--server) is by default the in-memory one of testserver/ with an
emulated time to first byte (--ttfb-ms, default 20): at 0 ms every request is
answered at memory speed and what a mount does per small file (HEADs, LISTs,
GETs one after another) is hidden. Writes the `torch` section of
bench/RESULTS.md. `--server garage` runs the same against the single-node Garage
of bench/harness.py (no emulated latency; data uploaded once per Garage data
dir), with the TCP_NODELAY shim of bench/nodelay/ (--nodelay, default
$BENCH_DIR/nodelay.so) or without it (`--nodelay none`: every small GET then
waits ~40 ms on the client's Delayed ACK); such a run writes its own section,
`torch-garage-nodelay` or `torch-garage-no-nodelay`, beside the `torch` one.
"""

import argparse
import datetime
import json
import os
import queue
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as h  # noqa: E402

SYSTEMS = ["raw-get", "local-disk", "lakemount", "lakemount-nocache", "mount-s3", "rclone-full", "s3fs"]
# Selectable with --systems. lakemount-off / -nocache-off: small-object read-ahead
# off (read.small_max_size = 0); lakemount-half / -half-off: the data cache (disk
# tier, no memory tier) holds half of the data set, with read-ahead on / off;
# lakemount-noopen / -nocache-noopen: no FUSE opens (read.no_open = true).
OPTIONAL = ["rclone-off", "lakemount-off", "lakemount-nocache-off", "lakemount-half", "lakemount-half-off",
            "lakemount-noopen", "lakemount-nocache-noopen"]
# The config file of each lakemount system ({half}: half of the data set, bytes).
LAKEMOUNT_TOML = {
    "lakemount-off": "[read]\nsmall_max_size = 0\n",
    "lakemount-nocache-off": "[read]\nsmall_max_size = 0\n",
    "lakemount-half": "[cache]\nmax_size = {half}\nmin_free = 0\nmemory_size = 0\n",
    "lakemount-half-off": "[read]\nsmall_max_size = 0\n[cache]\nmax_size = {half}\nmin_free = 0\nmemory_size = 0\n",
    "lakemount-noopen": "[read]\nno_open = true\n",
    "lakemount-nocache-noopen": "[read]\nno_open = true\n",
}
VARIANTS = ["files", "tar"]
BUCKET = "lakebench-full"
PER_DIR = 200
SEED = 3  # rawget gen-files seed: not tree/'s (seed 1), which has the same names
CLK_TCK = os.sysconf("SC_CLK_TCK")
EPOCHS = 2
DAEMON_NAMES = {"lakemount": "lakemount", "lakemount-nocache": "lakemount", "lakemount-off": "lakemount",
                "lakemount-nocache-off": "lakemount", "lakemount-half": "lakemount",
                "lakemount-half-off": "lakemount", "lakemount-noopen": "lakemount",
                "lakemount-nocache-noopen": "lakemount", "mount-s3": "mount-s3",
                "rclone-full": "rclone", "rclone-off": "rclone", "s3fs": "s3fs"}


def log(*a):
    h.log(*a)


# ------------------------------------------------------------------ data


def prefixes(files):
    """S3 prefixes of the two variants; the published size keeps the short names."""
    sfx = "" if files == 20_000 else f"-{files}"
    return f"torch-small{sfx}/", f"torch-tar{sfx}/"


def make_data(a, g):
    """The data set, generated when missing, uploaded when the server lacks it: at
    every start of the in-memory server (which holds nothing before), once per Garage
    data dir. As in harness.make_data, a marker in the server's dir
    (`uploaded-BUCKET-torch-N.json`, the spec of what was uploaded; MemServer.start
    removes every `uploaded-*`) says what the server holds."""
    d = gen_data(a)
    pf, pt = prefixes(a.files)
    spec = dict(d["spec"], garage_block_size="256K")  # re-upload when Garage's block size changes
    g.bucket(BUCKET)
    up = os.path.join(g.dir, f"uploaded-{BUCKET}-torch-{a.files}.json")
    have = None
    if os.path.exists(up):
        with open(up) as f:
            have = json.load(f)
    if have == spec:
        log(f"  s3://{BUCKET}/{pf} and {pt}: already uploaded to this server ({up})")
        d["uploaded"] = False
        return d
    log(f"uploading the torch data set to s3://{BUCKET}/{pf} and {pt} (at every start of the in-memory server; "
        "once per Garage data dir)")
    env = h.s3_env(g)
    for sub, prefix in (("files", pf), ("shards", pt)):
        r = h.run([a.rawget, "put", "--bucket", BUCKET, "--dir", os.path.join(d["dir"], sub), "--prefix", prefix,
                   "--concurrency", "32"], env=env)
        log(f"  put {prefix}: " + json.dumps(h.last_json(r.stdout)))
    with open(up + ".tmp", "w") as f:
        json.dump(spec, f)
    os.replace(up + ".tmp", up)
    d["uploaded"] = True
    return d


def gen_data(a):
    """Generates (once, deterministic) DIR/files/dNNN/fNNNN.bin, their manifest and
    the tar shards of the same samples."""
    n, nshards = a.files, a.shards
    if n % PER_DIR:
        sys.exit(f"--files must be a multiple of {PER_DIR}")
    dirs = n // PER_DIR
    data = os.path.join(a.bench_dir, "data", f"torch-{n}")
    files_dir, shards_dir = os.path.join(data, "files"), os.path.join(data, "shards")
    manifest = os.path.join(data, "manifest.json")
    spec = {"files": n, "dirs": dirs, "per_dir": PER_DIR, "min": 4096, "max": 12288, "seed": SEED,
            "shards": nshards, "format": 1}
    have = None
    if os.path.exists(manifest):
        with open(manifest) as f:
            have = json.load(f).get("spec")
    if have != spec:
        t = time.monotonic()
        log(f"generating the torch data set in {data}: {n:,} files in {dirs} directories, {nshards} tar shards")
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        h.run([a.rawget, "gen-files", "--dir", files_dir, "--dirs", str(dirs), "--per-dir", str(PER_DIR),
               "--min", "4096", "--max", "12288", "--ext", "bin", "--seed", str(SEED)])
        names = [f"d{d:03}/f{i:04}.bin" for d in range(dirs) for i in range(PER_DIR)]
        samples = []
        for name in names:
            with open(os.path.join(files_dir, name), "rb") as f:
                b = f.read()
            samples.append({"name": name, "size": len(b), "crc32": zlib.crc32(b)})
        # WebDataset-style shards: contiguous runs of the samples in name order,
        # deterministic headers (ustar, mtime 0, root-owned) so every machine gets the same bytes.
        os.makedirs(shards_dir)
        shard_names = [f"shard-{k:04}.tar" for k in range(nshards)]
        for k, sname in enumerate(shard_names):
            with tarfile.open(os.path.join(shards_dir, sname), "w", format=tarfile.USTAR_FORMAT) as tf:
                for name in names[k * n // nshards:(k + 1) * n // nshards]:
                    ti = tarfile.TarInfo(name)
                    path = os.path.join(files_dir, name)
                    ti.size = os.path.getsize(path)
                    ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0o644, 0, 0, "", ""
                    with open(path, "rb") as f:
                        tf.addfile(ti, f)
        with open(manifest + ".tmp", "w") as f:
            json.dump({"spec": spec, "samples": samples, "shards": shard_names,
                       "bytes": sum(s["size"] for s in samples)}, f)
        os.replace(manifest + ".tmp", manifest)
        log(f"  generated in {time.monotonic() - t:.0f} s")
    with open(manifest) as f:
        m = json.load(f)
    return {"dir": data, "files": files_dir, "shards": shards_dir, "manifest": manifest, "spec": spec,
            "bytes": m["bytes"], "shard_names": m["shards"],
            "shard_bytes": sum(os.path.getsize(os.path.join(shards_dir, s)) for s in m["shards"])}


# ------------------------------------------------------------------ systems


def drop_caches(level):
    """`echo LEVEL > /proc/sys/vm/drop_caches`: 3 = page cache, dentries and inodes
    (also a FUSE mount's: the kernel FORGETs them and looks every file up again);
    1 = the page cache only."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write(f"{level}\n")


def cpu_secs(pid):
    """utime + stime of one process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def make_mount(name, a, g, cache_dir, data_bytes=0):
    """A fresh h.Mount of `name` (cache_dir: the empty cache directory of this run)."""
    mnt = os.path.join(a.bench_dir, "mnt", f"torch-{name}")
    logpath = os.path.join(a.bench_dir, "logs", f"torch-{name}.log")
    env = h.s3_env(g)
    env.pop("AWS_ENDPOINT_URL", None)
    if name.startswith("lakemount"):
        binary = a.lakemount
        cmd = [binary, "mount", f"s3://{BUCKET}", mnt, "--endpoint-url", g.endpoint, "--region", g.region]
        if "nocache" not in name:
            cmd += ["--cache-dir", cache_dir]
        toml = LAKEMOUNT_TOML.get(name)
        if toml is None and a.lakemount_config:
            with open(a.lakemount_config) as f:
                toml = f.read()
        if toml is not None:
            conf = os.path.join(a.bench_dir, "logs", f"torch-{name}.toml")
            with open(conf, "w") as f:
                f.write(toml.format(half=data_bytes // 2) if name in LAKEMOUNT_TOML else toml)
            cmd += ["--config", conf]
        shown = "AWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. " + " ".join(
            [getattr(a, "lakemount_shown", binary), *cmd[1:]]).replace(h.REPO + "/", "")
        if toml is not None:
            shown += "   # the config file: " + (toml.format(half=data_bytes // 2) if name in LAKEMOUNT_TOML
                                                    else toml).strip().replace("\n", "; ")
        return h.Mount(name, cmd, env, mnt, logpath, shown.replace(cache_dir, "CACHE_DIR"))
    if name == "mount-s3":
        binary = h.mount_s3_binary()
        if not binary:
            raise RuntimeError(h.MOUNT_S3_MISSING)
        cmd = [binary, BUCKET, mnt, "--foreground", "--read-only", "--endpoint-url", g.endpoint, "--region",
               g.region, "--force-path-style", "--metadata-ttl", "indefinite", "--cache", cache_dir]
        shown = "AWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. " + " ".join(cmd).replace(HERE + "/", "bench/")
        return h.Mount(name, cmd, env, mnt, logpath, shown.replace(cache_dir, "CACHE_DIR"))
    make, why = h.mount_factory(name, a, g, BUCKET)
    if make is None:
        raise RuntimeError(why)
    base = make()
    # The harness's command line, with this suite's mount point and cache directory.
    rc = os.path.join(a.bench_dir, "rclone-cache")
    swap = {rc: cache_dir, base.mnt: mnt}
    cmd = [swap.get(c, c) for c in base.cmd]
    shown = base.shown.replace(rc, "CACHE_DIR").replace(base.mnt, mnt)
    return h.Mount(name, cmd, base.env, mnt, logpath, shown)


class Loader:
    """bench/torch_loader.py in its own process group, driven epoch by epoch."""

    def __init__(self, a, variant, root, manifest):
        self.cmd = [a.python, os.path.join(HERE, "torch_loader.py"), variant, "--root", root,
                    "--manifest", manifest, "--epochs", str(EPOCHS)]
        self.p = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.q = queue.Queue()
        self.err = []
        threading.Thread(target=self._lines, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True).start()

    def _lines(self):
        for line in self.p.stdout:
            self.q.put(line)
        self.q.put(None)  # end of output: the loader exited

    def next(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the loader in {timeout:.0f} s")
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.p.wait()
                raise RuntimeError(f"loader exited {self.p.returncode}: {''.join(self.err)[-800:]}")
            line = line.strip()
            if line.startswith("{"):
                j = json.loads(line)
                if "error" in j:
                    raise RuntimeError(f"loader: {j['error']}")
                return j

    def go(self):
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()


def run_loader(a, g, variant, root, manifest, drop, pid=None):
    """Index + EPOCHS epochs; per epoch: caches dropped, then its time, the requests
    the server saw and the daemon's CPU seconds."""
    res = {}
    before = g.counters()
    loader = Loader(a, variant, root, manifest)
    try:
        j = loader.next(a.epoch_timeout)
        res["index"] = {"secs": j["secs"], "requests": h.diff(g.counters(), before)}
        for e in range(1, EPOCHS + 1):
            drop_caches(drop)
            before, cpu0 = g.counters(), (cpu_secs(pid) if pid else None)
            loader.go()
            j = loader.next(a.epoch_timeout)
            if not j.get("ok"):
                raise RuntimeError(f"epoch {e}: {j['bad']} samples with wrong bytes, {j['missing']} missing")
            j["requests"] = h.diff(g.counters(), before)
            if pid:
                j["daemon_cpu_s"] = cpu_secs(pid) - cpu0
            res[f"epoch{e}"] = j
        loader.next(60)  # the summary line
    finally:
        loader.close()
    return res


def measure_raw(a, g, variant, d):
    """The raw limit. With Garage the page cache is dropped first (`echo 1`), as before
    every epoch of a mount: Garage serves its blocks from files, and the mounts' epochs
    find them on disk, not in the page cache (the in-memory server holds its data in
    its own memory: nothing to drop)."""
    pf, pt = prefixes(a.files)
    out = {}
    if variant == "files":
        for c in a.raw_concurrency:
            cmd = [a.rawget, "small", "--bucket", BUCKET, "--prefix", pf, "--concurrency", str(c), "--max-secs", "3600"]
            if a.server == "garage":
                drop_caches(1)
            out[f"small-{c}"] = raw_one(g, cmd, a.files)
        if a.server == "garage":
            drop_caches(1)
        out[f"curl-{CURL_PARALLEL}"] = raw_curl(a, g, d, pf)
    else:
        keys = ",".join(pt + s for s in d["shard_names"])
        cmd = [a.rawget, "seq", "--bucket", BUCKET, "--keys", keys, "--concurrency", "16", "--max-secs", "3600"]
        if a.server == "garage":
            drop_caches(1)
        out["seq-16"] = raw_one(g, cmd, None)
    return out


# curl's --parallel-max is capped at 300 (curl 7.88, tool_main.h PARALLEL_MAX).
CURL_PARALLEL = 300


def raw_curl(a, g, d, prefix):
    """The raw limit measured with a lean C client: one `curl --parallel` over every
    object of the files variant (SigV4 by curl's --aws-sigv4, UNSIGNED-PAYLOAD),
    bodies to /dev/null. rawget (the AWS SDK for Rust) is CPU-bound on the client at
    ~1.4 cores on 2 shared cores, so curl shows more of what the server can serve."""
    cfg = os.path.join(a.bench_dir, "logs", "torch-curl-urls.cfg")
    n = 0
    with open(cfg, "w") as f:
        for dname in sorted(os.listdir(d["files"])):
            for name in sorted(os.listdir(os.path.join(d["files"], dname))):
                f.write(f'url = "{g.endpoint}/{BUCKET}/{prefix}{dname}/{name}"\noutput = "/dev/null"\n')
                n += 1
    cmd = ["curl", "-s", "--parallel", "--parallel-immediate", "--parallel-max", str(CURL_PARALLEL),
           "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "--aws-sigv4", f"aws:amz:{g.region}:s3",
           "--user", f"{g.key_id}:{g.secret}", "-K", cfg, "-w", r"%{http_code}\n"]
    before = g.counters()
    t = time.monotonic()
    r = h.run_group(cmd, env=h.s3_env(g), timeout=3600)
    secs = time.monotonic() - t
    codes = r.stdout.split()
    if r.returncode != 0 or len(codes) != n or any(c != "200" for c in codes):
        bad = sum(c != "200" for c in codes)
        raise RuntimeError(f"curl exited {r.returncode}, {len(codes)} answers for {n} objects, {bad} not 200")
    shown = shlex.join(cmd).replace(f"{g.key_id}:{g.secret}", "KEY:SECRET").replace(a.bench_dir, "$BENCH_DIR")
    return {"secs": round(secs, 4), "files": n, "files_per_s": round(n / secs, 1),
            "requests": h.diff(g.counters(), before),
            "cmd": shown + "   # the URL list: one url/output pair per object"}


def raw_one(g, cmd, files):
    before = g.counters()
    r = h.run_group(cmd, env=h.s3_env(g), timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"rawget exited {r.returncode}: {r.stderr.strip()[-500:]}")
    j = h.last_json(r.stdout)
    if files is not None and j.get("files") != files:
        raise RuntimeError(f"rawget read {j.get('files')} objects, not {files}")
    j["requests"] = h.diff(g.counters(), before)
    j["cmd"] = " ".join(cmd).replace(HERE + "/", "bench/")
    return j


def measure(s, variant, a, g, d):
    root_local = d["files"] if variant == "files" else d["shards"]
    pf, pt = prefixes(a.files)
    sub = (pf if variant == "files" else pt).rstrip("/")
    if s == "raw-get":
        return {"raw": measure_raw(a, g, variant, d)}
    if s == "local-disk":
        r = run_loader(a, g, variant, root_local, d["manifest"], a.drop_mounts)
        r["cmd"] = f"ROOT={root_local.replace(a.bench_dir, '$BENCH_DIR')}"
        return r
    cache_dir = os.path.join(a.bench_dir, f"torch-cache-{s}")
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir)
    mount = make_mount(s, a, g, cache_dir, d["bytes"] if variant == "files" else d["shard_bytes"])
    before = g.counters()
    mount.start()
    try:
        mount_reqs = h.diff(g.counters(), before)
        r = run_loader(a, g, variant, os.path.join(mount.mnt, sub), d["manifest"], a.drop_mounts, mount.proc.pid)
        r["mount_requests"] = mount_reqs
        r["rss_mib"] = mount.peak_rss_mib()
        r["cmd"] = mount.shown
        # Taken while mounted: mount-s3 empties its cache directory when it unmounts.
        du = h.run(["du", "-sb", cache_dir], check=False)
        if "nocache" not in s and s != "s3fs" and s != "rclone-off" and du.returncode == 0:
            r["cache_bytes"] = int(du.stdout.split()[0])
            if r["cache_bytes"] < d["bytes"] // 2 and "half" not in s:
                # A nearly full disk: lakemount's `cache.min_free` and
                # Mountpoint's default cache limit then store nothing.
                h.log(f"WARNING: {s}'s cache directory holds {r['cache_bytes'] / h.MIB:.0f} MiB of a "
                      f"{d['bytes'] / h.MIB:.0f} MiB data set; is the disk nearly full? (df {cache_dir})")
    finally:
        mount.stop()
        shutil.rmtree(cache_dir, ignore_errors=True)
    return r


def lakemount_version(binary):
    """Its --version, when it was built, and (for this checkout's build) the git
    commit and whether src/ had uncommitted changes."""
    r = h.run([binary, "--version"], check=False)
    v = ((r.stdout or "") + (r.stderr or "")).strip().splitlines()
    v = v[0] if v else "?"
    built = (datetime.datetime.fromtimestamp(os.path.getmtime(binary), datetime.timezone.utc)
             .strftime("%Y-%m-%d %H:%M UTC") if os.path.exists(binary) else "?")
    if os.path.abspath(binary).startswith(h.REPO + os.sep):
        rev = h.run(["git", "-C", h.REPO, "log", "-1", "--format=%h %ct"], check=False).stdout.split()
        dirty = h.run(["git", "-C", h.REPO, "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
                      check=False).stdout.strip()
        txt = f"{v} (binary built {built}; at the start of the run the checkout was at git {rev[0] if rev else '?'}"
        if dirty:
            txt += " with uncommitted changes in src/"
        if len(rev) > 1 and os.path.exists(binary) and os.path.getmtime(binary) < int(rev[1]):
            txt += "; the binary is older than that commit"
        return txt + ")"
    return f"{v} ({binary}; built {built})"


# ------------------------------------------------------------------ report


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt_reqs(reqs):
    reqs = reqs or {}
    get = reqs.get("GetObject", 0)
    lst = reqs.get("ListObjectsV2", 0) + reqs.get("ListObjects", 0)
    head = reqs.get("HeadObject", 0)
    # h.BYTES_READ (Garage: bytes read from its block files) is not a request.
    other = sum(v for k, v in reqs.items()
                if k not in ("GetObject", "ListObjectsV2", "ListObjects", "HeadObject", h.BYTES_READ))
    txt = f"{get:,} / {lst:,} / {head:,}"
    return txt + (f" (+{other:,} other)" if other else "")


def med_reqs(runs, key):
    ops = sorted({k for r in runs for k in r.get(key, {}).get("requests", {})})
    return {op: int(statistics.median(r.get(key, {}).get("requests", {}).get(op, 0) for r in runs)) for op in ops}


def server_kind(meta):
    """memory or garage (the raw JSON of a run before --server: memory)."""
    return meta.get("server_kind", "memory")


def section_name(meta):
    """The run's section of the results file: `torch` for the in-memory server, one per
    nodelay setting for Garage, so the suites of the servers stand side by side."""
    if server_kind(meta) == "memory":
        return "torch"
    return "torch-garage-nodelay" if meta.get("nodelay") else "torch-garage-no-nodelay"


def server_text(meta):
    if server_kind(meta) == "memory":
        return (f"Server: {meta['server']} with **{meta['ttfb_ms']:g} ms** emulated time to first byte on every GET, "
                "HEAD and LIST (`--ttfb-ms`).")
    shim = (f"**with the TCP_NODELAY shim** (`LD_PRELOAD={meta['nodelay']}`, bench/nodelay/nodelay.c)"
            if meta.get("nodelay") else
            "**without the TCP_NODELAY shim** (`--nodelay none`: Garage leaves Nagle's algorithm on, so a response "
            "smaller than a loopback segment waits for the client's delayed ACK, ~40 ms per small GET)")
    return (f"Server: Garage (`{meta['server']}`), one node on loopback with bench/harness.py's configuration "
            "(LMDB metadata, 256 KiB blocks, no compression, no scrub), " + shim + "; `--ttfb-ms`: n/a (no emulated "
            "time to first byte: Garage's own latency, on the same shared cores as the loader and the mount). "
            "Garage serves its blocks from files: the page cache is dropped (`echo 1`) before every raw-get "
            "measurement too. The data set was uploaded "
            + ("at the start of this run." if meta.get("uploaded") else
               "by an earlier run into the same Garage data dir (`$BENCH_DIR/garage`)."))


def merge_raw(raws, mixed_builds=False):
    """One (meta, results) of several runs' raw JSON against the same server and
    data set: the results of each system and variant pooled, each run named in
    meta["parts"]. Errors: runs of different servers or data sets."""
    metas = [r["meta"] for r in raws]
    for m in metas[1:]:
        for k in ("server_kind", "nodelay", "ttfb_ms", "files", "shards", "drop_mounts", "drop_local"):
            if m.get(k) != metas[0].get(k):
                sys.exit(f"--report: the runs differ in {k} ({metas[0].get(k)!r} vs {m.get(k)!r})")
    built = {m.get("lakemount") for m in metas if any(s.startswith("lakemount") for s in m["systems"])}
    if len(built) > 1 and not mixed_builds:
        sys.exit(f"--report: the runs measured different lakemount builds: {sorted(built)}")
    meta = dict(metas[0])
    meta["parts"] = metas
    meta["systems"] = list(dict.fromkeys(s for m in metas for s in m["systems"]))
    meta["variants"] = list(dict.fromkeys(v for m in metas for v in m["variants"]))
    meta["started"] = min(m["started"] for m in metas)
    meta["finished"] = max(m["finished"] for m in metas)
    meta["notes"] = [n for m in metas for n in m.get("notes", [])]
    results = {}
    for r in raws:
        for k, runs in r["results"].items():
            results.setdefault(k, []).extend(runs)
    return meta, results


def write(a, meta, results):
    L = []
    garage = server_kind(meta) == "garage"
    started = datetime.datetime.fromisoformat(meta["started"])
    finished = datetime.datetime.fromisoformat(meta["finished"])
    mi = h.machine_info()
    n = meta["files"]
    for part in meta.get("parts", [meta]):
        p_start = datetime.datetime.fromisoformat(part["started"])
        p_end = datetime.datetime.fromisoformat(part["finished"])
        L.append(f"Run {p_start:%Y-%m-%d %H:%M}-{p_end:%H:%M} UTC with `bench/run.sh torch {' '.join(part['argv'])}`"
                 f" ({part['runs']} run{'s' if part['runs'] != 1 else ''} per cell, each cell the median"
                 + (f"; systems {', '.join(part['systems'])}" if "parts" in meta else "")
                 + f"); load average {part['load_before']:.1f} before, {part['load_after']:.1f} after "
                 f"({mi['cores']} shared cores, {mi['cpu']}, {mi['memory_gib']} GiB, kernel {mi['kernel']}). "
                 f"lakemount: {part.get('lakemount', '?')}.")
    L.append(f"mount-s3: {meta.get('versions', {}).get('mount-s3', '?')}.")
    L.append("")
    L.append(f"Data: {n:,} files of 4-12 KiB ({meta['bytes'] / h.MIB:.0f} MiB) in {n // PER_DIR} directories of "
             f"{PER_DIR} (`{meta['prefix_files']}`), and the same samples in {meta['shards']} tar shards "
             f"(`{meta['prefix_tar']}`). {server_text(meta)} Loader: torch "
             f"{meta.get('torch', '?')} `DataLoader`, `num_workers=4`, `batch_size=64`; `files`: map-style Dataset "
             "(ImageFolder-style index: scandir of the root and of each directory, then `shuffle=True`), each item "
             "`open(path, 'rb').read()`; `tar`: an IterableDataset whose 4 workers split the shards (shard order "
             "reshuffled each epoch) and stream them with `tarfile` (`r|`). Every sample's size and CRC32 checked "
             "against the manifest in both epochs.")
    L.append("")
    L.append("Per run and system: fresh mount, empty cache directory; the index; epoch 1; epoch 2; unmount. "
             f"Before each epoch the page cache is dropped: local disk `echo {meta.get('drop_local', 3)} > "
             "/proc/sys/vm/drop_caches`"
             + (" (the same as the mounts: `echo 3` there also dropped what the S3 server keeps of its own files, "
                "Garage's block files, and slowed the system measured next by 0.5-1 s), "
                if meta.get("drop_local", 3) == 1 else ", ")
             + ("mounts `echo 1` (the page cache only: the kernel keeps the dentries and inodes the index built, as "
                "in a training job that lists and then reads; `echo 3` makes it FORGET them, and mount-s3 then looks "
                "every file up in S3 again, bench/README.md), " if meta.get("drop_mounts", 1) == 1 else
                "mounts too `echo 3` (`--drop-mounts 3`: the kernel FORGETs every inode of the mount, so each file "
                "is looked up again), ")
             + "so epoch 2 reads what the mount kept (on its disk or in its memory) or S3 again, not the kernel's "
             "page cache. Times are of the "
             "epochs only (the index is shown apart). e1 / raw: epoch-1 time over the raw limit's time for the same "
             "bytes (files: the fastest bare client, rawget at each setting or curl, i.e. the server's parallel limit; "
             "1.0 = as fast as a bare client); e2 / local: epoch-2 time "
             "over local disk's epoch-2 time. Requests: counted by the server during the epoch, GET / LIST / HEAD"
             + (" (Garage: `api_s3_request_counter` of its /metrics, which counts a request when its handler has "
                "answered, i.e. the response headers are ready, not when it arrives as the in-memory server does: a "
                "request the client abandons before its answer is not counted at all, and one still open when an "
                "epoch ends counts in the epoch in which it is answered; under \"Every run\", the bytes Garage read "
                "from its block files, in whole 256 KiB blocks)" if garage else "")
             + ". CPU: the mount daemon's utime+stime (/proc/PID/stat) per 1,000 files, epoch 1 / epoch 2.")
    L.append("")
    for variant in meta["variants"]:
        L.append(f"### {variant}: {'20,000-file' if n == 20_000 else f'{n:,}-file'} "
                 f"{'directory tree' if variant == 'files' else 'tar shards'}")
        L.append("")
        raw = [r["raw"] for r in results.get(f"raw-get|{variant}", []) if "raw" in r]
        # The limit: the fastest raw-get setting (most GETs in flight the
        # server still answers faster), median over runs.
        keys = sorted({k for r in raw for k in r}) if variant == "files" else ["seq-16"]
        by_key = {k: med([r.get(k, {}).get("secs") for r in raw]) for k in keys}
        by_key = {k: v for k, v in by_key.items() if v}
        raw_key = min(by_key, key=by_key.get) if by_key else None
        raw_secs = by_key.get(raw_key) if raw_key else None
        local = [r for r in results.get(f"local-disk|{variant}", []) if "error" not in r]
        local_e2 = med([r["epoch2"]["secs"] for r in local])
        L.append("| system | epoch 1 s | epoch 2 s | e1 / raw | e2 / local | requests e1 (GET / LIST / HEAD) "
                 "| requests e2 | daemon CPU s / 1k files (e1 / e2) | index s | peak RSS MiB |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for s in meta["systems"]:
            runs = results.get(f"{s}|{variant}", [])
            ok = [r for r in runs if "error" not in r]
            errs = [r["error"] for r in runs if "error" in r]
            if s == "raw-get":
                for k in sorted({k for r in raw for k in r}, key=lambda k: (len(k), k)):
                    secs = med([r[k]["secs"] for r in raw if k in r])
                    what = (f"rawget small, {k.split('-')[1]} GETs in flight" if k.startswith("small")
                            else f"curl --parallel, {k.split('-')[1]} GETs in flight" if k.startswith("curl")
                            else "rawget seq, 8 MiB ranges, 16 in flight")
                    rate = (f"{n / secs:,.0f} objects/s" if k.startswith(("small", "curl"))
                            else f"{med([r[k]['mib_per_s'] for r in raw if k in r]):,.0f} MiB/s")
                    L.append(f"| raw-get ({what}) | {secs:.2f} ({rate}) | - | {secs / raw_secs:.2f} | - "
                             f"| {fmt_reqs(med_reqs([r for r in raw if k in r], k))} | - | - | - | - |")
                if not raw:
                    L.append(f"| raw-get | failed | | | | | | | | |  <!-- {'; '.join(errs)} -->")
                continue
            if not ok:
                why = "; ".join(errs)[:300] or "not run"
                L.append(f"| {s} | failed | | | | | | | | |")
                L.append(f"|  | ({why}) | | | | | | | | |")
                continue
            e1 = med([r["epoch1"]["secs"] for r in ok])
            e2 = med([r["epoch2"]["secs"] for r in ok])
            r1 = f"{e1 / raw_secs:.2f}" if raw_secs else "n/a"
            r2 = f"{e2 / local_e2:.2f}" if local_e2 else "n/a"
            if s == "local-disk":
                cpu = "-"
                rss = "-"
            else:
                c1 = med([r["epoch1"].get("daemon_cpu_s") for r in ok])
                c2 = med([r["epoch2"].get("daemon_cpu_s") for r in ok])
                cpu = f"{c1 * 1000 / n:.2f} / {c2 * 1000 / n:.2f}" if c1 is not None else "?"
                rss = f"{max((r.get('rss_mib') or 0) for r in ok):.0f}"
            idx = med([r["index"]["secs"] for r in ok])
            fail = f" ({len(errs)} of {len(runs)} runs failed)" if errs else ""
            L.append(f"| {s}{fail} | {e1:.2f} | {e2:.2f} | {r1} | {r2} | {fmt_reqs(med_reqs(ok, 'epoch1'))} "
                     f"| {fmt_reqs(med_reqs(ok, 'epoch2'))} | {cpu} | {idx:.2f} | {rss} |")
        L.append("")
    L.append("Every run (epoch 1 / epoch 2 seconds; raw-get seconds):")
    L.append("")
    for variant in meta["variants"]:
        for s in meta["systems"]:
            for i, r in enumerate(results.get(f"{s}|{variant}", [])):
                if "error" in r:
                    L.append(f"- {variant} {s} run {i + 1}: FAILED: {r['error'][:300]}")
                elif "raw" in r:
                    L.append(f"- {variant} raw-get run {i + 1}: " + ", ".join(
                        f"{k} {v['secs']:.2f} s"
                        + (f" ({v['requests'].get(h.BYTES_READ, 0) / h.MIB:.1f} MiB of blocks read)" if garage else "")
                        for k, v in r["raw"].items()))
                else:
                    extra = ""
                    if r.get("mount_requests"):
                        extra += f"; at mount {fmt_reqs(r['mount_requests'])}"
                    if r.get("index", {}).get("requests"):
                        extra += f"; index {fmt_reqs(r['index']['requests'])}"
                    if "cache_bytes" in r:
                        extra += f"; cache {r['cache_bytes'] / h.MIB:.0f} MiB"
                    if garage and s != "local-disk":
                        extra += "; Garage read " + " / ".join(
                            f"{r[e]['requests'].get(h.BYTES_READ, 0) / h.MIB:.1f}" for e in ("epoch1", "epoch2")) \
                            + " MiB of blocks in e1 / e2"
                    L.append(f"- {variant} {s} run {i + 1}: {r['epoch1']['secs']:.2f} / {r['epoch2']['secs']:.2f} s"
                             f"{extra}")
    L.append("")
    L.append("Commands:")
    L.append("")
    L.append("```sh")
    for part in meta.get("parts", [meta]):
        L.append(f"bench/run.sh torch {' '.join(part['argv'])}".rstrip())
    L.append(f"bench/torch/setup.sh   # the venv: $BENCH_DIR/torch-venv (pip install torch numpy)")
    pb = meta.get("port_base", 39800)  # runs before it was recorded: the default
    if garage:
        if meta.get("nodelay"):
            L.append(f"cc -shared -fPIC -O2 -o $BENCH_DIR/nodelay.so bench/nodelay/nodelay.c -ldl   # by bench/run.sh")
        L.append(f"{'LD_PRELOAD=' + meta['nodelay'] + ' ' if meta.get('nodelay') else ''}garage -c "
                 f"$BENCH_DIR/garage/garage.toml server   # config written by bench/harness.py (Garage.write_config: "
                 f"S3 on 127.0.0.1:{pb}, /metrics on :{pb + 3}); Garage.start then assigns the layout, creates the "
                 f"key bench-key and the bucket {BUCKET}")
        when = "once per Garage data dir"
    else:
        L.append(f"target/release/lakemount-testserver --port {pb + 10} --stats-port {pb + 13} --bucket lakebench-full "
                 f"--bucket lakebench-quick --ttfb-ms {meta['ttfb_ms']:g}")
        when = "at every start of the in-memory server"
    for sub, prefix in (("files", meta["prefix_files"]), ("shards", meta["prefix_tar"])):
        L.append(f"bench/rawget/target/release/rawget put --bucket {BUCKET} --dir $BENCH_DIR/data/torch-{n}/{sub} "
                 f"--prefix {prefix} --concurrency 32   # the upload, {when} (AWS_* and AWS_ENDPOINT_URL of the "
                 "server in the environment, as for every rawget)")
    shown = set()
    for variant in meta["variants"]:
        for s in meta["systems"]:
            for r in results.get(f"{s}|{variant}", []):
                if s == "raw-get":
                    for v in r.get("raw", {}).values():
                        if v["cmd"] not in shown:
                            shown.add(v["cmd"])
                            L.append(v["cmd"])
                elif "cmd" in r and r["cmd"] not in shown:
                    shown.add(r["cmd"])
                    L.append(f"{r['cmd'].replace(meta.get('bench_dir', a.bench_dir), '$BENCH_DIR')}   # {s}")
    for variant in meta["variants"]:
        root = "ROOT/" + (meta["prefix_files"] if variant == "files" else meta["prefix_tar"]).rstrip("/")
        L.append(f"$BENCH_DIR/torch-venv/bin/python bench/torch_loader.py {variant} --root {root} "
                 f"--manifest $BENCH_DIR/data/torch-{n}/manifest.json --epochs 2   # `go` on stdin before each epoch")
    L.append("```")
    if meta.get("notes"):
        L.append("")
        L.append("Notes:")
        L.append("")
        L += [f"- {n}" for n in meta["notes"]]
    title = "PyTorch DataLoader over small files"
    if garage:
        title += f" on Garage, TCP_NODELAY shim {'on' if meta.get('nodelay') else 'off'}"
    h.save_section(a.results, section_name(meta), f"{title}, {started:%Y-%m-%d}", L)


# ------------------------------------------------------------------ main


def main():
    p = argparse.ArgumentParser(description="PyTorch DataLoader suite (use bench/run.sh torch)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated subset of {','.join(SYSTEMS + OPTIONAL)} (raw-get is always run)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--files", type=int, default=20_000, help=f"files in the data set (a multiple of {PER_DIR})")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--server", choices=["memory", "garage"], default="memory",
                   help="S3 server: the in-memory one of testserver/ with --ttfb-ms (default) or the single-node "
                        "Garage of bench/harness.py (data in $BENCH_DIR/garage, uploaded once)")
    p.add_argument("--ttfb-ms", type=float, default=None,
                   help="emulated time to first byte of every GET/HEAD/LIST, ms (in-memory server only; default 20)")
    p.add_argument("--nodelay", metavar="PATH|none", default=None,
                   help="Garage only: the LD_PRELOAD shim that sets TCP_NODELAY (bench/nodelay/nodelay.c; default "
                        "$BENCH_DIR/nodelay.so when it exists, as bench/run.sh builds it); `none`: Garage without it, "
                        "each small GET then stalls ~40 ms on the client's Delayed ACK")
    p.add_argument("--garage", default=os.environ.get("GARAGE_BIN") or shutil.which("garage")
                   or os.path.expanduser("~/.cargo/bin/garage"), help="the garage binary (--server garage)")
    p.add_argument("--raw-concurrency", default="32,64", help="GETs in flight of the raw limit (files)")
    p.add_argument("--drop-mounts", type=int, choices=[1, 3], default=1,
                   help="before each epoch of a mount: echo N > /proc/sys/vm/drop_caches (default 1: the page cache "
                        "only; 3 also drops the kernel's dentries and inodes, which makes the kernel FORGET every "
                        "inode the index built, bench/README.md). Local disk gets the same drop: with 1 it leaves the S3 "
                        "server's own file metadata cached for the system measured after it")
    p.add_argument("--lakemount", default=os.path.join(h.REPO, "target", "release", "lakemount"),
                   help="the lakemount binary (default: target/release/lakemount of this checkout); the run uses a "
                        "copy taken at its start ($BENCH_DIR/bin/lakemount-torch)")
    p.add_argument("--epoch-timeout", type=float, default=1800, help="seconds an epoch may take before it fails")
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(h.REPO), "bench-data"))
    p.add_argument("--lakemount-config", help="a lakemount config file for the lakemount systems that have none "
                   "of their own (lakemount, lakemount-nocache), to try a setting; shown in the commands")
    p.add_argument("--python", help="the venv's python (default $BENCH_DIR/torch-venv/bin/python)")
    p.add_argument("--memserver", default=os.path.join(h.REPO, "target", "release", "lakemount-testserver"))
    p.add_argument("--rawget", default=os.path.join(HERE, "rawget", "target", "release", "rawget"))
    p.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "39800")))
    p.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--report", metavar="RAW_JSON", action="append",
                   help="only rewrite RESULTS.md from an earlier run's raw JSON; repeated: one table of several "
                        "runs of the same server and data set (e.g. the slow systems with fewer --runs)")
    p.add_argument("--mixed-builds", action="store_true",
                   help="with several --report: pool runs of different lakemount builds anyway (each run's build "
                        "is named in the section's header); only for builds that differ in code the suite does "
                        "not run")
    p.add_argument("--note", action="append", default=[],
                   help="a note printed under the table (repeatable; with --report: added to the run's notes)")
    a = p.parse_args()
    a.bench_dir = os.path.abspath(a.bench_dir)
    if a.report:
        raws = []
        for path in a.report:
            with open(path) as f:
                raws.append(json.load(f))
        meta, results = merge_raw(raws, a.mixed_builds) if len(raws) > 1 else (raws[0]["meta"], raws[0]["results"])
        meta["notes"] = meta.get("notes", []) + a.note
        write(a, meta, results)
        log(f"wrote {a.results} from {', '.join(a.report)}")
        return 0
    if a.server == "memory":
        if a.nodelay is not None:
            p.error("--nodelay is for --server garage (the in-memory server sets TCP_NODELAY itself)")
        a.ttfb_ms = 20.0 if a.ttfb_ms is None else a.ttfb_ms
        if a.ttfb_ms < 0:
            p.error("--ttfb-ms must be >= 0")
        preload = None
    else:
        if a.ttfb_ms is not None:
            p.error("--ttfb-ms needs the in-memory server (--server memory); Garage has no emulated latency")
        if not os.access(a.garage, os.X_OK):
            p.error(f"no garage binary at {a.garage} (--garage, or GARAGE_BIN)")
        if a.nodelay == "none":
            preload = None
        elif a.nodelay:
            preload = os.path.abspath(a.nodelay)
            if not os.path.exists(preload):
                p.error(f"--nodelay {a.nodelay}: no such file (`none`: Garage without the shim)")
        else:
            preload = os.path.join(a.bench_dir, "nodelay.so")
            if not os.path.exists(preload):
                log(f"WARNING: no {preload}: Garage runs without the TCP_NODELAY shim, small GETs will stall ~40 ms "
                    "each (bench/run.sh builds it from bench/nodelay/nodelay.c); the run is recorded as such")
                preload = None
    a.raw_concurrency = [int(c) for c in a.raw_concurrency.split(",") if c]
    a.python = a.python or os.path.join(a.bench_dir, "torch-venv", "bin", "python")
    if not os.access(a.python, os.X_OK):
        sys.exit(f"no {a.python}: run bench/torch/setup.sh first (pip install torch numpy into $BENCH_DIR/torch-venv)")
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS + OPTIONAL:
            p.error(f"unknown system {s!r}; systems: {', '.join(SYSTEMS + OPTIONAL)}")
    if "raw-get" not in systems:
        systems.insert(0, "raw-get")
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; variants: {', '.join(VARIANTS)}")
    for d in ("logs", "mnt", "results"):
        os.makedirs(os.path.join(a.bench_dir, d), exist_ok=True)
    torch_version = h.run([a.python, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    lakemount_built = lakemount_version(a.lakemount)  # before the run: the checkout may change while it runs
    # Every lakemount mount of the run uses a copy taken now: a rebuild of the checkout's
    # target/release/lakemount during the run (cargo replaces the file) would otherwise put
    # two different builds into one table.
    snap = os.path.join(a.bench_dir, "bin", "lakemount-torch")
    os.makedirs(os.path.dirname(snap), exist_ok=True)
    shutil.copy2(a.lakemount, snap + ".tmp")
    os.replace(snap + ".tmp", snap)
    a.lakemount_shown, a.lakemount = a.lakemount, snap

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    g = h.make_server(a, preload)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = h.loadavg()
    results = {}
    try:
        g.start()
        if a.server == "garage":
            # The shim is what this run is labelled with: check Garage has it, or not.
            with open(f"/proc/{g.proc.pid}/maps") as f:
                maps = f.read()
            if preload and os.path.realpath(preload) not in maps:
                raise RuntimeError(f"Garage (pid {g.proc.pid}) did not load {preload}")
            if not preload and "nodelay" in maps:
                raise RuntimeError(f"Garage (pid {g.proc.pid}) has a nodelay shim loaded (LD_PRELOAD in the "
                                   "environment?) although the run is without one")
        d = make_data(a, g)
        pf, pt = prefixes(a.files)
        for i in range(a.runs):
            for variant in variants:
                for s in systems:
                    t = time.monotonic()
                    try:
                        r = measure(s, variant, a, g, d)
                        results.setdefault(f"{s}|{variant}", []).append(r)
                        if "raw" in r:
                            txt = ", ".join(f"{k} {v['secs']:.2f} s ({fmt_reqs(v['requests'])})"
                                            for k, v in r["raw"].items())
                        else:
                            txt = (f"index {r['index']['secs']:.2f} s, epoch 1 {r['epoch1']['secs']:.2f} s "
                                   f"({fmt_reqs(r['epoch1']['requests'])}), epoch 2 {r['epoch2']['secs']:.2f} s "
                                   f"({fmt_reqs(r['epoch2']['requests'])})")
                            if "daemon_cpu_s" in r["epoch1"]:
                                txt += (f", daemon CPU {r['epoch1']['daemon_cpu_s']:.1f}/"
                                        f"{r['epoch2']['daemon_cpu_s']:.1f} s")
                        log(f"torch run {i + 1}/{a.runs} {variant:5} {s:17} {txt} "
                            f"({time.monotonic() - t:.0f} s, load {h.loadavg():.1f})")
                    except Exception as e:  # noqa: BLE001 - recorded in the table
                        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                        results.setdefault(f"{s}|{variant}", []).append({"error": msg})
                        log(f"torch run {i + 1}/{a.runs} {variant} {s} FAILED: {msg}")
        finished = datetime.datetime.now(datetime.timezone.utc)
        meta = {"started": started.isoformat(), "finished": finished.isoformat(), "runs": a.runs,
                "systems": systems, "variants": variants, "files": a.files, "shards": a.shards,
                "ttfb_ms": a.ttfb_ms if a.server == "memory" else None, "server_kind": a.server,
                "nodelay": (("$BENCH_DIR" + preload[len(a.bench_dir):] if preload.startswith(a.bench_dir + os.sep)
                             else preload) if preload else None),
                "port_base": a.port_base, "uploaded": d["uploaded"],
                "drop_mounts": a.drop_mounts, "drop_local": a.drop_mounts, "lakemount": lakemount_built,
                "bytes": d["bytes"], "prefix_files": pf, "prefix_tar": pt, "notes": a.note, "bench_dir": a.bench_dir,
                "server": g.version(), "torch": torch_version, "argv": sys.argv[1:],
                "load_before": load_before, "load_after": h.loadavg(),
                "versions": {"mount-s3": h.mount_s3_version()}}
        raw = os.path.join(a.bench_dir, "results", f"{started:%Y%m%dT%H%M%S}-torch.json")
        with open(raw, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        write(a, meta, results)
        log(f"wrote {a.results} (raw runs: {raw}) in {(finished - started).total_seconds() / 60:.1f} min")
    finally:
        for s in systems:
            mp_ = os.path.join(a.bench_dir, "mnt", f"torch-{s}")
            if os.path.ismount(mp_):
                h.run(["umount", "-l", mp_], check=False)
            shutil.rmtree(os.path.join(a.bench_dir, f"torch-cache-{s}"), ignore_errors=True)
        g.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); cleaned up")
        sys.exit(130)
