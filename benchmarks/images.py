"""Image pipelines side by side: dataflow, tensorpack 0.11 and torch's DataLoader.

``python -m benchmarks.images [--workloads fbresnet,img] [--repeats 5] [--quick]``

Workloads (``shared/benchmark-workloads.md``):

* ``fbresnet``: 512 in-memory JPEGs of random size 300-500 px (quality 90), ``cv2.imdecode(...,
  IMREAD_COLOR)`` then ``AugmentorList(fbresnet_augmentor(True))`` (tensorpack's ImageNet
  training augmentation), ``BatchData(32)``, 2 workers. The same map function in every system,
  each with its library's ``imgaug``. Goals: dataflow through the run-in-thread table >= 1.3x
  tensorpack's better parallel mapper, and >= 1.8x dataflow's serial ``MapData``. Two
  control rows: two serial runs at once in two processes, whose summed rate over one run's is
  what two workers could gain on the machine at the time (about 2 on an idle 2-core machine; on
  a loaded one, judge the parallel/serial ratio against it); and the standard library's
  ``ThreadPoolExecutor(2).map`` over the same function, which is what two plain threads gain
  (the ceiling for any thread pool, since the GIL changes hands between the function's calls).
* ``img``: 256 in-memory 256x320 JPEGs, decode -> random crop 224 -> flip -> normalize -> CHW,
  ``BatchData(32)``, 2 workers (the pipeline of ``benchmarks.workloads``). Goals: the table's
  choice >= 1.3x tensorpack's ``MultiThreadMapData`` and >= 1.3x torch's ``DataLoader(batch 32,
  num_workers=2)`` (collated in its workers).

Every run is a fresh Python process (so no run inherits another's threads, pools or caches),
systems alternate run by run (A B C A B C ...), and each ratio is taken pair by pair (repeat r
of one system against repeat r of the other), then its median and range are reported. A run
times the batches after the first one (the first batch is startup): for ``fbresnet`` the rest of
one pass of ``RepeatedData(ds, 3)`` over the 512 JPEGs (1504 images; one pass, because
tensorpack's strict process mapper hangs at a pass boundary; three times the JPEGs, because in a
pass of 480 the parallel mappers' start and drain, a chunk or so per worker, weighed 5-10 %),
for ``img`` 1024 images over several passes. The consumer reads one byte per page of every array.
"""
import argparse
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

FB_N, FB_QUALITY, FB_SEED = 512, 90, 2026
FB_REPEAT = 3           # the JPEGs go through each timed pass this many times
BATCH = 32
IMG_IMAGES = 1024

