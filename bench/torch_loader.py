#!/usr/bin/env python3
"""A real PyTorch DataLoader over small files, for the `torch` suite (bench/torch_bench.py).

Runs with the venv of bench/torch/setup.sh (torch, numpy). Two variants:

  files: a map-style Dataset of the files under ROOT (ImageFolder-style index:
         os.scandir of ROOT, then of each class directory, sorted), each item
         the file's bytes read with open(path, 'rb').read(); DataLoader with
         num_workers=4, shuffle=True, batch_size=64.
  tar:   the same samples packed into tar shards (WebDataset-style), read by an
         IterableDataset whose 4 workers split the shards (worker w of W takes
         shards w, w+W, ...; shard order reshuffled every epoch) and stream each
         with tarfile (mode 'r|', as WebDataset does); batch_size=64.

Every item returns (sample index, length, CRC32 of the bytes); the main process
checks each batch against the manifest (size and CRC of every sample), and at
the end of each epoch that every sample came exactly once.

Protocol with the driver (so it can drop caches and take counters between
epochs): after the index is built, and after each epoch, a JSON line goes to
stdout; before each epoch the loader waits for a line `go` on stdin (with
--no-wait it starts right away). The last line is a JSON summary.
"""

import argparse
import json
import os
import random
import sys
import tarfile
import time
import warnings
import zlib

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

# 4 workers on a 2-core machine are the suite's setting (the brief of a training job), not a mistake.
warnings.filterwarnings("ignore", message="This DataLoader will create")


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def load_manifest(path):
    """{rel path: (index, size, crc32)} and the list of rel paths, in index order."""
    with open(path) as f:
        m = json.load(f)
    names = [s["name"] for s in m["samples"]]
    info = {s["name"]: (i, s["size"], s["crc32"]) for i, s in enumerate(m["samples"])}
    return m, names, info


def scan_tree(root):
    """ImageFolder-style index: the class directories of ROOT, then their files, sorted."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for c in classes:
        out += sorted(f"{c}/{e.name}" for e in os.scandir(os.path.join(root, c)) if e.is_file())
    return out


class FileDataset(Dataset):
    def __init__(self, root, names, index_of):
        self.root, self.names, self.index_of = root, names, index_of

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        name = self.names[i]
        with open(os.path.join(self.root, name), "rb") as f:
            data = f.read()
        return self.index_of[name], len(data), zlib.crc32(data)


class TarShards(IterableDataset):
    """WebDataset-style: each worker streams its share of the shards."""

    def __init__(self, root, shards, index_of, seed):
        super().__init__()
        self.root, self.shards, self.index_of, self.seed = root, list(shards), index_of, seed
        self.epoch = 0

    def __iter__(self):
        wi = get_worker_info()
        wid, nw = (wi.id, wi.num_workers) if wi else (0, 1)
        order = list(self.shards)
        random.Random(self.seed * 1000 + self.epoch).shuffle(order)  # same order in every worker
        for shard in order[wid::nw]:
            with open(os.path.join(self.root, shard), "rb") as f, tarfile.open(fileobj=f, mode="r|") as tf:
                for member in tf:
                    if not member.isfile():
                        continue
                    data = tf.extractfile(member).read()
                    yield self.index_of.get(member.name, -1), len(data), zlib.crc32(data)


def run_epoch(loader, info_by_index, n_expected):
    seen = bytearray(n_expected)
    nbytes = 0
    bad = 0
    t = time.monotonic()
    for idx, size, crc in loader:
        for i, s, c in zip(idx.tolist(), size.tolist(), crc.tolist()):
            if i < 0 or i >= n_expected:
                bad += 1
                continue
            _, want_size, want_crc = info_by_index[i]
            if s != want_size or c != want_crc:
                bad += 1
            if seen[i]:
                bad += 1  # a sample twice
            seen[i] = 1
            nbytes += s
    secs = time.monotonic() - t
    missing = n_expected - sum(seen)
    return {"secs": secs, "files": sum(seen), "bytes": nbytes, "bad": bad, "missing": missing,
            "files_per_s": sum(seen) / secs if secs else 0.0, "ok": bad == 0 and missing == 0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", choices=["files", "tar"])
    p.add_argument("--root", required=True, help="files: the directory of class dirs; tar: the directory of shards")
    p.add_argument("--manifest", required=True, help="manifest.json of the data set (bench/torch_bench.py gen)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--index", choices=["scan", "manifest"], default="scan",
                   help="files: build the file list by scanning ROOT (default, as ImageFolder) or from the manifest")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-wait", action="store_true", help="do not wait for `go` on stdin before each epoch")
    a = p.parse_args()

    torch.manual_seed(a.seed)
    m, names, info = load_manifest(a.manifest)
    info_by_index = [info[n] for n in names]
    index_of = {n: v[0] for n, v in info.items()}

    t = time.monotonic()
    if a.variant == "files":
        listed = scan_tree(a.root) if a.index == "scan" else list(names)
        if set(listed) != set(names):
            extra, lack = set(listed) - set(names), set(names) - set(listed)
            emit({"error": f"index of {a.root} differs from the manifest: {len(extra)} extra, {len(lack)} missing"})
            return 1
        ds = FileDataset(a.root, listed, index_of)
        g = torch.Generator()
        g.manual_seed(a.seed)
        loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers, generator=g)
    else:
        shards = m["shards"]
        ds = TarShards(a.root, shards, index_of, a.seed)
        loader = DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers)
    index_secs = time.monotonic() - t
    emit({"phase": "index", "secs": index_secs, "samples": len(names)})

    epochs = []
    for e in range(1, a.epochs + 1):
        if not a.no_wait:
            line = sys.stdin.readline()
            if line.strip() != "go":
                emit({"error": f"expected `go` before epoch {e}, got {line!r}"})
                return 1
        if isinstance(ds, TarShards):
            ds.epoch = e
        r = run_epoch(loader, info_by_index, len(names))
        r["phase"] = f"epoch{e}"
        emit(r)
        epochs.append(r)
    emit({"variant": a.variant, "index_secs": index_secs, "epochs": epochs,
          "ok": all(r["ok"] for r in epochs), "torch": torch.__version__})
    return 0 if all(r["ok"] for r in epochs) else 2


if __name__ == "__main__":
    sys.exit(main())
