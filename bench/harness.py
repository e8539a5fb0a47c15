#!/usr/bin/env python3
"""lakemount benchmark harness: driven by bench/run.sh (see bench/README.md).

Starts Garage on loopback, makes and uploads the deterministic data sets,
then for every selected workload runs N rounds; each round measures the raw
limit (rawget: concurrent ranged GETs through aws-sdk-s3), local-disk reads of
the same bytes, and every mount (freshly mounted for each measurement, so
each one starts cold), and finally writes bench/RESULTS.md.

Everything it creates lives under $BENCH_DIR; everything it mounts or starts
is unmounted and stopped on exit, also on failure or Ctrl-C.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MIB = 1048576
GIB = 1 << 30

# ------------------------------------------------------------------ settings

MODES = {
    # The data sets. Caps keep the default set under 30 minutes on 2 cores.
    "full": dict(
        shards=4, shard_size=1 << 30, loader_shards=16, loader_shard_size=256 << 20,
        tree_dirs=100, tree_per=1000, flat=100_000,
        jpeg_dirs=20, jpeg_per=1000,
        runs=3, seq_secs=6, rand_secs=4, loader_secs=6, meta_secs=10, hot_secs=5,
    ),
    # For trying the harness itself: small data, same workloads, N=3.
    "quick": dict(
        shards=4, shard_size=128 << 20, loader_shards=16, loader_shard_size=32 << 20,
        tree_dirs=10, tree_per=200, flat=2000,
        jpeg_dirs=4, jpeg_per=250,
        runs=3, seq_secs=3, rand_secs=2, loader_secs=3, meta_secs=5, hot_secs=2,
    ),
}

SHARD_KEYS = [f"shards/shard-{i:04}.tar" for i in range(4)]
# loader-tar's data set: 16 smaller shards (loader_shards x loader_shard_size of
# MODES, the same count in both modes) read by 8 worker processes, as a PyTorch
# DataLoader with num_workers=8 gets a WebDataset's shards: round-robin, each
# worker streams its shards one after another.
LOADER_KEYS = [f"loader/shard-{i:04}.tar" for i in range(MODES["full"]["loader_shards"])]
LOADER_WORKERS = 8

# workload -> (suite, kind, unit)
WORKLOADS = {
    "seq-1j-256k": ("seq", "fio", "MiB/s"),
    "seq-1j-1m": ("seq", "fio", "MiB/s"),
    "seq-4j-256k": ("seq", "fio", "MiB/s"),
    "seq-4j-1m": ("seq", "fio", "MiB/s"),
    "rand-4k": ("rand", "fio", "MiB/s"),
    "rand-256k": ("rand", "fio", "MiB/s"),
    "loader-tar": ("loader", "py", "MiB/s"),
    "loader-small": ("loader", "py", "files/s"),
    "handles-200": ("loader", "py", "MiB/s"),
    "fork-shared": ("loader", "py", "MiB/s"),
    "fork-own": ("loader", "py", "MiB/s"),
    "meta-tree": ("meta", "py", "entries/s"),
    "meta-flat": ("meta", "py", "entries/s"),
    "find-tree": ("meta", "py", "entries/s"),
    "find-flat": ("meta", "py", "entries/s"),
    "lsr-tree": ("meta", "py", "entries/s"),
    "lsr-flat": ("meta", "py", "entries/s"),
    "stat-hot": ("meta", "py", "stat/s"),
}
# Metadata walks: workload -> sub-tree walked (per-walk request counts and bound).
WALKS = {"meta-tree": "tree", "meta-flat": "flat", "find-tree": "tree", "find-flat": "flat",
         "lsr-tree": "tree", "lsr-flat": "flat"}
# Workloads with no S3 limit to compare with (everything is cached).
NO_LIMIT = {"stat-hot"}
# stat-hot: files made hot first, and stat() threads.
HOT_FILES = 10_000
HOT_THREADS = 8
WORKLOAD_TEXT = {
    "seq-1j-256k": "fio: 1 reader, sequential, bs 256 KiB, 1 shard",
    "seq-1j-1m": "fio: 1 reader, sequential, bs 1 MiB, 1 shard",
    "seq-4j-256k": "fio: 4 readers, sequential, bs 256 KiB, 1 shard each",
    "seq-4j-1m": "fio: 4 readers, sequential, bs 1 MiB, 1 shard each",
    "rand-4k": "fio: 4 readers, random 4 KiB, 1 shard each",
    "rand-256k": "fio: 4 readers, random 256 KiB, 1 shard each",
    "loader-tar": "Python: 8 worker processes, tarfile stream of 16 shards of loader/ (2 each, one after the other)",
    "loader-small": "Python: 8 worker processes open+read JPEG-sized files",
    "handles-200": "Python: 200 open files (threads) over the 4 shards at spread offsets, 1 MiB reads",
    "fork-shared": "Python: 4 forked workers, one descriptor opened before the fork, each preads its own quarter "
                   "of 1 shard once, 1 MiB reads",
    "fork-own": "Python: as fork-shared, but each worker opens the shard itself",
    "meta-tree": "Python: os.walk + os.stat, 100 dirs x 1000 files",
    "meta-flat": "Python: os.walk + os.stat, 1 dir of 100,000 files",
    "find-tree": "find MOUNT/tree -type f | wc -l",
    "find-flat": "find MOUNT/flat -type f | wc -l",
    "lsr-tree": "ls -lR MOUNT/tree",
    "lsr-flat": "ls -lR MOUNT/flat",
    "stat-hot": "Python: 8 threads stat() 10,000 cached files of tree/ round and round",
}
SUITES = ["seq", "rand", "loader", "meta"]

# Columns of the table, in order. "raw-get" is the limit every ratio refers to.
SYSTEMS = ["raw-get", "local-disk", "lakemount", "rclone-off", "rclone-full", "s3fs", "mount-s3"]
MOUNTS = ["lakemount", "rclone-off", "rclone-full", "s3fs", "mount-s3"]

# Pseudo-operation in the request counts: bytes Garage read from its block files
# (whole 256 KiB blocks, so an upper bound of the bytes served).
BYTES_READ = "bytes_read"

# rawget concurrency for the limit: enough parallel GETs that the server, not
# the client, sets the pace (see bench/README.md).
RAW_SEQ_CONCURRENCY = 16


def log(*a):
    print(f"[bench {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def run(cmd, check=True, env=None, capture=True, timeout=None, cwd=None):
    r = subprocess.run(
        cmd, env=env, cwd=cwd, timeout=timeout, text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}: {(r.stderr or '').strip()[-2000:]}")
    return r


def run_group(cmd, env=None, timeout=None):
    """Runs a workload in its own process group; on timeout, error or interrupt the
    whole group (fio's job processes, the loader's workers) is killed, so nothing
    keeps a mount busy."""
    p = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def last_json(text):
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON in output: {text[-500:]!r}")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def reserve_ports(lo, hi):
    """Keeps loopback ports lo..hi (inclusive) out of the kernel's ephemeral
    range (`net.ipv4.ip_local_reserved_ports`, added to what is there): a
    client connection of an earlier measurement (tens of thousands per run)
    may otherwise hold a server's port as its own local port, and the server
    fails to bind it ("Address already in use"). Best effort: needs root."""
    path = "/proc/sys/net/ipv4/ip_local_reserved_ports"
    try:
        with open(path) as f:
            have = f.read().strip()
        want = f"{lo}-{hi}"
        if want not in have.split(","):
            with open(path, "w") as f:
                f.write(f"{have},{want}" if have else want)
    except OSError as e:
        log(f"cannot reserve ports {lo}-{hi} ({e}); a server may find its port taken")


def wait_listening(port, proc, what, logpath, secs=30):
    """Waits until 127.0.0.1:port accepts a TCP connection; RuntimeError when
    `proc` exits or `secs` pass (a server whose listener failed to bind)."""
    import socket
    for _ in range(int(secs * 10)):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}; see {logpath}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} does not accept connections on port {port}; see {logpath}")


# ------------------------------------------------------------------ Garage


class Garage:
    """A single-node Garage on loopback, data under BENCH_DIR/garage."""

    def __init__(self, bench_dir, binary, port_base, preload=None):
        self.dir = os.path.join(bench_dir, "garage")
        self.preload = preload  # bench/nodelay shim (TCP_NODELAY), see nodelay/nodelay.c
        self.binary = binary
        self.s3_port, self.rpc_port, self.admin_port = port_base, port_base + 1, port_base + 3
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.region = "garage"
        self.cfg = os.path.join(self.dir, "garage.toml")
        self.proc = None
        self.key_id = self.secret = None

    def cli(self, *args, check=True):
        return run([self.binary, "-c", self.cfg, *args], check=check)

    def write_config(self):
        os.makedirs(self.dir, exist_ok=True)
        secret_file = os.path.join(self.dir, "rpc_secret")
        if not os.path.exists(secret_file):
            with open(secret_file, "w") as f:
                f.write(secrets.token_hex(32))
        with open(secret_file) as f:
            rpc_secret = f.read().strip()
        with open(self.cfg, "w") as f:
            f.write(f"""# Written by bench/harness.py: single-node Garage for the benchmark.
metadata_dir = "{self.dir}/meta"
data_dir = "{self.dir}/data"
db_engine = "lmdb"
replication_factor = 1
# Store blocks as sent: no zstd on the GET path.
compression_level = "none"
# Garage reads and BLAKE2-checks a whole block for any range inside it: 256 KiB
# blocks (default 1 MiB) make a small random GET 2.5x cheaper, sequential the same.
block_size = "256K"
# No background scrub competing with the measurements.
disable_scrub = true
rpc_bind_addr = "127.0.0.1:{self.rpc_port}"
rpc_public_addr = "127.0.0.1:{self.rpc_port}"
rpc_secret = "{rpc_secret}"