SYSTEMS = {
    "fbresnet": ["dataflow-serial", "dataflow-table", "tensorpack-threads",
                 "tensorpack-processes", "tensorpack-serial", "2x-dataflow-serial",
                 "threadpool"],
    "img": ["dataflow-table", "tensorpack-threads", "torch"],
}
DESCRIPTIONS = {
    ("fbresnet", "dataflow-serial"): "MapData(ds, f) (serial)",
    ("fbresnet", "dataflow-table"):
        "MapData(ds, [Lambda(native(imdecode)), ops.Augment(augs, copy=False)], "
        "num_parallel_workers=2, python_multiprocessing=True)",
    ("fbresnet", "tensorpack-threads"):
        "tensorpack MultiThreadMapData(ds, 2, f, buffer_size=200, strict=True)",
    ("fbresnet", "tensorpack-processes"):
        "tensorpack MultiProcessMapDataZMQ(ds, 2, f, buffer_size=200, strict=True)",
    ("fbresnet", "tensorpack-serial"): "tensorpack MapData(ds, f) (serial)",
    ("fbresnet", "2x-dataflow-serial"):
        "control: two MapData(ds, f) (serial) processes at once, their rates summed",
    ("fbresnet", "threadpool"):
        "control: ThreadPoolExecutor(2).map(f, ds) (OpenCV at 1 thread, as in the table's "
        "workers), batched by np.stack",
    ("img", "dataflow-table"):
        "MapData(ds, [Decode, RandomCrop, RandomHorizontalFlip, Normalize, HWC2CHW], "
        "num_parallel_workers=2, python_multiprocessing=True)",
    ("img", "tensorpack-threads"):
        "tensorpack MultiThreadMapData(ds, 2, f, buffer_size=200, strict=True) (Pillow/numpy)",
    ("img", "torch"): "torch DataLoader(ds, batch_size=32, num_workers=2) (Pillow/numpy)",
}
# Controls, printed after the goals, each against our serial run: two copies of our serial run
# at once, in two processes (nothing shared): what two workers could gain on this machine
# during the run (on a loaded machine it is far below 2, and a "parallel / serial" goal cannot
# be judged there); and the standard library's thread pool over the same function: what two
# threads of this function gain on this machine, with no dataflow involved (the GIL changes
# hands between the function's OpenCV and numpy calls, and on a VM whose idle vCPUs halt, each
# hand-over to a sleeping thread costs a vCPU wake-up).
CONTROLS = {
    "fbresnet": [("2x-dataflow-serial", "dataflow-serial", "what 2 workers could gain on the "
                  "machine during this run"),
                 ("threadpool", "dataflow-serial", "what 2 plain threads of f gain")],
    "img": [],
}
GOALS = {
    "fbresnet": [("dataflow-table", ("tensorpack-threads", "tensorpack-processes"), 1.3),
                 ("dataflow-table", ("dataflow-serial",), 1.8)],
    "img": [("dataflow-table", ("tensorpack-threads",), 1.3),
            ("dataflow-table", ("torch",), 1.3)],
}


# -- the fbresnet pipeline, written once for either library's imgaug -------------------------
# (the augmentor list is examples/imagenet_pipeline.py's, through benchmarks/fbresnet.py)

def imdecode_bgr(buf):
    import cv2
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)


def make_fbresnet_map(imgaug):
    """The map function of workload fbresnet: decode, then the augmentor list."""
    import cv2
    from .fbresnet import fbresnet_augmentor
    augs = imgaug.AugmentorList(fbresnet_augmentor(imgaug))

    def fbresnet_map(dp):
        return [augs.augment(cv2.imdecode(dp[0], cv2.IMREAD_COLOR)), dp[1]]
    return fbresnet_map


def fbresnet_source():
    """512 ``[uint8 array of JPEG bytes, label]``: random 300-500 px, quality 90, fixed seed."""
    from .decoders import make_jpegs
    return [[np.frombuffer(b, np.uint8), k % 1000]
            for k, b in enumerate(make_jpegs(FB_N, seed=FB_SEED, quality=FB_QUALITY))]


# -- one run, in its own process ------------------------------------------------------------------

def _batches_of_passes(df):
    while True:
        yield from df


class _ThreadPoolBatches:
    """The control ``threadpool``: ``concurrent.futures.ThreadPoolExecutor(2).map(f, ...)``
    over one pass of ``FB_REPEAT`` times ``source``, in order, stacked into batches of
    ``BATCH`` by the consumer. OpenCV runs one thread per worker, as in the table's pool."""

    def __init__(self, source, f):
        import concurrent.futures
        import cv2
        self._cv2, self._cv_threads = cv2, cv2.getNumThreads()
        cv2.setNumThreads(1)
        self._pool = concurrent.futures.ThreadPoolExecutor(2)
        self._results = self._pool.map(f, [dp for _ in range(FB_REPEAT) for dp in source])

    def __iter__(self):
        return self

    def __next__(self):
        dps = [next(self._results) for _ in range(BATCH)]
        return [np.stack([dp[0] for dp in dps]), np.asarray([dp[1] for dp in dps])]

    def close(self):
        self._pool.shutdown(cancel_futures=True)
        self._cv2.setNumThreads(self._cv_threads)


