#!/usr/bin/env python3
"""A node of a three-node Garage cluster stopped mid-read (issue 13), hand-run.

Starts three Garage nodes on loopback (replication factor 3, one zone each,
data under $BENCH_DIR/garage3), uploads the data set of bench/faults.py
(4 x 256 MiB shards, 2,000 small files) through node 1, mounts lakemount
(defaults) on node 1's S3 endpoint and reads everything with 8 threads,
comparing every byte: once with all nodes up, then --runs times with node 3
killed (SIGKILL) --after seconds into the read and started again after it.

    python3 bench/garage3.py [--runs 3] [--after 2]

One line per read: seconds, files ok / wrong / failed. Builds nothing.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faults  # noqa: E402
import harness  # noqa: E402

S3_PORT, RPC_PORT, ADMIN_PORT = 39860, 39870, 39880


class Node:
    def __init__(self, a, i, secret):
        self.i, self.binary = i, a.garage
        self.dir = os.path.join(a.bench_dir, "garage3", f"n{i}")
        self.cfg = os.path.join(self.dir, "garage.toml")
        os.makedirs(self.dir, exist_ok=True)
        with open(self.cfg, "w") as f:
            f.write(f"""metadata_dir = "{self.dir}/meta"
data_dir = "{self.dir}/data"
db_engine = "lmdb"
replication_factor = 3
compression_level = "none"
block_size = "256K"
disable_scrub = true
rpc_bind_addr = "127.0.0.1:{RPC_PORT + i}"
rpc_public_addr = "127.0.0.1:{RPC_PORT + i}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{S3_PORT + i}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{ADMIN_PORT + i}"
""")
        os.chmod(self.cfg, 0o600)
        self.proc = None
        self.endpoint = f"http://127.0.0.1:{S3_PORT + i}"

    def cli(self, *args, check=True):
        return harness.run([self.binary, "-c", self.cfg, *args], check=check)

    def start(self):
        log = open(os.path.join(self.dir, "garage.log"), "a")
        self.proc = subprocess.Popen([self.binary, "-c", self.cfg, "server"], stdout=log, stderr=log,
                                     env=dict(os.environ, RUST_LOG="garage=warn"), start_new_session=True)
        for _ in range(300):
            if self.cli("status", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"garage node {self.i} did not start; see {self.dir}/garage.log")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def node_id(self):
        return self.cli("node", "id", "-q").stdout.strip()


def cluster(a):
    """Three running nodes, connected, with a layout, a key and the bucket."""
    base = os.path.join(a.bench_dir, "garage3")
    os.makedirs(base, exist_ok=True)
    secret_file = os.path.join(base, "rpc_secret")
    if not os.path.exists(secret_file):
        with open(secret_file, "w") as f:
            f.write(os.urandom(32).hex())
    secret = open(secret_file).read().strip()
    nodes = [Node(a, i, secret) for i in (1, 2, 3)]
    for n in nodes:
        n.start()
    ids = [n.node_id() for n in nodes]
    for full in ids[1:]:
        nodes[0].cli("node", "connect", full)
    show = nodes[0].cli("layout", "show").stdout
    m = re.search(r"Current cluster layout version:\s*(\d+)", show)
    if not (m and int(m.group(1)) > 0):
        for i, full in enumerate(ids):
            nodes[0].cli("layout", "assign", "-z", f"dc{i + 1}", "-c", "20G", full.split("@")[0][:16])
        nodes[0].cli("layout", "apply", "--version", "1")
    keyfile = os.path.join(base, "key.json")
    if not os.path.exists(keyfile):
        for _ in range(100):
            r = nodes[0].cli("key", "create", "bench-key", check=False)
            if r.returncode == 0:
                break
            time.sleep(0.3)
        kid = re.search(r"Key ID:\s*(\S+)", r.stdout)
        sec = re.search(r"Secret key:\s*(\S+)", r.stdout)
        json.dump({"id": kid.group(1), "secret": sec.group(1)}, open(keyfile, "w"))
    k = json.load(open(keyfile))
    if nodes[0].cli("bucket", "info", "faults", check=False).returncode != 0:
        nodes[0].cli("bucket", "create", "faults")
    nodes[0].cli("bucket", "allow", "--read", "--write", "--owner", "faults", "--key", "bench-key")
    return nodes, k


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--after", type=float, default=2.0, help="seconds into the read when node 3 is killed")
    p.add_argument("--bench-dir", default=os.environ.get("BENCH_DIR") or os.path.join(os.path.dirname(harness.REPO),
                                                                                      "bench-data"))
    p.add_argument("--garage", default=os.environ.get("GARAGE_BIN") or os.path.expanduser("~/.cargo/bin/garage"))
    a = p.parse_args()
    a.server = "garage3"
    rawget = os.path.join(harness.HERE, "rawget", "target", "release", "rawget")
    data = faults.make_data(a, rawget)
    nodes, k = cluster(a)
    g = types.SimpleNamespace(endpoint=nodes[0].endpoint, region="garage", key_id=k["id"], secret=k["secret"])
    try:
        faults.upload(a, g, "faults", data, rawget)
        for run in range(a.runs + 1):
            kill = run > 0
            make, _ = harness.mount_factory("lakemount", a, g, "faults")
            m = make()
            m.start()
            harness.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
            timer = threading.Timer(a.after, nodes[2].kill) if kill else None
            if timer:
                timer.start()
            r = subprocess.run([sys.executable, "-c", faults.READER, m.mnt, data], stdout=subprocess.PIPE,
                               text=True, timeout=1800)
            m.stop()
            n, secs = faults.tally(r.stdout)
            print(f"node 3 {'killed at %.1f s' % a.after if kill else 'up'}: {secs} s, ok={n['ok']} "
                  f"wrong={n['wrong']} failed={n['failed']}", flush=True)
            if kill:
                nodes[2].start()
                time.sleep(3)
    finally:
        for n in nodes:
            n.kill()


if __name__ == "__main__":
    main()