[s3_api]
s3_region = "{self.region}"
api_bind_addr = "127.0.0.1:{self.s3_port}"
root_domain = ".s3.garage.localhost"

[admin]
# /metrics is open without a token on loopback (per-operation request counters).
api_bind_addr = "127.0.0.1:{self.admin_port}"
""")
        os.chmod(self.cfg, 0o600)

    def start(self):
        self.write_config()
        reserve_ports(self.s3_port, self.admin_port)
        pidfile = os.path.join(self.dir, "garage.pid")
        # A Garage of an earlier, killed run of this harness: stop it by its pid.
        if os.path.exists(pidfile):
            with open(pidfile) as f:
                old = int(f.read().strip() or 0)
            try:
                with open(f"/proc/{old}/cmdline", "rb") as f:
                    if self.cfg.encode() in f.read():
                        log(f"stopping stale Garage pid {old}")
                        os.kill(old, signal.SIGTERM)
                        for _ in range(100):
                            if not os.path.exists(f"/proc/{old}"):
                                break
                            time.sleep(0.1)
            except (FileNotFoundError, ProcessLookupError):
                pass
        logf = open(os.path.join(self.dir, "garage.log"), "a")
        env = dict(os.environ, RUST_LOG="garage=warn")
        if self.preload:
            env["LD_PRELOAD"] = self.preload
        self.proc = subprocess.Popen(
            [self.binary, "-c", self.cfg, "server"], stdout=logf, stderr=logf, env=env,
            start_new_session=True,
        )
        with open(pidfile, "w") as f:
            f.write(str(self.proc.pid))
        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"garage server exited {self.proc.returncode}; see {self.dir}/garage.log")
            if self.cli("status", check=False).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("garage server did not answer `garage status` in 60 s")
        wait_listening(self.s3_port, self.proc, "garage's S3 API", os.path.join(self.dir, "garage.log"))
        self._layout()
        self._key()
        log(f"Garage up at {self.endpoint} (pid {self.proc.pid})")

    def _layout(self):
        show = self.cli("layout", "show").stdout
        m = re.search(r"Current cluster layout version:\s*(\d+)", show)
        if m and int(m.group(1)) > 0:
            return
        status = self.cli("status").stdout
        ids = re.findall(r"^([0-9a-f]{16})\s", status, re.M)
        if not ids:
            raise RuntimeError(f"no node id in `garage status`:\n{status}")
        self.cli("layout", "assign", "-z", "dc1", "-c", "100G", ids[0])
        self.cli("layout", "apply", "--version", "1")
        for _ in range(100):
            if self.cli("status").returncode == 0 and "NO ROLE" not in self.cli("status").stdout:
                break
            time.sleep(0.1)

    def _key(self):
        keyfile = os.path.join(self.dir, "key.json")
        if os.path.exists(keyfile):
            with open(keyfile) as f:
                k = json.load(f)
        else:
            out = self.cli("key", "create", "bench-key").stdout
            kid = re.search(r"Key ID:\s*(\S+)", out)
            sec = re.search(r"Secret key:\s*(\S+)", out)
            if not (kid and sec):
                raise RuntimeError(f"cannot parse `garage key create` output:\n{out}")
            k = {"id": kid.group(1), "secret": sec.group(1)}
            with open(keyfile, "w") as f:
                json.dump(k, f)
            os.chmod(keyfile, 0o600)
        self.key_id, self.secret = k["id"], k["secret"]

    def bucket(self, name):
        if self.cli("bucket", "info", name, check=False).returncode != 0:
            self.cli("bucket", "create", name)
        self.cli("bucket", "allow", "--read", "--write", "--owner", name, "--key", "bench-key")

    def counters(self):
        """S3 requests served so far, by API endpoint (Garage's own /metrics)."""
        url = f"http://127.0.0.1:{self.admin_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("block_bytes_read"):
                out[BYTES_READ] = out.get(BYTES_READ, 0) + int(float(line.split()[-1]))
                continue
            if not line.startswith("api_s3_request_counter"):
                continue
            m = re.search(r'api_endpoint="([^"]+)".*\}\s+([0-9.e+]+)$', line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0) + int(float(m.group(2)))
        return out

    def version(self):
        r = run([self.binary, "--version"], check=False)
        return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr) else "?"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class MemServer:
    """The s3s-based S3 server of testserver/ (`lakemount-testserver`), data in
    memory, on loopback. A real S3 protocol server (SigV4, XML listings,
    ranged and conditional GETs) that stores each object's ETag at PUT and
    serves GETs from memory: the fastest server this machine can run, so the
    raw-GET limit is the client's, not the server's. The data set is uploaded
    at every start (nothing persists). Same interface as Garage."""

    def __init__(self, bench_dir, binary, port_base, ttfb_ms=0.0, tls=False):
        self.dir = os.path.join(bench_dir, "memserver")
        self.ttfb_ms = ttfb_ms  # emulated time to first byte of every read request (--ttfb-ms)
        self.tls = tls  # HTTPS with a CA of its own (--tls); its PEM file is self.ca once started
        self.ca = None
        self.binary = binary
        self.s3_port, self.stats_port = port_base + 10, port_base + 13
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.s3_port}"
        self.region = "us-east-1"
        self.key_id = self.secret = None
        self.proc = None
        self.buckets = []

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        reserve_ports(self.s3_port, self.stats_port)
        # Nothing survives a restart: the upload markers of the last run go too.
        for f in os.listdir(self.dir):
            if f.startswith("uploaded-"):
                os.remove(os.path.join(self.dir, f))
        args = [self.binary, "--port", str(self.s3_port), "--stats-port", str(self.stats_port)]
        for b in ("lakebench-full", "lakebench-quick"):
            args += ["--bucket", b]
        if self.ttfb_ms:
            args += ["--ttfb-ms", f"{self.ttfb_ms:g}"]
        if self.tls:
            args.append("--tls")
        logf = open(os.path.join(self.dir, "server.log"), "a")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=logf, text=True, start_new_session=True)
        info = {}
        for line in self.proc.stdout:
            k, _, v = line.strip().partition("=")
            info[k] = v
            if k == "region":
                break
        if "access_key" not in info:
            raise RuntimeError(f"lakemount-testserver did not start; see {self.dir}/server.log")
        self.key_id, self.secret, self.region = info["access_key"], info["secret_key"], info["region"]
        self.ca = info.get("ca")
        if self.tls and not self.ca:
            raise RuntimeError(f"lakemount-testserver --tls printed no ca=; see {self.dir}/server.log")
        log(f"in-memory S3 server up at {self.endpoint} (pid {self.proc.pid})")

    def bucket(self, name):
        pass  # created at start

    def counters(self):
        """S3 requests served so far, by operation (the server's own counters)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/", timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            m = re.match(r's3_requests\{op="([^"]+)"\}\s+(\d+)$', line)
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def version(self):
        return "lakemount-testserver (in-memory, s3s 0.14; testserver/ of this repo)"

    # Stopping a server process is the same for both servers.
    stop = Garage.stop


def make_server(a, preload=None):
    """The S3 server of this run, per --server."""
    if a.server == "memory":
        return MemServer(a.bench_dir, a.memserver, a.port_base, getattr(a, "ttfb_ms", 0.0) or 0.0,
                         getattr(a, "tls", False))
    return Garage(a.bench_dir, a.garage, a.port_base, preload)


# ------------------------------------------------------------------ link emulation


class LinkShaper:
    """Limits what the S3 server sends (its source port on `lo`) to `gbit`
    Gbit/s, so the raw-GET limit is a training node's link to S3 rather than
    loopback memory bandwidth (bench/README.md, "Link emulation").

    An HTB root qdisc on `lo` whose default class does not exist (HTB then
    sends unclassified packets straight through, unshaped: all other loopback
    traffic of the machine is untouched), one class at the link rate, and a
    u32 filter sending packets with IP source port = the server's S3 port to
    it. Loopback carries 64 KiB (GSO) packets, so quantum and burst are sized
    for those. Removed by `stop()` (the driver's `finally`) and, as a safety
    net, by run.sh's exit trap, which recognises the qdisc by its handle."""

    HANDLE = "ae5"  # hex qdisc major; run.sh's cleanup trap matches "htb ae5:"

    def __init__(self, port, gbit, dev="lo"):
        self.port, self.gbit, self.dev = port, gbit, dev
        self.active = False
        # Burst: 1 ms of the link, at least 4 loopback packets of 64 KiB. HTB
        # lets a class send `burst` bytes at full speed after idling; small
        # keeps the emulated link honest, too small (< a few GSO packets) costs
        # rate accuracy.
        rate_bytes = gbit * 1e9 / 8
        self.burst = max(4 * 65536, int(rate_bytes / 1000))
        self.quantum = 4 * 65536

    def commands(self):
        h, dev = self.HANDLE, self.dev
        rate = f"{self.gbit * 1000:g}mbit"
        return [
            ["tc", "qdisc", "add", "dev", dev, "root", "handle", f"{h}:", "htb", "default", "0"],
            ["tc", "class", "add", "dev", dev, "parent", f"{h}:", "classid", f"{h}:10", "htb", "rate", rate,
             "ceil", rate, "burst", str(self.burst), "cburst", str(self.burst), "quantum", str(self.quantum)],
            ["tc", "filter", "add", "dev", dev, "parent", f"{h}:", "protocol", "ip", "prio", "1", "u32",
             "match", "ip", "sport", str(self.port), "0xffff", "flowid", f"{h}:10"],
        ]

    def _root(self):
        r = run(["tc", "qdisc", "show", "dev", self.dev], check=False)
        return next((line for line in (r.stdout or "").splitlines() if " root " in line), "")

    def start(self):
        if not shutil.which("tc"):
            raise RuntimeError("--link-gbit needs `tc` (iproute2)")
        root = self._root()
        if f"htb {self.HANDLE}:" in root:
            log(f"removing a stale link-emulation qdisc on {self.dev} (an earlier, killed run)")
            run(["tc", "qdisc", "del", "dev", self.dev, "root"], check=False)
        elif root and not root.startswith("qdisc noqueue"):
            raise RuntimeError(f"{self.dev} already has a root qdisc that this harness did not make: {root!r}; "
                               "not replacing it")
        self.active = True  # from the first command on, stop() cleans up
        for cmd in self.commands():
            run(cmd)
        log(f"link emulation: {self.gbit:g} Gbit/s on {self.dev} for source port {self.port} "
            f"(HTB burst {self.burst} B, quantum {self.quantum} B)")

    def stats(self):
        r = run(["tc", "-s", "class", "show", "dev", self.dev, "classid", f"{self.HANDLE}:10"], check=False)
        return (r.stdout or "").strip()

    def stop(self):
        if self.active and f"htb {self.HANDLE}:" in self._root():
            run(["tc", "qdisc", "del", "dev", self.dev, "root"], check=False)
            log(f"link emulation removed from {self.dev}")
        self.active = False


def link_text(link):
    """The emulated link of a run, for titles and headers ("" when unlimited)."""
    if not link or not (link.get("gbit") or link.get("ttfb_ms")):
        return ""
    parts = []
    if link.get("gbit"):
        parts.append(f"{link['gbit']:g} Gbit/s")
    if link.get("ttfb_ms"):
        parts.append(f"{link['ttfb_ms']:g} ms TTFB")
    return ", ".join(parts)


def s3_env(g):
    env = dict(os.environ)
    # AWS_CA_BUNDLE breaks some clients (rclone) on plain-http loopback; over HTTPS
    # (--tls) it is the server's own CA, for lakemount and rawget.
    env.pop("AWS_CA_BUNDLE", None)
    if getattr(g, "ca", None):
        env["AWS_CA_BUNDLE"] = g.ca
    env.update(AWS_ACCESS_KEY_ID=g.key_id, AWS_SECRET_ACCESS_KEY=g.secret, AWS_REGION=g.region,
               AWS_ENDPOINT_URL=g.endpoint)
    return env


# ------------------------------------------------------------------ data sets


def data_parts(m, data, rawget):
    """The parts of the data set: (prefix, the MODES keys that shape it, its generator command)."""
    return [
        ("shards", ("shards", "shard_size"),
         [rawget, "gen-shards", "--dir", f"{data}/shards", "--count", str(m["shards"]), "--size", str(m["shard_size"])]),
        # Same generator and member layout as shards/; another seed, so that no
        # loader shard repeats the bytes of the shards/ one of the same name
        # (Garage stores equal blocks once: loader-tar would read blocks that
        # the seq runs had just brought into its page cache).
        ("loader", ("loader_shards", "loader_shard_size"),
         [rawget, "gen-shards", "--dir", f"{data}/loader", "--count", str(m["loader_shards"]),
          "--size", str(m["loader_shard_size"]), "--seed", "2"]),
        ("tree", ("tree_dirs", "tree_per"),
         [rawget, "gen-files", "--dir", f"{data}/tree", "--dirs", str(m["tree_dirs"]), "--per-dir", str(m["tree_per"]),
          "--min", "4096", "--max", "12288", "--ext", "bin"]),
        ("flat", ("flat",),
         [rawget, "gen-files", "--dir", f"{data}/flat", "--dirs", "0", "--per-dir", str(m["flat"]),
          "--min", "4096", "--max", "12288", "--ext", "bin"]),
        ("jpeg", ("jpeg_dirs", "jpeg_per"),
         [rawget, "gen-files", "--dir", f"{data}/jpeg", "--dirs", str(m["jpeg_dirs"]), "--per-dir", str(m["jpeg_per"]),
          "--min", "40000", "--max", "200000", "--ext", "jpg"]),
    ]


def parts_read_by(workloads):
    """The data set parts (sub-directories) the workloads read; None: all of them
    (a workload this table does not know)."""
    need = set()
    for w in workloads:
        if w.startswith(("seq-", "rand-", "fork-")) or w == "handles-200":
            need.add("shards")
        elif w == "loader-tar":
            need.add("loader")
        elif w == "loader-small":
            need.add("jpeg")
        elif w in WALKS:
            need.add(WALKS[w])
        elif w == "stat-hot":
            need.add("tree")
        else:
            return None
    return need


def make_data(a, mode, g, bucket, rawget, only=None):
    """Generates the local copy (deterministic) and uploads it once per Garage data dir.

    Two markers, each the spec of what was completed: `.complete.json` in the
    local copy and `uploaded-BUCKET.json` in the server's dir. Only the parts
    whose spec keys differ from a marker's (or all, without a marker) are
    generated or uploaded again: a data dir of an earlier harness gets just
    the parts added since (loader/), not 4 GiB of shards rewritten.

    `only` (a set of part names): upload just those (for the in-memory server,
    which holds every byte in RAM: the whole 12 GiB data set beside the page
    cache on a 24 GiB machine left no free memory, and mounts, which fill the
    page cache, slowed while raw GETs, which do not, kept their pace)."""
    m = MODES[mode]
    data = os.path.join(a.bench_dir, "data", mode)
    parts = data_parts(m, data, rawget)
    spec = {k: m[k] for _, keys, _ in parts for k in keys}
    spec["format"] = 1
    spec["garage_block_size"] = "256K"  # re-upload when the server's block size changes

    def stale(have, common):
        return [sub for sub, pk, _ in parts
                if have is None or any(have.get(k) != spec[k] for k in (*pk, *common))]

    done = os.path.join(data, ".complete.json")
    gen_spec = {k: v for k, v in spec.items() if k != "garage_block_size"}
    have = json.load(open(done)) if os.path.exists(done) else None
    todo = stale(have, ("format",))
    if todo:
        log(f"generating the {mode} data set in {data}: {', '.join(todo)}")
        os.makedirs(data, exist_ok=True)
        for sub, _, cmd in parts:
            if sub in todo:
                log(f"  {sub}/ ({cmd[1]}): " + json.dumps(last_json(run(cmd).stdout)))
        with open(done, "w") as f:
            json.dump(gen_spec, f)
    g.bucket(bucket)
    up = os.path.join(g.dir, f"uploaded-{bucket}.json")
    have = json.load(open(up)) if os.path.exists(up) else None
    todo = stale(have, ("format", "garage_block_size"))
    partial = only is not None and any(sub not in only for sub in todo)
    if only is not None:
        todo = [sub for sub in todo if sub in only]
    if todo:
        log(f"uploading the {mode} data set to s3://{bucket}: {', '.join(todo)} (all of it at every start of the "
            "in-memory server; once per Garage data dir)")
        for sub in todo:
            r = run([rawget, "put", "--bucket", bucket, "--dir", f"{data}/{sub}", "--prefix", f"{sub}/",
                     "--concurrency", "32"], env=s3_env(g))
            log(f"  put {sub}/: " + json.dumps(last_json(r.stdout)))
        if not partial:
            with open(up, "w") as f:
                json.dump(spec, f)
    return data


# ------------------------------------------------------------------ systems


class Mount:
    """One mounted file system: the daemon's process, its mount point and log."""

    def __init__(self, name, cmd, env, mnt, logpath, shown):
        self.name, self.cmd, self.env, self.mnt, self.logpath = name, cmd, env, mnt, logpath
        self.shown = shown  # the command as recorded in RESULTS.md (no secrets)
        self.proc = None

    def start(self, timeout=60):
        # A daemon that died (or a killed earlier run) leaves its mount point
        # "not connected": os.path.ismount says no, but it is in the mount table.
        with open("/proc/self/mounts") as f:
            stale = any(line.split()[1] == self.mnt for line in f if len(line.split()) > 1)
        if stale or os.path.ismount(self.mnt):
            run(["umount", "-l", self.mnt], check=False)
        os.makedirs(self.mnt, exist_ok=True)
        logf = open(self.logpath, "a")
        logf.write(f"\n==== {time.strftime('%F %T')} {self.shown}\n")
        logf.flush()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=logf, stderr=logf, start_new_session=True)
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before mounting; see {self.logpath}")
            if os.path.ismount(self.mnt):
                # The daemon may still be answering its first requests; one stat settles it.
                os.stat(self.mnt)
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not mount in {timeout} s; see {self.logpath}")

    def peak_rss_mib(self):
        """VmHWM of the daemon (the largest RSS over its life)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except (FileNotFoundError, TypeError, AttributeError):
            return None
        return None

    def cpu_secs(self):
        """CPU-seconds (user + system, all threads, and children it waited for) of the daemon so far."""
        return proc_cpu_secs(self.proc.pid)

    def stop(self):
        if os.path.ismount(self.mnt):
            for _ in range(20):
                if run(["umount", self.mnt], check=False).returncode == 0:
                    break
                time.sleep(0.25)
            else:
                run(["umount", "-l", self.mnt], check=False)
        if self.proc:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None


MOUNT_S3_MISSING = ("not built: no bench/mountpoint/target/release/mount-s3 (bench/run.sh builds it from the "
                    "Mountpoint for Amazon S3 library crates of crates.io, ~11 minutes once) and no `mount-s3` on PATH")


def proc_cpu_secs(pid):
    """utime + stime + cutime + cstime of a live process, seconds (proc(5), fields 14-17)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) is in parentheses and may hold spaces.
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children_cpu_secs():
    """CPU-seconds of every child this process has waited for (getrusage(2), RUSAGE_CHILDREN)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def mount_s3_binary():
    """The Mountpoint for Amazon S3 binary: $MOUNT_S3_BIN, else bench/mountpoint's build
    (the library crates `mountpoint-s3-fs`/`mountpoint-s3-client` behind a small main.rs of
    ours: Mountpoint's own CLI crate is not on crates.io), else a `mount-s3` on PATH; None when
    there is none."""
    env = os.environ.get("MOUNT_S3_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    built = os.path.join(HERE, "mountpoint", "target", "release", "mount-s3")
    if os.access(built, os.X_OK):
        return built
    return shutil.which("mount-s3")


def mount_s3_version():
    b = mount_s3_binary()
    if not b:
        return "not installed"
    lock = os.path.join(HERE, "mountpoint", "Cargo.lock")
    if b.startswith(os.path.join(HERE, "mountpoint")) and os.path.exists(lock):
        text = open(lock).read()
        vs = [f"{c} {m.group(1)}" for c in ("mountpoint-s3-fs", "mountpoint-s3-client", "mountpoint-s3-crt-sys")
              if (m := re.search(rf'name = "{c}"\nversion = "([^"]+)"', text))]
        return "bench/mountpoint (our main.rs over " + ", ".join(vs) + ")"
    r = run([b, "--version"], check=False)
    return ((r.stdout or "") + (r.stderr or "")).strip().splitlines()[0] if (r.stdout or r.stderr) else "?"


def mount_factory(name, a, g, bucket, write_secrets=True):
    """Returns a function making a fresh Mount of `name`, or None and the reason it is not run."""
    mnt = os.path.join(a.bench_dir, "mnt", name)
    logs = os.path.join(a.bench_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    logpath = os.path.join(logs, f"{name}.log")
    env = s3_env(g)
    env.pop("AWS_ENDPOINT_URL", None)
    if name == "lakemount":
        binary = os.path.join(REPO, "target", "release", "lakemount")
        # Defaults of config/lakemount.toml: what a user gets without tuning.
        cmd = [binary, "mount", f"s3://{bucket}", mnt, "--endpoint-url", g.endpoint, "--region", g.region]
        shown = " ".join(["AWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. target/release/lakemount", *cmd[1:]])
        return (lambda: Mount(name, cmd, env, mnt, logpath, shown)), None
    if name.startswith("rclone"):
        if not shutil.which("rclone"):
            return None, "not installed: `rclone` is not on PATH"
        env.update({
            "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ENDPOINT": g.endpoint,
            "RCLONE_CONFIG_BENCH_REGION": g.region,
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": g.key_id,
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": g.secret,
            "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
            # ListObjectsV2, as the other clients use (rclone's default for "Other" is v1).
            "RCLONE_CONFIG_BENCH_LIST_VERSION": "2",
        })
        common = [
            "--read-only",
            # Chunked ranged GETs: start at 16 MiB, double up to 1 GiB for sequential readers;
            # a small first chunk keeps random reads from pulling 128 MiB (the default).
            "--vfs-read-chunk-size", "16M", "--vfs-read-chunk-size-limit", "1G",
            # Read-ahead buffer per open file (default 16 MiB).
            "--buffer-size", "32M",
            # The data set does not change while the benchmark runs.
            "--dir-cache-time", "1h", "--attr-timeout", "1m", "--poll-interval", "0",
            # LastModified from the listing instead of a HEAD per file; no HEAD before a GET.
            "--use-server-modtime", "--s3-no-head-object", "--no-checksum",
            # Same kernel read-ahead as lakemount's default (1 MiB; rclone's default 128 KiB).
            "--max-read-ahead", "1M",
            "--log-level", "NOTICE",
        ]
        if name == "rclone-off":
            extra = ["--vfs-cache-mode", "off"]
        else:
            cache = os.path.join(a.bench_dir, "rclone-cache")
            extra = ["--vfs-cache-mode", "full", "--cache-dir", cache, "--vfs-cache-max-size", "20G",
                     "--vfs-read-ahead", "128M", "--vfs-fast-fingerprint"]
        if getattr(g, "ca", None):
            # Not AWS_CA_BUNDLE: rclone's SDK then fails ("LoadCustomCABundleError:
            # unsupported transport"); its own flag works.
            env.pop("AWS_CA_BUNDLE", None)
            extra += ["--ca-cert", g.ca]
        cmd = ["rclone", "mount", f"bench:{bucket}", mnt, *common, *extra]
        shown = f"RCLONE_CONFIG_BENCH_*=(s3, Other, endpoint, region {g.region}, path style) " + " ".join(cmd)

        def make():
            if name == "rclone-full":
                # Every measurement starts with an empty cache (epoch 1).
                shutil.rmtree(os.path.join(a.bench_dir, "rclone-cache"), ignore_errors=True)
            return Mount(name, cmd, env, mnt, logpath, shown)
        return make, None
    if name == "s3fs":
        if not shutil.which("s3fs"):
            return None, "not installed: `s3fs` is not on PATH"
        pw = os.path.join(a.bench_dir, "s3fs.passwd")
        if write_secrets:
            with open(pw, "w") as f:
                f.write(f"{g.key_id}:{g.secret}\n")
            os.chmod(pw, 0o600)
        opts = ",".join([
            "ro", f"url={g.endpoint}", "use_path_request_style", f"endpoint={g.region}", "sigv4",
            f"passwd_file={pw}",
            # Parallel ranged GETs of 16 MiB parts for large reads (defaults 5 x 10 MB).
            "parallel_count=8", "multipart_size=16",
            # Parallel HEADs when listing a directory (default 20), and a stat cache
            # large enough for the 100k-entry directory, trusted for the whole run.
            "multireq_max=64", "max_stat_cache_size=300000", "stat_cache_expire=3600",
            "enable_noobj_cache",
            "dbglevel=warn",
        ])
        if getattr(g, "ca", None):
            env["CURL_CA_BUNDLE"] = g.ca  # libcurl's CA file, which s3fs reads from the environment
        cmd = ["s3fs", bucket, mnt, "-f", "-o", opts]
        shown = " ".join(cmd).replace(pw, "PASSWD_FILE")
        return (lambda: Mount(name, cmd, env, mnt, logpath, shown)), None
    if name == "mount-s3":
        binary = mount_s3_binary()
        if not binary:
            return None, MOUNT_S3_MISSING
        # --metadata-ttl indefinite: Mountpoint's documented setting for a bucket that does
        # not change while mounted (its default re-checks S3 on every lookup and open), as
        # rclone gets --dir-cache-time 1h and s3fs stat_cache_expire=3600.
        if getattr(g, "ca", None):
            env["SSL_CERT_FILE"] = g.ca  # the CRT's TLS (s2n) has no CA-bundle option of Mountpoint's
        cmd = [binary, bucket, mnt, "--foreground", "--read-only", "--endpoint-url", g.endpoint,
               "--region", g.region, "--force-path-style", "--metadata-ttl", "indefinite"]
        shown = "AWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. " + " ".join(cmd).replace(HERE + "/", "bench/")
        return (lambda: Mount(name, cmd, env, mnt, logpath, shown)), None
    raise ValueError(name)


# ------------------------------------------------------------------ workloads


def fio_cmd(workload, root, secs, out):
    job = os.path.join(HERE, "fio", f"{workload}.fio")
    env = dict(os.environ, BENCH_ROOT=root, RUNTIME=str(secs))
    return ["fio", "--readonly", "--output-format=json", f"--output={out}", job], env


def run_fio(workload, root, secs, tmpdir):
    out = os.path.join(tmpdir, "fio.json")
    cmd, env = fio_cmd(workload, root, secs, out)
    r = run_group(cmd, env=env, timeout=secs + 120)
    if r.returncode != 0:
        raise RuntimeError(f"fio exited {r.returncode}: {r.stderr.strip()[-800:]}")
    with open(out) as f:
        j = json.load(f)
    rd = j["jobs"][0]["read"]
    secs_used = rd["runtime"] / 1000.0
    return {"value": rd["io_bytes"] / MIB / secs_used if secs_used else 0.0, "bytes": rd["io_bytes"],
            "secs": secs_used, "iops": rd["iops"]}


def py_cmd(workload, root, m):
    w = [sys.executable, os.path.join(HERE, "workloads.py")]
    if workload == "loader-tar":
        return w + ["loader-tar", "--root", root, "--shards", ",".join(LOADER_KEYS), "--workers", str(LOADER_WORKERS),
                    "--secs", str(m["loader_secs"])]
    if workload == "handles-200":
        return w + ["handles", "--root", root, "--shards", ",".join(SHARD_KEYS), "--handles", "200",
                    "--secs", str(m["loader_secs"])]
    if workload.startswith("fork-"):
        return w + ["quarters", "--root", root, "--shard", SHARD_KEYS[0], "--workers", "4", "--secs",
                    str(m["loader_secs"])] + (["--shared"] if workload == "fork-shared" else [])
    if workload == "loader-small":
        return w + ["loader-small", "--root", root, "--dirs", str(m["jpeg_dirs"]), "--per-dir", str(m["jpeg_per"]),
                    "--workers", "8", "--secs", str(m["loader_secs"])]
    if workload.startswith("meta-"):
        return w + ["meta", "--root", root, "--sub", workload[5:], "--secs", str(m["meta_secs"])]
    if workload.startswith(("find-", "lsr-")):
        tool, sub = workload.split("-", 1)
        return w + ["walk-tool", "--root", root, "--sub", sub, "--tool", tool, "--secs", str(m["meta_secs"])]
    if workload == "stat-hot":
        return w + ["stat-hot", "--root", root, "--sub", "tree", "--files", str(HOT_FILES),
                    "--threads", str(HOT_THREADS), "--secs", str(m["hot_secs"])]
    raise ValueError(workload)


def run_py(workload, root, m):
    cmd = py_cmd(workload, root, m)
    r = run_group(cmd, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{workload} exited {r.returncode}: {r.stderr.strip()[-800:]}")
    j = last_json(r.stdout)
    unit = WORKLOADS[workload][2]
    if j.get("error"):
        raise RuntimeError(f"{workload}: {j['error']}")
    j["value"] = {"MiB/s": j.get("mib_per_s"), "files/s": j.get("files_per_s"),
                  "entries/s": j.get("entries_per_s"), "stat/s": j.get("stats_per_s")}[unit]
    return j


def rawget_cmd(workload, rawget, bucket, m):
    base = [rawget]
    if workload.startswith(("seq-1j", "fork-")):
        return base + ["seq", "--bucket", bucket, "--keys", SHARD_KEYS[0], "--concurrency", str(RAW_SEQ_CONCURRENCY),
                       "--max-secs", str(m["seq_secs"])]
    if workload.startswith("seq-4j") or workload in ("loader-tar", "handles-200"):
        secs = m["seq_secs"] if workload.startswith("seq") else m["loader_secs"]
        keys = LOADER_KEYS if workload == "loader-tar" else SHARD_KEYS
        return base + ["seq", "--bucket", bucket, "--keys", ",".join(keys), "--concurrency",
                       str(RAW_SEQ_CONCURRENCY), "--max-secs", str(secs)]
    if workload.startswith("rand-"):
        bs = {"rand-4k": 4096, "rand-256k": 262144}[workload]
        # As many requests in flight as fio has readers: the latency-bound best case.
        return base + ["rand", "--bucket", bucket, "--keys", ",".join(SHARD_KEYS), "--bs", str(bs),
                       "--concurrency", "4", "--secs", str(m["rand_secs"])]
    if workload == "loader-small":
        return base + ["small", "--bucket", bucket, "--prefix", "jpeg/", "--concurrency", "8",
                       "--max-secs", str(m["loader_secs"])]
    if workload in WALKS:
        return base + ["list", "--bucket", bucket, "--prefix", WALKS[workload] + "/", "--max-secs",
                       str(m["meta_secs"])]
    if workload in NO_LIMIT:
        return None
    raise ValueError(workload)


def run_rawget(workload, rawget, bucket, m, g):
    r = run_group(rawget_cmd(workload, rawget, bucket, m), env=s3_env(g), timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"rawget exited {r.returncode}: {r.stderr.strip()[-800:]}")
    j = last_json(r.stdout)
    unit = WORKLOADS[workload][2]
    j["value"] = {"MiB/s": j.get("mib_per_s"), "files/s": j.get("files_per_s"), "entries/s": j.get("files_per_s")}[unit]
    return j


def measure(system, workload, ctx):
    """One measurement: returns a dict with value (in the workload's unit), requests, rss."""
    a, m, g, bucket, rawget, data, tmp = (ctx[k] for k in ("args", "mode", "garage", "bucket", "rawget", "data", "tmp"))
    kind = WORKLOADS[workload][1]
    res = {"load": loadavg()}
    if system == "raw-get":
        before, cpu = g.counters(), children_cpu_secs()
        res.update(run_rawget(workload, rawget, bucket, m, g))
        # The client's own CPU: the one child waited for in between is rawget.
        res["cpu_s"] = children_cpu_secs() - cpu
        res["requests"] = diff(g.counters(), before)
        return res
    if system == "local-disk":
        # Cold: the data set's pages are dropped from the page cache first.
        sub = [] if WORKLOADS[workload][0] == "meta" else {"loader-small": ["jpeg"], "loader-tar": ["loader"]}.get(workload, ["shards"])
        if sub:
            run([sys.executable, os.path.join(HERE, "workloads.py"), "evict", *[os.path.join(data, s) for s in sub]])
        res.update(run_fio(workload, data, secs_for(workload, m), tmp) if kind == "fio" else run_py(workload, data, m))
        return res
    mount = ctx["factories"][system]()
    mount.start()
    try:
        before, cpu = g.counters(), mount.cpu_secs()
        res.update(run_fio(workload, mount.mnt, secs_for(workload, m), tmp) if kind == "fio"
                   else run_py(workload, mount.mnt, m))
        res["cpu_s"] = mount.cpu_secs() - cpu
        res["requests"] = diff(g.counters(), before)
        res["rss_mib"] = mount.peak_rss_mib()
    finally:
        mount.stop()
    return res


def cpu_per_unit(r, workload):
    """CPU-seconds per GiB read, or per 1,000 files for the small-file loader; None if unknown."""
    if r.get("cpu_s") is None:
        return None
    if WORKLOADS[workload][2] == "files/s":
        return r["cpu_s"] / (r["files"] / 1000) if r.get("files") else None
    return r["cpu_s"] / (r["bytes"] / GIB) if r.get("bytes") else None


def secs_for(workload, m):
    return m["seq_secs"] if workload.startswith("seq") else m["rand_secs"]


def diff(after, before):
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


# ------------------------------------------------------------------ report

OP_SHORT = {"GetObject": "GET", "HeadObject": "HEAD", "ListObjectsV2": "LIST", "ListObjects": "LIST(v1)",
            "HeadBucket": "HEADB", "GetBucketLocation": "LOC"}


def fmt_value(v, unit):
    if v is None:
        return "?"
    if unit == "MiB/s":
        return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"
    return f"{v:,.0f}"


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fmt_requests(reqs):
    ops = {k: v for k, v in (reqs or {}).items() if k != BYTES_READ}
    if not ops:
        return "0"
    items = sorted(ops.items(), key=lambda kv: -kv[1])
    txt = ", ".join(f"{OP_SHORT.get(k, k)} {v:,}" for k, v in items)
    if reqs.get(BYTES_READ):
        txt += f"; {fmt_bytes(reqs[BYTES_READ])} read"
    return txt


def median_requests(runs):
    ops = sorted({k for r in runs for k in r.get("requests", {})})
    return {op: int(statistics.median([r.get("requests", {}).get(op, 0) for r in runs])) for op in ops}


def summarize(results, workloads, systems):
    """results[(system, workload)] = list of run dicts or {"error": ..}."""
    table = {}
    for w in workloads:
        for s in systems:
            runs = results.get((s, w))
            if not isinstance(runs, list) or not runs:
                table[(s, w)] = runs if isinstance(runs, dict) else {"error": "not measured"}
                continue
            ok = [r for r in runs if "error" not in r]
            if not ok:
                table[(s, w)] = {"error": runs[-1]["error"]}
                continue
            vals = [r["value"] for r in ok]
            rss = [r["rss_mib"] for r in ok if r.get("rss_mib") is not None]
            cpu = [c for c in (cpu_per_unit(r, w) for r in ok) if c is not None]
            table[(s, w)] = {
                "median": statistics.median(vals), "values": vals, "n": len(ok), "failed": len(runs) - len(ok),
                "requests": median_requests(ok), "rss_mib": max(rss) if rss else None,
                "cpu": statistics.median(cpu) if cpu else None,
                "partial": sum(1 for r in ok if r.get("complete") is False),
                "secs": statistics.median([r["secs"] for r in ok]) if all("secs" in r for r in ok) else None,
                "errors": [r["error"] for r in runs if "error" in r],
            }
    return table


def machine_info():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem_kb / 1048576, 1),
            "kernel": platform.release(), "os": platform.platform()}