def _open(workload, system, source):
    """(the stream of batches, an object to close or None, the mapper's executor)."""
    family = system.split("-")[0]
    if workload == "fbresnet" and system == "threadpool":
        import dataflow as m
        batches = _ThreadPoolBatches(source, make_fbresnet_map(m.imgaug))
        return batches, batches, "2 threads"
    if workload == "fbresnet":
        if family == "dataflow":
            import dataflow as m
            ds = m.RepeatedData(m.DataFromList(source, shuffle=False), FB_REPEAT)
            if system == "dataflow-serial":
                mapped = m.MapData(ds, make_fbresnet_map(m.imgaug))
            else:
                from .fbresnet import fbresnet_augmentor
                ops = [m.ops.Lambda(m.native(imdecode_bgr), index=0),
                       m.ops.Augment(fbresnet_augmentor(m.imgaug), index=0, copy=False)]
                mapped = m.MapData(ds, ops, num_parallel_workers=2, python_multiprocessing=True)
            df = m.BatchData(mapped, BATCH)
            df.reset_state()
            return iter(df), mapped, mapped.executor
        from tensorpack import dataflow as tp
        f = make_fbresnet_map(tp.imgaug)
        ds = tp.RepeatedData(tp.DataFromList(source, shuffle=False), FB_REPEAT)
        if system == "tensorpack-serial":
            mapped = tp.MapData(ds, f)
        elif system == "tensorpack-threads":
            mapped = tp.MultiThreadMapData(ds, 2, f, buffer_size=200, strict=True)
        else:
            mapped = tp.MultiProcessMapDataZMQ(ds, 2, f, buffer_size=200, strict=True)
        df = tp.BatchData(mapped, BATCH)
        df.reset_state()
        return iter(df), None, system.split("-")[1]
    from .workloads import img_ops, img_pipeline_numpy
    if family == "dataflow":
        import dataflow as m
        mapped = m.MapData(m.DataFromList(source, shuffle=False), img_ops(m),
                           num_parallel_workers=2, python_multiprocessing=True)
        df = m.BatchData(mapped, BATCH)
        df.reset_state()
        return _batches_of_passes(df), mapped, mapped.executor
    if family == "tensorpack":
        from tensorpack import dataflow as tp
        mapped = tp.MultiThreadMapData(tp.DataFromList(source, shuffle=False), 2,
                                       img_pipeline_numpy, buffer_size=200, strict=True)
        df = tp.BatchData(mapped, BATCH)
        df.reset_state()
        return _batches_of_passes(df), None, "threads"
    import torch.utils.data
    from ._torch_dataset import MapStyleDataset
    dataset = MapStyleDataset(source, img_pipeline_numpy, IMG_IMAGES + 2 * BATCH)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2)
    return iter(loader), None, "processes, collated in workers"


def run_one(workload, system, data_path):
    from .workloads import consume
    with open(data_path, "rb") as f:
        source = pickle.load(f)
    t0 = time.perf_counter()
    stream, closer, executor = _open(workload, system, source)
    consume(next(stream))
    startup = time.perf_counter() - t0
    images = FB_N * FB_REPEAT - BATCH if workload == "fbresnet" else IMG_IMAGES
    t0 = time.perf_counter()
    n = 0
    while n < images:
        batch = next(stream)
        consume(batch)
        n += len(batch[1])
    rate = n / (time.perf_counter() - t0)
    if closer is not None:
        closer.close()
    return {"rate": rate, "startup_s": startup, "executor": executor, "images": n}


# -- the driver -----------------------------------------------------------------------------------

def _write_sources(tmpdir, workloads):
    paths = {}
    for w in workloads:
        if w == "fbresnet":
            source = fbresnet_source()
        else:
            from .workloads import jpeg_source
            source = jpeg_source()
        paths[w] = os.path.join(tmpdir, f"{w}.pkl")
        with open(paths[w], "wb") as f:
            pickle.dump(source, f)
    return paths


def _spawn(workload, system, path, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "benchmarks.images", "--run", workload, system, path]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout} s"}
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]}
    return json.loads(lines[-1])


