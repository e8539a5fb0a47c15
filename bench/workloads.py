#!/usr/bin/env python3
"""Python data-loader workloads of the benchmark harness (stdlib only).

Each command reads through ROOT (a mount point, or the local copy of the data
set) and prints one JSON line: bytes, files, entries, secs and rates.

  loader-tar   --root R --shards K1,K2,.. --workers W --secs S
      W worker processes (as a PyTorch DataLoader's num_workers), the shards
      dealt to them round-robin; each worker streams its shards one after
      another, sample by sample, with tarfile's streaming reader (as
      WebDataset does) and reads every member.
  loader-small --root R --dirs D --per-dir M --workers W --secs S [--seed 1]
      W worker processes open and read whole JPEG-sized files jpeg/dNNN/fNNNN.jpg
      in a shuffled order (the names come from the data set's index, as a
      training list file gives them: no directory listing first).
  meta         --root R --sub tree|flat --secs S
      os.walk over ROOT/SUB plus os.stat of every file.
  walk-tool    --root R --sub tree|flat --tool find|lsr --secs S
      `find ROOT/SUB -type f` (files counted, as `| wc -l` would) or
      `ls -lR ROOT/SUB` (files and directories counted); killed at the cap.
  stat-hot     --root R --sub tree --files N --threads T --secs S
      os.stat of the first N files of an os.walk of ROOT/SUB (untimed: this
      puts them in every cache), then T threads stat() those files round
      and round for S seconds; reports stat calls per second.
  evict        PATH...
      drops the page cache of every file under PATH (posix_fadvise DONTNEED),
      so the local-disk runs read from the disk, not from memory.

Every workload stops starting new work after --secs seconds; the rate is over
the time actually spent, and "complete" says whether everything was read.
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tarfile
import threading
import time

MIB = 1048576


def _tar_worker(paths, deadline, start_evt, out):
    start_evt.wait()
    nbytes = files = 0
    complete = True
    for path in paths:
        if not complete or time.monotonic() >= deadline:
            complete = False
            break
        with open(path, "rb", buffering=1 << 20) as f:
            with tarfile.open(fileobj=f, mode="r|") as tf:
                for m in tf:
                    if time.monotonic() >= deadline:
                        complete = False
                        break
                    if not m.isfile():
                        continue
                    data = tf.extractfile(m).read()
                    nbytes += len(data)
                    files += 1
    out.put((nbytes, files, complete, time.monotonic()))


def _small_worker(paths, deadline, start_evt, out):
    start_evt.wait()
    nbytes = files = 0
    complete = True
    for p in paths:
        if time.monotonic() >= deadline:
            complete = False
            break
        with open(p, "rb") as f:
            nbytes += len(f.read())
        files += 1
    out.put((nbytes, files, complete, time.monotonic()))


def _run_workers(target, arglists, secs):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_evt = ctx.Event()
    # Workers get the deadline once started; it is set relative to the start below.
    t0 = time.monotonic() + 0.5
    deadline = t0 + secs
    procs = [ctx.Process(target=target, args=(*a, deadline, start_evt, out)) for a in arglists]
    for p in procs:
        p.start()
    while time.monotonic() < t0:
        time.sleep(0.01)
    start = time.monotonic()
    start_evt.set()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    end = max(r[3] for r in results)
    secs_used = end - start
    nbytes = sum(r[0] for r in results)
    files = sum(r[1] for r in results)
    return {
        "bytes": nbytes,
        "files": files,
        "secs": round(secs_used, 4),
        "mib_per_s": round(nbytes / secs_used / MIB, 2),
        "files_per_s": round(files / secs_used, 1),
        "complete": all(r[2] for r in results),
        "workers": len(procs),
    }


def _quarter_worker(path, fd, w, workers, deadline, start_evt, out):
    """Worker `w` of `workers`: reads its own 1/workers of `path` front to back in
    1 MiB preads, once, through `fd` (opened before the fork, shared) or its own open."""
    start_evt.wait()
    f = fd if fd is not None else os.open(path, os.O_RDONLY)
    part = os.fstat(f).st_size // workers // MIB * MIB
    off, end = w * part, (w + 1) * part
    nbytes = 0
    complete = True
    while off < end:
        if time.monotonic() >= deadline:
            complete = False
            break
        b = os.pread(f, min(MIB, end - off), off)
        if not b:
            break
        off += len(b)
        nbytes += len(b)
    out.put((nbytes, 1, complete, time.monotonic()))


def quarters(a):
    """`--workers` forked processes each read their own part of one shard (a
    DataLoader whose workers split a file); `--shared`: through one descriptor
    opened before the fork, as workers forked after the dataset opened it have."""
    path = os.path.join(a.root, a.shard)
    fd = os.open(path, os.O_RDONLY) if a.shared else None
    r = _run_workers(_quarter_worker, [(path, fd, w, a.workers) for w in range(a.workers)], a.secs)
    r["shared"] = a.shared
    return r


def loader_tar(a):
    shards = [os.path.join(a.root, k) for k in a.shards.split(",") if k]
    workers = min(a.workers, len(shards))
    return _run_workers(_tar_worker, [(shards[w::workers],) for w in range(workers)], a.secs)


def handles(a):
    """`--handles` open files read at once (threads of one process), spread over
    the shards at evenly spaced offsets, each read front to back in 1 MiB reads
    for `--secs`: many open shards, as a loader with many workers has, to show
    the read-ahead memory budget holding (the harness records the daemon's RSS)."""
    import threading

    shards = [os.path.join(a.root, k) for k in a.shards.split(",") if k]
    sizes = [os.stat(p).st_size for p in shards]
    files = [open(shards[i % len(shards)], "rb", buffering=0) for i in range(a.handles)]
    per_shard = (a.handles + len(shards) - 1) // len(shards)
    for i, f in enumerate(files):
        size = sizes[i % len(shards)]
        f.seek((i // len(shards)) * (size // per_shard) // MIB * MIB)
    got = [0] * a.handles
    start_evt = threading.Event()
    deadline = [0.0]

    def run(i):
        start_evt.wait()
        f = files[i]
        while time.monotonic() < deadline[0]:
            b = f.read(MIB)
            if not b:
                f.seek(0)
                continue
            got[i] += len(b)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(a.handles)]
    for t in threads:
        t.start()
    start = time.monotonic()
    deadline[0] = start + a.secs
    start_evt.set()
    for t in threads:
        t.join()
    secs = time.monotonic() - start
    for f in files:
        f.close()
    n = sum(got)
    return {"bytes": n, "secs": round(secs, 4), "mib_per_s": round(n / secs / MIB, 2),
            "handles": a.handles, "idle_handles": sum(1 for g in got if g == 0)}


def loader_small(a):
    names = [
        os.path.join(a.root, "jpeg", f"d{d:03}", f"f{i:04}.jpg")
        for d in range(a.dirs)
        for i in range(a.per_dir)
    ]
    random.Random(a.seed).shuffle(names)
    return _run_workers(_small_worker, [(names[w :: a.workers],) for w in range(a.workers)], a.secs)


def meta(a):
    top = os.path.join(a.root, a.sub)
    state = {"entries": 0, "files": 0, "dirs": 0, "done": False, "error": None}

    def walk():
        try:
            for dirpath, dirnames, filenames in os.walk(top):
                state["dirs"] += 1
                state["entries"] += len(dirnames)
                for n in filenames:
                    os.stat(os.path.join(dirpath, n))
                    state["files"] += 1
                    state["entries"] += 1
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
            state["done"] = True
        except OSError as e:
            state["error"] = str(e)

    stop = threading.Event()
    start = time.monotonic()
    t = threading.Thread(target=walk, daemon=True)
    t.start()
    t.join(a.secs)
    stop.set()
    secs = time.monotonic() - start
    res = {
        "entries": state["entries"],
        "files": state["files"],
        "dirs": state["dirs"],
        "secs": round(secs, 4),
        "entries_per_s": round(state["entries"] / secs, 1),
        "complete": state["done"],
    }
    if state["error"]:
        res["error"] = state["error"]
    # A walker stuck inside a slow readdir cannot be joined: leave without it.
    print(json.dumps(res), flush=True)
    os._exit(0 if not state["error"] else 1)


def walk_tool(a):
    top = os.path.join(a.root, a.sub)
    cmd = {"find": ["find", top, "-type", "f"], "lsr": ["ls", "-lR", top]}[a.tool]
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    timer = threading.Timer(a.secs, p.kill)
    timer.start()
    files = dirs = 0
    for line in p.stdout:
        if a.tool == "find":
            files += 1
        elif line.startswith("-"):
            files += 1
        elif line.startswith("d"):
            dirs += 1
    rc = p.wait()
    timer.cancel()
    secs = time.monotonic() - start
    err = p.stderr.read().strip()
    res = {
        "entries": files + dirs,
        "files": files,
        "dirs": dirs,
        "secs": round(secs, 4),
        "entries_per_s": round((files + dirs) / secs, 1),
        "complete": rc == 0,
    }
    if rc not in (0, -9):
        res["error"] = f"{cmd[0]} exited {rc}: {err[-300:]}"
    return res


def stat_hot(a):
    top = os.path.join(a.root, a.sub)
    paths = []
    t0 = time.monotonic()
    for dirpath, _, filenames in os.walk(top):
        for n in filenames:
            p = os.path.join(dirpath, n)
            os.stat(p)
            paths.append(p)
            if len(paths) >= a.files:
                break
        if len(paths) >= a.files:
            break
    warm = time.monotonic() - t0
    counts = [0] * a.threads
    errors = []
    stop = threading.Event()
    start_evt = threading.Event()

    def worker(i):
        mine = paths[i::a.threads] or paths
        n = 0
        start_evt.wait()
        try:
            while not stop.is_set():
                for p in mine:
                    os.stat(p)
                n += len(mine)
                counts[i] = n
        except OSError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.threads)]
    for t in threads:
        t.start()
    start = time.monotonic()
    start_evt.set()
    time.sleep(a.secs)
    stop.set()
    for t in threads:
        t.join()
    secs = time.monotonic() - start
    stats = sum(counts)
    res = {
        "stats": stats,
        "files": len(paths),
        "threads": a.threads,
        "warm_secs": round(warm, 3),
        "secs": round(secs, 4),
        "stats_per_s": round(stats / secs, 1),
        "complete": not errors,
    }
    if errors:
        res["error"] = errors[0]
    return res