def versions(g, rawget):
    def first(cmd):
        try:
            r = subprocess.run(cmd, text=True, capture_output=True, timeout=20)
            return ((r.stdout or "") + (r.stderr or "")).strip().splitlines()[0]
        except Exception as e:  # noqa: BLE001 - a version line is best effort
            return f"unavailable ({e})"
    lm = os.path.join(REPO, "target", "release", "lakemount")
    built = (datetime.datetime.fromtimestamp(os.path.getmtime(lm), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
             if os.path.exists(lm) else "?")
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], text=True, capture_output=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
                           text=True, capture_output=True).stdout.strip()
    sdk = "?"
    lock = os.path.join(HERE, "rawget", "Cargo.lock")
    if os.path.exists(lock):
        m = re.search(r'name = "aws-sdk-s3"\nversion = "([^"]+)"', open(lock).read())
        sdk = m.group(1) if m else "?"
    lsdk = re.search(r'name = "aws-sdk-s3"\nversion = "([^"]+)"', open(os.path.join(REPO, "Cargo.lock")).read())
    v = {
        "lakemount": f"{first([lm, '--version'])} (git {rev}{', uncommitted changes in src/' if dirty else ''}; "
                     f"binary built {built}; aws-sdk-s3 {lsdk.group(1) if lsdk else '?'})",
        f"{'Garage' if isinstance(g, Garage) else 'in-memory S3'} (server)": g.version(),
        "rclone": first(["rclone", "version"]) if shutil.which("rclone") else "not installed",
        "s3fs": first(["s3fs", "--version"]) if shutil.which("s3fs") else "not installed",
        "mount-s3": mount_s3_version(),
        "rawget (limit)": f"bench/rawget, aws-sdk-s3 {sdk}",
        "fio": first(["fio", "--version"]),
        "python": platform.python_version(),
    }
    return v


