"""LMDB read and write speed of ``dataflow`` side by side with tensorpack 0.11.

    python -m benchmarks.formats              # full run (a few minutes on 2 cores)
    python -m benchmarks.formats --quick      # smoke run (smaller data, 1 repeat)
    python -m benchmarks.formats --workloads jpeg --repeats 5 --json formats.json

Workloads (each written once per system, then read; files under ``--dir``, removed at the end):

* ``jpeg``: 4,000 datapoints ``[uint8 array of ~150 KB, int label]``: the bytes of a JPEG file as
  tensorpack's ImageNet recipe stores them (random bytes here: LMDB does not look inside);
* ``tiny``: 200,000 datapoints ``[int, float32 array of 16]``.

Systems (each reads the LMDB it wrote itself):

* ``dataflow``: ``dataflow.LMDBSerializer`` (format "msgpack", the default);
* ``tensorpack-pickle``: tensorpack 0.11 with its default encoding (``TENSORPACK_SERIALIZE``
  unset = pickle);
* ``tensorpack-msgpack``: tensorpack 0.11 with ``TENSORPACK_SERIALIZE=msgpack``.

Measures, each run in a fresh subprocess (tensorpack reads its encoding once, at import), the
systems alternating run after run (the order rotates every repeat):

* ``read``: ``LMDBSerializer.load(path, shuffle=False)``, ``reset_state()``, one untimed pass
  (warm page cache), then ``--passes`` timed passes; the consumer touches one byte per 4 KiB page
  of every array of every datapoint;
* ``save``: ``LMDBSerializer.save(DataFromList(dps, shuffle=False), path)`` of datapoints built
  beforehand, timed to its return (files flushed, as both libraries do), into a fresh path.

Reported: datapoints/s (median, min-max over the repeats), GB/s of array bytes for reads, CPU
seconds per datapoint (process time, less sensitive to other load on the machine), and for each
tensorpack system the ratio dataflow / tensorpack, the median of the per-repeat ratios (each
repeat runs the two back to back).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SYSTEMS = {
    "dataflow": {},
    "tensorpack-pickle": {"TENSORPACK_SERIALIZE": "pickle"},
    "tensorpack-msgpack": {"TENSORPACK_SERIALIZE": "msgpack"},
}
WORKLOADS = {"jpeg": 4000, "tiny": 200_000}
QUICK = {"jpeg": 400, "tiny": 20_000}
PAGE = 4096


# -- the child: one measurement in this process ----------------------------------------------------
def make_datapoints(workload, n):
    import numpy as np
    rng = np.random.default_rng(0)
    if workload == "jpeg":
        sizes = rng.integers(148_000, 152_000, n)
        pool = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
        ends = np.cumsum(sizes)
        return [[pool[e - s:e], i % 1000] for i, (s, e) in enumerate(zip(sizes, ends))]
    return [[i, rng.random(16, dtype=np.float32)] for i in range(n)]


def _library(system):
    if system == "dataflow":
        import dataflow
        return dataflow.LMDBSerializer, dataflow.DataFromList
    from tensorpack.dataflow import DataFromList, LMDBSerializer
    return LMDBSerializer, DataFromList


def consume(df):
    """One pass; touches one byte per 4 KiB page of every array (summing them). Returns
    (datapoints, array bytes, the sum)."""
    import numpy as np
    n = nbytes = 0
    checksum = 0
    for dp in df:
        n += 1
        for c in dp:
            if isinstance(c, np.ndarray):
                m = memoryview(c)
                if not m.c_contiguous:
                    m = memoryview(np.ascontiguousarray(c))
                m = m.cast("B")
                checksum += sum(m[::PAGE])
                nbytes += m.nbytes
    return n, nbytes, checksum


def child(args):
    import logging
    logging.disable(logging.WARNING)
    serializer, from_list = _library(args.system)
    if args.measure == "save":
        dps = make_datapoints(args.workload, args.n)
        t0, c0 = time.perf_counter(), time.process_time()
        serializer.save(from_list(dps, shuffle=False), args.path)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"datapoints": len(dps), "wall_s": wall, "cpu_s": cpu, "bytes": 0}
    df = serializer.load(args.path, shuffle=False)
    df.reset_state()
    consume(df)                                   # warm the page cache (and mappings)
    n = nbytes = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.passes):
        a, b, _ = consume(df)
        n, nbytes = n + a, nbytes + b
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"datapoints": n, "wall_s": wall, "cpu_s": cpu, "bytes": nbytes}


# -- the parent: orchestration and report ----------------------------------------------------------
def run_child(system, measure, workload, n, path, passes, timeout):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("TENSORPACK_SERIALIZE", None)
    env.update(SYSTEMS[system])
    cmd = [sys.executable, "-m", "benchmarks.formats", "--child", measure, "--system", system,
           "--workload", workload, "--n", str(n), "--path", path, "--passes", str(passes)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{system} {measure} {workload} failed:\n{proc.stderr[-2000:]}")


def _remove(path):
    for p in (path, path + "-lock"):
        if os.path.exists(p):
            os.remove(p)


def _stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", default="jpeg,tiny")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--measures", default="read,save")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--passes", type=int, default=None,
                    help="timed read passes per run (default: jpeg 5, tiny 2)")
    ap.add_argument("--dir", default=None, help="where the LMDB files go (default: a temp dir)")
    ap.add_argument("--json", default="", help="write raw results here")
    ap.add_argument("--timeout", type=float, default=600)
    # child mode
    ap.add_argument("--child", choices=["read", "save"])
    ap.add_argument("--system")
    ap.add_argument("--workload")
    ap.add_argument("--n", type=int)
    ap.add_argument("--path")
    args = ap.parse_args(argv)
    if args.child:
        args.measure = args.child
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    workloads = args.workloads.split(",")
    systems = args.systems.split(",")
    measures = args.measures.split(",")
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = QUICK if args.quick else WORKLOADS
    base = tempfile.mkdtemp(prefix="dataflow-bench-formats-", dir=args.dir)
    results = []
    print(f"# LMDB formats benchmark, {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; repeats {repeats}", file=sys.stderr)
    try:
        for workload in workloads:
            n = sizes[workload]
            passes = args.passes or (5 if workload == "jpeg" else 2)
            files = {}
            for system in systems:               # each system writes the file it reads
                files[system] = os.path.join(base, f"{workload}-{system}.lmdb")
                run_child(system, "save", workload, n, files[system], 1, args.timeout)
            for r in range(repeats):
                order = systems[r % len(systems):] + systems[:r % len(systems)]
                for measure in measures:
                    for system in order:
                        if measure == "read":
                            path = files[system]
                        else:
                            path = os.path.join(base, f"save-{workload}-{system}-{r}.lmdb")
                        res = run_child(system, measure, workload, n, path, passes,
                                        args.timeout)
                        if measure == "save":
                            _remove(path)
                        res.update(workload=workload, system=system, measure=measure, repeat=r)
                        results.append(res)
                        print(f"  {workload} {measure} {system} repeat {r}: "
                              f"{res['datapoints'] / res['wall_s']:,.0f} datapoints/s",
                              file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(report(results, workloads, systems, measures), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def report(results, workloads, systems, measures):
    lines = ["| workload | measure | system | datapoints/s | GB/s | CPU µs/datapoint "
             "| dataflow / this |",
             "|---|---|---|---|---|---|---|"]
    for workload in workloads:
        for measure in measures:
            rows = {s: [r for r in results if r["workload"] == workload and
                        r["measure"] == measure and r["system"] == s] for s in systems}
            for system in systems:
                rs = rows[system]
                if not rs:
                    continue
                rate = _stats([r["datapoints"] / r["wall_s"] for r in rs])
                gbs = _stats([r["bytes"] / r["wall_s"] / 1e9 for r in rs])
                cpu = _stats([r["cpu_s"] / r["datapoints"] * 1e6 for r in rs])
                ratio = "—"
                if system != "dataflow" and rows.get("dataflow"):
                    mine = {r["repeat"]: r["datapoints"] / r["wall_s"] for r in rows["dataflow"]}
                    per = [mine[r["repeat"]] / (r["datapoints"] / r["wall_s"]) for r in rs
                           if r["repeat"] in mine]
                    if per:
                        st = _stats(per)
                        ratio = f"**{st['median']:.2f}x** ({st['min']:.2f}–{st['max']:.2f})"
                gb = f"{gbs['median']:.2f}" if measure == "read" and gbs["median"] else "—"
                lines.append(
                    f"| {workload} | {measure} | {system} | {rate['median']:,.0f} "
                    f"({rate['min']:,.0f}–{rate['max']:,.0f}) | {gb} | {cpu['median']:.1f} "
                    f"| {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