def _spawn_copies(workload, system, path, timeout, copies=2):
    """``copies`` runs of ``system`` at once, in separate processes: their rates summed."""
    import threading
    out = [None] * copies

    def one(i):
        out[i] = _spawn(workload, system, path, timeout)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in out if "rate" not in r]
    if bad:
        return bad[0]
    return {"rate": sum(r["rate"] for r in out), "executor": f"{copies} processes",
            "startup_s": max(r["startup_s"] for r in out), "images": sum(r["images"] for r in out)}


def _fmt(values):
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _ratio_fmt(rs):
    return f"**{statistics.median(rs):.2f}x** ({min(rs):.2f}-{max(rs):.2f})"


def report(workload, results, repeats):
    print(f"\n### workload `{workload}` ({repeats} alternating runs per system)\n")
    print("| system | images/s median (min-max) | startup ms | runs in |")
    print("|---|---|---|---|")
    for s in SYSTEMS[workload]:
        ok = [r for r in results[s] if "rate" in r]
        if not ok:
            errs = "; ".join(sorted({r["error"] for r in results[s]}))
            print(f"| {DESCRIPTIONS[(workload, s)]} | failed: {errs} | | |")
            continue
        start = statistics.median(r["startup_s"] for r in ok) * 1000
        print(f"| {DESCRIPTIONS[(workload, s)]} | {_fmt([r['rate'] for r in ok])} | "
              f"{start:.0f} | {ok[0]['executor']} |")
    print("\nPair by pair (repeat r against repeat r):\n")
    for ours, peers, goal in GOALS[workload]:
        for peer in peers:
            rs = [a["rate"] / b["rate"] for a, b in zip(results[ours], results[peer])
                  if "rate" in a and "rate" in b]
            if rs:
                met = "met" if statistics.median(rs) >= goal else "MISSED"
                print(f"- {ours} / {peer}: {_ratio_fmt(rs)}; goal >= {goal}x: {met}")
        if len(peers) > 1:      # against the better of the peers, run by run
            rs = []
            for k in range(repeats):
                a = results[ours][k]
                bs = [results[p][k] for p in peers]
                if "rate" in a and all("rate" in b for b in bs):
                    rs.append(a["rate"] / max(b["rate"] for b in bs))
            if rs:
                met = "met" if statistics.median(rs) >= goal else "MISSED"
                print(f"- {ours} / the better of {', '.join(peers)}: {_ratio_fmt(rs)}; "
                      f"goal >= {goal}x: {met}")
    for a_name, b_name, what in CONTROLS[workload]:
        rs = [a["rate"] / b["rate"] for a, b in zip(results[a_name], results[b_name])
              if "rate" in a and "rate" in b]
        if rs:
            print(f"- control ({what}): {a_name} / {b_name}: {_ratio_fmt(rs)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="fbresnet,img")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="2 repeats: a smoke run")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--json", default="", help="write the raw results here")
    p.add_argument("--run", nargs=3, metavar=("WORKLOAD", "SYSTEM", "DATA"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(*args.run)))
        return
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in SYSTEMS:
            p.error(f"unknown workload {w!r}; choose from {sorted(SYSTEMS)}")
    repeats = 2 if args.quick else args.repeats
    print(f"# benchmarks.images, {time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    raw = {}
    with tempfile.TemporaryDirectory(prefix="dataflow-bench-images-") as tmp:
        paths = _write_sources(tmp, workloads)
        for w in workloads:
            results = {s: [] for s in SYSTEMS[w]}
            for k in range(repeats):
                for s in SYSTEMS[w]:
                    if s.startswith("2x-"):
                        r = _spawn_copies(w, s[3:], paths[w], args.timeout)
                    else:
                        r = _spawn(w, s, paths[w], args.timeout)
                    results[s].append(r)
                    shown = f"{r['rate']:,.0f} images/s" if "rate" in r else r["error"]
                    print(f"# {w} run {k + 1}/{repeats} {s}: {shown}", file=sys.stderr,
                          flush=True)
            raw[w] = results
            report(w, results, repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