def save_section(path, name, title, lines):
    """Writes `lines` (a report whose headings start at `##`) into the results
    file at `path` as the section `name`: between its `<!-- name:begin -->` and
    `<!-- name:end -->` markers when the file has them, else at the top, under
    the file's title. Other sections (the metadata suite, the cache epochs: each
    written by its own run) are kept as they are."""
    body = []
    for line in lines:
        body.append("#" + line if line.startswith("##") else line)
    block = f"<!-- {name}:begin -->\n## {title}\n\n" + "\n".join(body).rstrip("\n") + f"\n<!-- {name}:end -->\n"
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):].lstrip("\n")
    else:
        head, _, rest = old.partition("\n")
        new = head + "\n\n" + block + "\n" + rest.lstrip("\n")
    with open(path, "w") as f:
        f.write(new)


def write_results(path, ctx, table, workloads, systems, skipped, started, finished, load_before, load_after, setup_log):
    a, m, g = ctx["args"], ctx["mode"], ctx["garage"]
    mi = machine_info()
    ver = ctx.get("versions") or versions(g, ctx["rawget"])
    L = []
    L.append(f"Written by `bench/run.sh` (see [README.md](README.md) for how to run it and read this). "
             f"Mode **{ctx['mode_name']}**, suites {', '.join(ctx['suites'])}, N = {m['runs']} runs per cell, "
             "each cell the **median**; every mount is mounted afresh (cold) for every run.\n")
    L.append(f"- Date: {started:%Y-%m-%d %H:%M} - {finished:%H:%M} UTC ({(finished - started).total_seconds() / 60:.1f} min)")
    L.append(f"- Machine: {mi['cores']} cores ({mi['cpu']}), {mi['memory_gib']} GiB RAM, kernel {mi['kernel']}, {mi['os']}")
    lv = [r.get("load") for runs in ctx["results"].values() if isinstance(runs, list) for r in runs if r.get("load") is not None]
    L.append(f"- Load (1-min average, shared machine): {load_before:.2f} before, {load_after:.2f} after; "
             f"{min(lv):.2f} - {max(lv):.2f} at the start of the measurements" if lv else
             f"- Load: {load_before:.2f} before, {load_after:.2f} after")
    L.append(f"- Data (bucket `{ctx['bucket']}`): shards/ {m['shards']} tar shards of {m['shard_size'] // MIB} MiB; "
             f"loader/ {m['loader_shards']} tar shards of {m['loader_shard_size'] // MIB} MiB; "
             f"tree/ {m['tree_dirs']} x {m['tree_per']} objects of 4-12 KiB; flat/ {m['flat']:,} objects of 4-12 KiB; "
             f"jpeg/ {m['jpeg_dirs']} x {m['jpeg_per']} objects of 40-200 KB. Time caps: seq {m['seq_secs']} s, "
             f"rand {m['rand_secs']} s, loader {m['loader_secs']} s, meta {m['meta_secs']} s.")
    lt = link_text(ctx.get("link"))
    link = ctx.get("link") or {}
    if lt:
        L.append(f"- Link emulation: **{lt}**. "
                 + (f"What the S3 server sends is limited to {link['gbit']:g} Gbit/s "
                    f"({link['gbit'] * 1e9 / 8 / MIB:,.0f} MiB/s) by an HTB class on `lo` for its port"
                    if link.get("gbit") else "No bandwidth limit")
                 + (f"; every GET, HEAD and LIST waits {link['ttfb_ms']:g} ms before its answer (`--ttfb-ms`)"
                    if link.get("ttfb_ms") else "; no added latency")
                 + ". The raw-GET column is then the limit of that link (bench/README.md, \"Link emulation\").")
    else:
        L.append("- Link: unlimited loopback (no emulation): the raw-GET limit is the in-memory server and "
                 "loopback memory bandwidth.")
    if link.get("tls"):
        L.append("- **HTTPS** (`--tls`): the in-memory server speaks TLS with a CA of its own (a fresh one per "
                 "start); lakemount and rawget get it as `AWS_CA_BUNDLE` (the same hyper + rustls/aws-lc stack), "
                 "rclone as `--ca-cert`, s3fs as `CURL_CA_BUNDLE`, Mountpoint as `SSL_CERT_FILE`.")
    L.append("- Versions:")
    for k, v in ver.items():
        L.append(f"  - {k}: {v}")
    L.append("")

    notes = []

    def note(text):
        if text not in notes:
            notes.append(text)
        return f"[^{notes.index(text) + 1}]"

    def cell(s, w, what):
        if s in skipped:
            return "n/a " + note(skipped[s])
        if s == "raw-get" and w in NO_LIMIT:
            return "n/a (all cached)"
        t = table.get((s, w), {"error": "not measured"})
        if "error" in t:
            return "failed " + note(f"{s} / {w}: {t['error']}")
        unit = WORKLOADS[w][2]
        if what == "value":
            base = table.get(("raw-get", w), {})
            txt = fmt_value(t["median"], unit)
            if s != "raw-get" and base.get("median"):
                txt += f" ({t['median'] / base['median']:.2f}x)"
            if t["partial"]:
                txt += " " + note("Capped: the time cap ended the workload before all data was read; "
                                  "the rate is over the part done.")
            if t["failed"]:
                txt += " " + note(f"{s} / {w}: {t['failed']} of {t['failed'] + t['n']} runs failed: {t['errors'][0]}")
            return txt
        if what == "requests":
            if s == "local-disk":
                return "n/a (no S3)"
            return fmt_requests(t["requests"])
        if what == "rss":
            if s == "raw-get":
                return "n/a (client, no daemon)"
            if s == "local-disk":
                return "n/a (kernel)"
            return f"{t['rss_mib']:.0f}" if t.get("rss_mib") is not None else "? " + note("VmHWM unreadable")
        if what == "cpu":
            if s == "local-disk":
                return "n/a (kernel)"
            if t.get("cpu") is None:
                return "? " + note("CPU time unreadable, or no bytes read")
            txt = f"{t['cpu']:.2f}"
            base = table.get(("raw-get", w), {})
            if s != "raw-get" and base.get("cpu"):
                txt += f" ({t['cpu'] / base['cpu']:.2f}x)"
            return txt
        raise ValueError(what)

    head = "| workload | unit | " + " | ".join(systems) + " |"
    sep = "|---|---|" + "---|" * len(systems)
    L.append("## Throughput (median; in brackets the ratio to the raw-GET limit)\n")
    L.append(head)
    L.append(sep)
    for w in workloads:
        L.append(f"| {w} | {WORKLOADS[w][2]} | " + " | ".join(cell(s, w, "value") for s in systems) + " |")
    L.append("")

    if link.get("gbit"):
        # The limit is the emulated link: does the bare client fill it?
        cap = link["gbit"] * 1e9 / 8 / MIB
        L.append("## Does the bare client fill the emulated link?\n")
        L.append(f"The link carries at most {cap:,.0f} MiB/s of S3 payload plus headers; raw-GET should come "
                 "close to it on the streaming workloads (seq, loader-tar, handles-200), which shows the shaping "
                 "works and the limit is the link, not the client or the CPU.\n")
        L.append("| workload | raw-GET limit | link rate | raw-GET / link |")
        L.append("|---|---|---|---|")
        for w in workloads:
            base = table.get(("raw-get", w), {})
            if WORKLOADS[w][2] != "MiB/s" or not base.get("median"):
                continue
            L.append(f"| {w} | {fmt_value(base['median'], 'MiB/s')} MiB/s | {cap:,.0f} MiB/s | "
                     f"{base['median'] / cap:.2f} |")
        L.append("")
    # The limit must not be the bottleneck: >= 3x the slowest mount.
    L.append("## Is the server the bottleneck?\n")
    L.append("The raw-GET limit must be at least 3x the slowest mount in the same run; otherwise the "
             "server, not the mounts, sets the pace.\n")
    L.append("| workload | raw-GET limit | slowest mount | limit / slowest | verdict |")
    L.append("|---|---|---|---|---|")
    low = []
    for w in workloads:
        base = table.get(("raw-get", w), {})
        ms = [(table[(s, w)]["median"], s) for s in systems if s in MOUNTS and s not in skipped
              and "median" in table.get((s, w), {})]
        if not base.get("median") or not ms:
            L.append(f"| {w} | - | - | - | not measured |")
            continue
        lo, who = min(ms)
        ratio = base["median"] / lo if lo > 0 else float("inf")
        unit = WORKLOADS[w][2]
        L.append(f"| {w} | {fmt_value(base['median'], unit)} {unit} | {fmt_value(lo, unit)} ({who}) | "
                 f"{ratio:,.1f}x | {'ok' if ratio >= 3 else 'LIMIT TOO LOW'} |")
        if ratio < 3:
            low.append(w)
    L.append("")
    if low and link.get("gbit"):
        L.append(f"With an emulated link, LIMIT TOO LOW ({', '.join(low)}) is expected and is not a fault of the "
                 "run: the link is meant to be the bottleneck, and a mount close to it is what the issue asks for. "
                 "The ratio to the raw-GET limit is the number to read.\n")
    elif low:
        L.append(f"Where it says LIMIT TOO LOW ({', '.join(low)}), the slowest mount already gets more than a "
                 "third of what the server can deliver to a bare client on this machine: the ratios of those rows "
                 "are bounded by the server and the shared CPU (the server, the FUSE daemon and the reader share "
                 "the cores; Garage needs ~2.4-3.7 ms of CPU per MiB served), not only by the mounts. Compare the "
                 "mounts with each other there, and measure on more cores (or with the server on another "
                 "machine) for absolute ratios. See bench/README.md.\n")

    L.append("## S3 requests per run (median, by type, counted by the server)\n")
    L.append(head)
    L.append(sep)
    for w in workloads:
        L.append(f"| {w} | | " + " | ".join(cell(s, w, "requests") for s in systems) + " |")
    L.append("")
    walks = [w for w in workloads if w in WALKS]
    if walks:
        L.append("## Metadata walks: wall time and S3 requests per walk\n")
        L.append("One run is one walk: median wall time of the walk, then its S3 requests. Bound: 1.1 x (files / 1000 + directories listed), the directories "
                 "being the walked ones plus the mount root (looked up to find `tree`/`flat`). LIST and HEAD "
                 "per walk are the medians of the runs; \"capped\" means the time cap ended the walk first "
                 "(its counts are for part of the walk).\n")
        mounts = [s for s in systems if s in MOUNTS and s not in skipped]
        L.append("| workload | files | dirs | bound | " + " | ".join(mounts) + " |")
        L.append("|---|---|---|---|" + "---|" * len(mounts))
        for w in walks:
            if WALKS[w] == "tree":
                files, dirs = m["tree_dirs"] * m["tree_per"], m["tree_dirs"] + 2
            else:
                files, dirs = m["flat"], 2
            bound = 1.1 * (files / 1000 + dirs)
            cells = []
            for s in mounts:
                t = table.get((s, w), {})
                if "requests" not in t:
                    cells.append("failed")
                    continue
                req = t["requests"]
                n = sum(v for k, v in req.items() if k != BYTES_READ and k not in ("GetObject",))
                txt = fmt_requests({k: v for k, v in req.items() if k != BYTES_READ}) + f" (= {n:,})"
                if t.get("secs") is not None:
                    txt = f"{t['secs']:.1f} s; " + txt
                if t["partial"]:
                    txt += f", capped in {t['partial']} of {t['n']} runs"
                elif s == "lakemount":
                    txt += " **<= bound**" if n <= bound else " **OVER BOUND**"
                cells.append(txt)
            L.append(f"| {w} | {files:,} | {dirs} | {bound:,.1f} | " + " | ".join(cells) + " |")
        L.append("")
    L.append("## Daemon peak RSS, MiB (VmHWM, largest over the runs)\n")
    L.append(head)
    L.append(sep)
    for w in workloads:
        L.append(f"| {w} | MiB | " + " | ".join(cell(s, w, "rss") for s in systems) + " |")
    L.append("")
    L.append("## CPU-seconds per GiB read (per 1,000 files for loader-small; median; in brackets the ratio "
             "to the raw-GET client's)\n")
    L.append("The daemon's own accounting (/proc/PID/stat: user + system, all threads) over the workload; for "
             "raw-get the client's (getrusage of the child). The server's and the reader's CPU are not in it.\n")
    L.append(head)
    L.append(sep)
    for w in workloads:
        if w in NO_LIMIT or WORKLOADS[w][0] == "meta":
            continue
        unit = "s/1k files" if WORKLOADS[w][2] == "files/s" else "s/GiB"
        L.append(f"| {w} | {unit} | " + " | ".join(cell(s, w, "cpu") for s in systems) + " |")
    L.append("")

    L.append("## Exact commands\n")
    L.append("```sh")
    L.append(f"bench/run.sh {' '.join(ctx.get('argv', sys.argv[1:]))}".rstrip())
    L.append("")
    L.append("# server")
    if isinstance(ctx["garage"], MemServer):
        srv = ctx["garage"]
        ttfb = (f" --ttfb-ms {srv.ttfb_ms:g}" if srv.ttfb_ms else "") + (" --tls" if srv.tls else "")
        L.append(f"target/release/lakemount-testserver --port {srv.s3_port} --stats-port {srv.stats_port} "
                 f"--bucket lakebench-full --bucket lakebench-quick{ttfb}"
                 "   # in memory; the data set is uploaded by `rawget put` at every start")
    else:
        L.append("LD_PRELOAD=$BENCH_DIR/nodelay.so garage -c $BENCH_DIR/garage/garage.toml server"
                 "   # config written by bench/harness.py; nodelay.so from bench/nodelay/nodelay.c")
    if link.get("gbit"):
        L.append("")
        L.append("# link emulation (removed at exit with `tc qdisc del dev lo root`)")
        for cmd in LinkShaper(g.s3_port, link["gbit"]).commands():
            L.append(" ".join(cmd))
    L.append("")
    L.append("# mounts (one fresh mount per measurement; unmounted with `umount MNT`)")
    for s in systems:
        if s in MOUNTS and s not in skipped:
            L.append(ctx["factories"][s]().shown)
    L.append("")
    L.append("# workloads (ROOT = the mount point, or $BENCH_DIR/data/MODE for local-disk)")
    for w in workloads:
        if WORKLOADS[w][1] == "fio":
            cmd, _ = fio_cmd(w, "ROOT", secs_for(w, m), "OUT.json")
            L.append(f"BENCH_ROOT=ROOT RUNTIME={secs_for(w, m)} " + " ".join(cmd).replace(HERE + "/", "bench/"))
        else:
            L.append(" ".join(py_cmd(w, "ROOT", m)).replace(HERE + "/", "bench/").replace(sys.executable, "python3"))
    L.append("")
    L.append("# the limit (AWS_* credentials and AWS_ENDPOINT_URL in the environment)")
    for w in workloads:
        cmd = rawget_cmd(w, "bench/rawget/target/release/rawget", ctx["bucket"], m)
        if cmd:
            L.append(" ".join(cmd))
    L.append("```\n")

    L.append("## All runs\n")
    L.append("| workload | system | values (run order) |")
    L.append("|---|---|---|")
    for w in workloads:
        for s in systems:
            t = table.get((s, w), {})
            if "values" in t:
                L.append(f"| {w} | {s} | {', '.join(fmt_value(v, WORKLOADS[w][2]) for v in t['values'])} |")
    L.append("")
    if setup_log:
        L.append("## Setup\n")
        for line in setup_log:
            L.append(f"- {line}")
        L.append("")
    if notes:
        L.append("## Notes\n")
        for i, n in enumerate(notes, 1):
            L.append(f"[^{i}]: {n}")
        L.append("")
    lt = link_text(ctx.get("link"))
    tls = (ctx.get("link") or {}).get("tls")
    save_section(path, ("harness-link" if lt else "harness") + ("-https" if tls else ""),
                 f"Mounts against the raw-GET limit{' of an emulated ' + lt + ' link' if lt else ''}"
                 f"{' over HTTPS' if tls else ''} ({ctx['mode_name']} run, {started:%Y-%m-%d})",
                 "\n".join(L).split("\n"))