def evict(a):
    n = 0
    for top in a.paths:
        for dirpath, _, filenames in os.walk(top):
            for name in filenames:
                try:
                    fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                finally:
                    os.close(fd)
    return {"evicted_files": n}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("loader-tar")
    t.add_argument("--root", required=True)
    t.add_argument("--shards", required=True)
    t.add_argument("--workers", type=int, default=8)
    t.add_argument("--secs", type=float, default=8)
    hd = sub.add_parser("handles")
    hd.add_argument("--root", required=True)
    hd.add_argument("--shards", required=True)
    hd.add_argument("--handles", type=int, default=200)
    hd.add_argument("--secs", type=float, default=8)
    qp = sub.add_parser("quarters")
    qp.add_argument("--root", required=True)
    qp.add_argument("--shard", required=True)
    qp.add_argument("--workers", type=int, default=4)
    qp.add_argument("--shared", action="store_true")
    qp.add_argument("--secs", type=float, default=8)
    s = sub.add_parser("loader-small")
    s.add_argument("--root", required=True)
    s.add_argument("--dirs", type=int, required=True)
    s.add_argument("--per-dir", type=int, required=True)
    s.add_argument("--workers", type=int, default=8)
    s.add_argument("--secs", type=float, default=8)
    s.add_argument("--seed", type=int, default=1)
    m = sub.add_parser("meta")
    m.add_argument("--root", required=True)
    m.add_argument("--sub", required=True)
    m.add_argument("--secs", type=float, default=15)
    w = sub.add_parser("walk-tool")
    w.add_argument("--root", required=True)
    w.add_argument("--sub", required=True)
    w.add_argument("--tool", choices=["find", "lsr"], required=True)
    w.add_argument("--secs", type=float, default=15)
    h = sub.add_parser("stat-hot")
    h.add_argument("--root", required=True)
    h.add_argument("--sub", required=True)
    h.add_argument("--files", type=int, default=10000)
    h.add_argument("--threads", type=int, default=8)
    h.add_argument("--secs", type=float, default=5)
    e = sub.add_parser("evict")
    e.add_argument("paths", nargs="+")
    a = p.parse_args()
    fn = {"loader-tar": loader_tar, "handles": handles, "quarters": quarters, "loader-small": loader_small, "meta": meta, "walk-tool": walk_tool,
          "stat-hot": stat_hot, "evict": evict}[a.cmd]
    print(json.dumps(fn(a)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