# ------------------------------------------------------------------ main


def report_only(a):
    """Rewrites RESULTS.md from a raw JSON of an earlier run (no server, no mounts)."""
    with open(a.report) as f:
        raw = json.load(f)
    if "meta" not in raw:
        # Raw runs written before the metadata was saved: rebuild it from the file.
        keys = list(raw)
        name = os.path.basename(a.report)
        st = datetime.datetime.strptime(name.split("-")[0], "%Y%m%dT%H%M%S").replace(tzinfo=datetime.timezone.utc)
        fin = datetime.datetime.fromtimestamp(os.path.getmtime(a.report), datetime.timezone.utc)
        mode = name.split("-", 1)[1].removesuffix(".json")
        systems = [s for s in SYSTEMS if any(k.startswith(s + "|") for k in keys)] + (
            ["mount-s3"] if not mount_s3_binary() else [])
        workloads = [w for w in WORKLOADS if any(k.endswith("|" + w) for k in keys)]
        loads = [r["load"] for v in raw.values() for r in v if "load" in r]
        raw = {"results": raw, "meta": {
            "mode": mode, "runs": max(len(v) for v in raw.values()), "suites": ["all"], "workloads": workloads,
            "systems": systems, "started": st.isoformat(), "finished": fin.isoformat(),
            "skipped": {} if mount_s3_binary() else {"mount-s3": MOUNT_S3_MISSING},
            "load_before": loads[0], "load_after": loads[-1], "setup_log": [], "argv": []}}
    meta = raw["meta"]
    started = datetime.datetime.fromisoformat(meta["started"])
    finished = datetime.datetime.fromisoformat(meta["finished"])
    m = dict(MODES[meta["mode"]], runs=meta["runs"])
    results = {tuple(k.split("|")): v for k, v in raw["results"].items()}
    in_memory = meta.get("server") == "memory" or any("in-memory" in k for k in (meta.get("versions") or {}))
    link = meta.get("link") or {}
    g = (MemServer(a.bench_dir, a.memserver, a.port_base, link.get("ttfb_ms") or 0.0) if in_memory
         else Garage(a.bench_dir, a.garage, a.port_base, None))
    g.key_id, g.secret = "KEY", "SECRET"
    bucket = f"lakebench-{meta['mode']}"
    ctx = {"args": a, "mode": m, "mode_name": meta["mode"], "garage": g, "bucket": bucket, "rawget": a.rawget,
           "suites": meta["suites"], "results": results, "factories": {}, "argv": meta.get("argv", []),
           "versions": meta.get("versions"), "link": link}
    for s in meta["systems"]:
        if s in MOUNTS and s not in meta["skipped"]:
            ctx["factories"][s] = mount_factory(s, a, g, bucket, write_secrets=False)[0]
    table = summarize(results, meta["workloads"], meta["systems"])
    write_results(a.results, ctx, table, meta["workloads"], meta["systems"], meta["skipped"], started, finished,
                  meta["load_before"], meta["load_after"], meta["setup_log"])
    log(f"wrote {a.results} from {a.report}")
    return 0


def main():
    p = argparse.ArgumentParser(description="lakemount benchmark harness (use bench/run.sh)")
    p.add_argument("suites", nargs="*", help=f"suites: {', '.join(SUITES)}, all (default), or workload names")
    p.add_argument("--quick", action="store_true", help="small data set and short caps, to try the harness")
    p.add_argument("--runs", type=int, help="runs per cell (default 3)")
    p.add_argument("--systems", help="comma-separated subset of " + ",".join(SYSTEMS))
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(REPO), "bench-data"))
    p.add_argument("--garage", default=os.environ.get("GARAGE_BIN") or shutil.which("garage") or os.path.expanduser("~/.cargo/bin/garage"))
    p.add_argument("--server", choices=["memory", "garage"], default="memory",
                   help="S3 server: the in-memory s3s server of testserver/ (default; the fastest, so the raw-GET "
                        "limit is the client's) or Garage (which hashes every block it serves, bench/README.md)")
    p.add_argument("--memserver", default=os.path.join(REPO, "target", "release", "lakemount-testserver"))
    p.add_argument("--rawget", default=os.path.join(HERE, "rawget", "target", "release", "rawget"))
    p.add_argument("--nodelay", default=None,
                   help="LD_PRELOAD shim that sets TCP_NODELAY in Garage (bench/nodelay/nodelay.c)")
    p.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "39800")))
    p.add_argument("--link-gbit", type=float, default=0.0, metavar="G",
                   help="emulate a training node's link to S3: limit what the server sends to G Gbit/s "
                        "(HTB on lo for the server's port; bench/README.md). 0: unlimited loopback (default)")
    p.add_argument("--ttfb-ms", type=float, default=0.0, metavar="T",
                   help="emulated time to first byte of every GET/HEAD/LIST, ms (in-memory server only). "
                        "0: none (default)")
    p.add_argument("--tls", action="store_true",
                   help="serve S3 over HTTPS with a CA of the server's own (in-memory server only); every "
                        "client is given the CA (AWS_CA_BUNDLE, rclone --ca-cert, CURL_CA_BUNDLE for s3fs)")
    p.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--report", metavar="RAW_JSON",
                   help="only rewrite RESULTS.md from the raw runs of an earlier run ($BENCH_DIR/results/*.json)")
    a = p.parse_args()
    if a.report:
        return report_only(a)
    if a.link_gbit < 0 or a.ttfb_ms < 0:
        p.error("--link-gbit and --ttfb-ms must be >= 0")
    if a.ttfb_ms and a.server != "memory":
        p.error("--ttfb-ms needs the in-memory server (--server memory)")
    if a.tls and a.server != "memory":
        p.error("--tls needs the in-memory server (--server memory)")
    a.bench_dir = os.path.abspath(a.bench_dir)
    if a.bench_dir.startswith(REPO + os.sep):
        p.error(f"--bench-dir {a.bench_dir} is inside the checkout; keep the data outside it")

    mode_name = "quick" if a.quick else "full"
    m = dict(MODES[mode_name])
    if a.runs:
        m["runs"] = a.runs
    wanted = a.suites or ["all"]
    workloads = []
    for s in wanted:
        if s == "all":
            workloads += list(WORKLOADS)
        elif s in SUITES:
            workloads += [w for w, v in WORKLOADS.items() if v[0] == s]
        elif s in WORKLOADS:
            workloads.append(s)
        else:
            p.error(f"unknown suite or workload {s!r}; suites: {', '.join(SUITES)}, all; workloads: {', '.join(WORKLOADS)}")
    workloads = list(dict.fromkeys(workloads))
    systems = a.systems.split(",") if a.systems else list(SYSTEMS)
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}; systems: {', '.join(SYSTEMS)}")
    if "raw-get" not in systems:
        systems.insert(0, "raw-get")  # every ratio refers to it

    os.makedirs(a.bench_dir, exist_ok=True)
    tmp = os.path.join(a.bench_dir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    bucket = f"lakebench-{mode_name}"
    a.nodelay = a.nodelay or os.path.join(a.bench_dir, "nodelay.so")
    preload = a.nodelay if a.nodelay and os.path.exists(a.nodelay) else None
    if not preload and a.server == "garage":
        log("WARNING: no TCP_NODELAY shim for Garage: small GETs will stall 40 ms each (see bench/nodelay/nodelay.c)")
    g = make_server(a, preload)
    link = {"gbit": a.link_gbit, "ttfb_ms": a.ttfb_ms, "tls": a.tls}
    shaper = LinkShaper(g.s3_port, a.link_gbit) if a.link_gbit else None
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = loadavg()
    log(f"mode {mode_name}, workloads {', '.join(workloads)}, systems {', '.join(systems)}, load {load_before:.2f}")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    setup_log = []
    results = {}
    try:
        g.start()
        if shaper:
            shaper.start()
        t = time.monotonic()
        only = parts_read_by(workloads) if isinstance(g, MemServer) else None
        data = make_data(a, mode_name, g, bucket, a.rawget, only)
        setup_log.append(f"data sets ready in {time.monotonic() - t:.0f} s (generated when missing; uploaded when the server lacks them)")
        if only is not None:
            setup_log.append("the in-memory server holds only what the selected workloads read: "
                             + ", ".join(f"{p}/" for p in sorted(only)))
        ctx = {"args": a, "mode": m, "mode_name": mode_name, "garage": g, "bucket": bucket, "rawget": a.rawget,
               "data": data, "tmp": tmp, "suites": wanted, "results": results, "factories": {},
               "versions": versions(g, a.rawget), "link": link}
        skipped = {}
        for s in systems:
            if s in MOUNTS:
                f, why = mount_factory(s, a, g, bucket)
                if f is None:
                    skipped[s] = why
                else:
                    ctx["factories"][s] = f
        for s, why in skipped.items():
            log(f"{s}: {why}")
        active = [s for s in systems if s not in skipped]
        # Interleaved: for each workload, run 1 of every system, then run 2, ...
        for w in workloads:
            for i in range(m["runs"]):
                for s in active:
                    if s == "raw-get" and w in NO_LIMIT:
                        continue
                    t = time.monotonic()
                    try:
                        r = measure(s, w, ctx)
                        results.setdefault((s, w), []).append(r)
                        log(f"{w:13} run {i + 1}/{m['runs']} {s:12} {fmt_value(r['value'], WORKLOADS[w][2]):>9} "
                            f"{WORKLOADS[w][2]:9} {fmt_requests(r.get('requests', {}))[:60]:60} "
                            f"rss {r.get('rss_mib') or 0:5.0f} MiB  cpu {r.get('cpu_s') or 0:5.2f} s  "
                            f"({time.monotonic() - t:.1f} s, load {r['load']:.1f})")
                    except Exception as e:  # noqa: BLE001 - recorded next to the cell
                        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                        results.setdefault((s, w), []).append({"error": msg})
                        log(f"{w:13} run {i + 1}/{m['runs']} {s:12} FAILED: {msg}")
        finished = datetime.datetime.now(datetime.timezone.utc)
        load_after = loadavg()
        raw = os.path.join(a.bench_dir, "results", f"{started:%Y%m%dT%H%M%S}-{mode_name}.json")
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        meta = {"mode": mode_name, "runs": m["runs"], "suites": wanted, "workloads": workloads, "systems": systems,
                "skipped": skipped, "started": started.isoformat(), "finished": finished.isoformat(),
                "load_before": load_before, "load_after": load_after, "setup_log": setup_log, "argv": sys.argv[1:],
                "server": a.server, "link": link,
                "versions": ctx["versions"]}
        with open(raw, "w") as f:
            json.dump({"meta": meta, "results": {f"{s}|{w}": v for (s, w), v in results.items()}}, f, indent=1)
        table = summarize(results, workloads, systems)
        write_results(a.results, ctx, table, workloads, systems, skipped, started, finished, load_before, load_after,
                      setup_log)
        log(f"wrote {a.results} (raw runs: {raw}) in {(finished - started).total_seconds() / 60:.1f} min")
    finally:
        # Nothing stays mounted, nothing stays running.
        mroot = os.path.join(a.bench_dir, "mnt")
        if os.path.isdir(mroot):
            for d in os.listdir(mroot):
                mp_ = os.path.join(mroot, d)
                if os.path.ismount(mp_):
                    log(f"unmounting leftover {mp_}")
                    run(["umount", "-l", mp_], check=False)
        if shaper:
            log("link class counters: " + " ".join(shaper.stats().split()))
            shaper.stop()
        g.stop()
        # rclone's cache of the last rclone-full measurement (up to the whole data set).
        shutil.rmtree(os.path.join(a.bench_dir, "rclone-cache"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); cleaned up")
        sys.exit(130)
