"""``python -m benchmarks``: the reference workloads side by side through dataflow and its peers.

The harness process only schedules and reports; each measurement runs in a fresh child forked from
a per-family fork server (zygote.py), under a time limit, so that a peer that hangs or crashes is
reported as such and the harness goes on.
"""
import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from . import report
from .server import ROOT, Server, ServerDied
from .systems import BATCHING, FAMILIES, SYSTEMS, applies, description, workers_of

# Workload labels, without importing numpy here (workloads.py does). Ids: ints 1-5, then strings.
WORKLOAD_LABELS = {1: "tiny (identity)", 2: "150 KB image", 3: "4 MiB array",
                   4: "pure Python ~1 ms", 5: "BLAS ~1 ms",
                   "img": "JPEG pipeline, batch 32",
                   "fbresnet": "fbresnet augmentation, batch 32",
                   "lmdb": "LMDB read, 150 KB records", "lmdb-tiny": "LMDB read, tiny records"}
# What `python -m benchmarks` runs without --workloads (a full run stays under ~10 minutes on 2
# cores); "all" adds fbresnet and the LMDB workloads (each about as long as img again).
DEFAULT_WORKLOADS = "1,2,3,4,5,img"
# Datapoints measured after the first one: (full, quick). Chosen so that runs measure steady state
# (the slowest peer takes ~1-3 s per run in a full run, torch up to ~9 s on workload 2; ~0.1-0.3 s
# in --quick, on 2 cores) and stay within one pass over the 10,000 source datapoints: tensorpack's
# strict MultiProcessMapDataZMQ hangs at a pass boundary. (The harness passes the count to each run.)
# For "img" the count is of images after the first batch, a multiple of the batch size (32).
# fbresnet: the 480 images of its one pass after the first batch (quick: 64). The LMDB workloads
# read their files (LMDB_RECORDS records, the reference's sizes) over and over: lmdb 30,000
# records, lmdb-tiny 120,000, about 0.6 s for the fastest systems (6,000 made windows of
# 0.1-0.25 s, and paired runs of one system then ranged over 2-3x on the shared 2-core VM).
COUNTS = {1: (30000, 3000), 2: (9000, 1200), 3: (600, 80), 4: (2000, 250), 5: (2000, 250),
          "img": (1024, 128), "fbresnet": (480, 64), "lmdb": (30000, 500),
          "lmdb-tiny": (120000, 5000)}
# Records in the LMDB files (shared/benchmark-workloads.md: 4,000 of ~150 KB, 200,000 tiny;
# 0.6 GB and 29 MB, written in about 3 s).
LMDB_RECORDS = {"lmdb": 4000, "lmdb-tiny": 200000}
PREPARE_TIMEOUT = 300.0  # writing the data of the run

# The measured window also ends after this many seconds (full, quick): the slowest peers (SPDL on
# the tiny workloads, ~1,000 dp/s) would otherwise take half a minute per run. Throughput is
# then the items received over the window's time.
MAX_MEASURE_S = (3.0, 0.4)
# ... and lasts at least this many seconds (full, quick), going on past the count where that
# comes first: the fast serial loaders read COUNTS of workloads 1 and 2 in 30-90 ms, a window
# too short to average out a shared machine's noise (same-minute runs of one loader varied
# 100-180k dp/s). The same rule for every system; it adds ~30 s to a full run of all workloads.
# Workloads in ONE_PASS never go past their count (one pass over a fixed source).
MIN_MEASURE_S = (0.5, 0.0)
# The workloads whose measured window stays within the count: their source is one pass
# (fbresnet's 512 images; the LMDB workloads' record indices, the count and a margin, see
# workloads.LMDB_MARGIN) and tensorpack's strict process mapper may hang at a pass boundary. The
# others may read up to
# EXTEND_LIMIT times their count to fill MIN_MEASURE_S (the sources cycle pass after pass).
ONE_PASS = ("fbresnet", "lmdb", "lmdb-tiny")
EXTEND_LIMIT = 64


def count_limit(workload, quick=False):
    """The most datapoints a run of ``workload`` may measure (it sizes the sources' passes)."""
    count = COUNTS[workload][1 if quick else 0]
    return count if workload in ONE_PASS or not MIN_MEASURE_S[1 if quick else 0] \
        else count * EXTEND_LIMIT
# Limits per run: (full, quick) seconds.
RUN_TIMEOUT = (40.0, 10.0)        # from the command to the result; past it the run is "hung"
TEARDOWN_CAP = (15.0, 1.5)        # teardown longer than this is killed and shown as "≥cap"
EXIT_GRACE = (10.0, 3.0)          # from the result to the child's exit
READY_TIMEOUT = 180.0             # importing a family in its fork server


def _parse_ids(text, valid, what):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part not in valid:
            raise SystemExit("unknown %s %r; choose from: %s" % (what, part, ", ".join(valid)))
        if part not in out:
            out.append(part)
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run the reference workloads (described in benchmarks/README.md) through "
                    "dataflow and its peers, alternating systems run by run; print a Markdown "
                    "table.")
    p.add_argument("--quick", action="store_true",
                   help="short runs (~0.1-0.3 s each; the default set with every peer takes ~6 "
                        "minutes on 2 busy cores, most of it the peers' process startups)")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                   help="comma-separated ids: 1-5, img, fbresnet, lmdb, lmdb-tiny, or 'all' "
                        "(default: %(default)s)")
    p.add_argument("--systems", default="all",
                   help="comma-separated systems or families (%s) or 'all'; systems: %s"
                        % (", ".join(FAMILIES), ", ".join(SYSTEMS)))
    p.add_argument("--repeats", type=int, default=3, help="runs per system and workload (>= 3 "
                   "for reportable figures; default 3)")
    p.add_argument("--json", default="bench-results.json", metavar="PATH",
                   help="raw results (default: %(default)s; '' to skip)")
    p.add_argument("--png", default="bench-results.png", metavar="PATH",
                   help="bar chart of the ratios, needs matplotlib (default: %(default)s; '' to "
                        "skip)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before a run counts as hung (default: %.0f, quick %.0f)"
                        % RUN_TIMEOUT)
    p.add_argument("--workers", default="2", metavar="N[,N...]",
                   help="worker count of every parallel system (default 2); several, e.g. "
                        "2,4,8,16, run each parallel system at each count and add a scaling "
                        "table (throughput over serial, per library); the first count is the "
                        "one of the main table")
    p.add_argument("--dataflow-module", default="dataflow", metavar="MODULE",
                   help="module benchmarked as 'dataflow' (default: %(default)s); e.g. "
                        "tensorpack.dataflow to check the harness itself")
    args = p.parse_args(argv)
    try:
        args.workers = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        p.error("--workers takes comma-separated integers, e.g. 2,4,8,16")
    if not args.workers or min(args.workers) < 1:
        p.error("--workers: counts must be >= 1")
    args.workers = list(dict.fromkeys(args.workers))
    ids = _parse_ids(args.workloads, ["all"] + [str(w) for w in WORKLOAD_LABELS], "workload")
    if "all" in ids:
        ids = [str(w) for w in WORKLOAD_LABELS]
    args.workloads = [int(w) if w.isdigit() else w for w in ids]
    names = []
    for part in _parse_ids(args.systems, ["all"] + list(FAMILIES) + list(SYSTEMS), "system"):
        if part == "all":
            names.extend(SYSTEMS)
        elif part in FAMILIES:
            names.extend(s for s, spec in SYSTEMS.items() if spec[0] == part)
        else:
            names.append(part)
    # canonical order; a system that exists only for other workloads (dataflow-table) is dropped
    args.systems = [s for s in SYSTEMS
                    if s in names and any(applies(s, w) for w in args.workloads)]
    if not args.systems:
        p.error("none of the selected systems runs the selected workloads (dataflow-table runs "
                "only workloads img and fbresnet)")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.timeout is not None and not args.timeout > 0:
        p.error("--timeout must be a number of seconds > 0")
    return args


# -------------------------------------------------------------------------------- progress
class Progress:
    def __init__(self, total):
        self.total = total
        self.done = 0
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
            print("(tqdm not importable: plain progress lines)", file=sys.stderr)
        else:
            self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)

    def step(self, text):
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        else:
            print("[%*d/%d] %s" % (len(str(self.total)), self.done, self.total, text),
                  file=sys.stderr, flush=True)

    def write(self, text):
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# -------------------------------------------------------------------------------- setup notes
def environment_notes(previous_pins):
    notes = []
    changed = {k: v for k, v in (previous_pins or {}).items() if v not in (None, "1")}
    notes.append("BLAS pinned to one thread: OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=MKL_NUM_THREADS=1"
                 + (" (overriding %s)" % ", ".join("%s=%s" % kv for kv in changed.items())
                    if changed else ""))
    odd = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if odd:
        notes.append("NOTE: %s set in the environment: OpenBLAS then uses an older kernel, which "
                     "slows numpy's BLAS (workload 5). Left as is; unset both in the "
                     "benchmark's own command to measure the machine's native kernel."
                     % ", ".join("%s=%s" % kv for kv in odd.items()))
    return notes


def blas_notes(servers):
    notes = []
    for server in servers.values():
        if server.ready is None:
            continue
        blas = server.ready.get("blas")
        if blas is None:
            notes.append("threadpoolctl not importable: cannot confirm the BLAS thread count "
                         "(pip install threadpoolctl)")
        else:
            libs = ["%s %s (%s, %s threads)" % (b.get("internal_api"), b.get("version"),
                                                b.get("architecture"), b.get("num_threads"))
                    for b in blas if "error" not in b]
            notes.append("BLAS/OpenMP seen by threadpoolctl in the %s fork server: %s"
                         % (server.family, "; ".join(libs) or "none loaded"))
            wrong = [b for b in blas if b.get("num_threads") not in (None, 1)]
            if wrong:
                notes.append("NOTE: threadpoolctl shows more than one thread for %s despite the "
                             "pins: workload 5 is not measured as defined"
                             % ", ".join(str(b.get("internal_api")) for b in wrong))
        break     # numpy is the same in every family; torch's own pools do not matter here
    return notes


# -------------------------------------------------------------------------------- the run's data
# workloads.DATA_DIR_ENV (not imported here: workloads.py imports numpy).
DATA_DIR_ENV = "DATAFLOW_BENCH_DATA_DIR"
LMDB_WORKLOADS = ("lmdb", "lmdb-tiny")


@contextlib.contextmanager
def prepared_data(args):
    """Write the data the selected workloads read (the LMDB files; the fbresnet JPEGs, so that
    the fork servers load them instead of each encoding them) into a temporary directory, named
    to the fork servers by $DATAFLOW_BENCH_DATA_DIR; yields notes for the report. The directory
    is removed on the way out, error or not."""
    items = ["%s=%d" % (w, LMDB_RECORDS[w]) for w in args.workloads if w in LMDB_WORKLOADS]
    if "fbresnet" in args.workloads:
        items.append("fbresnet")
    if not items:
        yield []
        return
    saved = {k: os.environ.get(k) for k in (DATA_DIR_ENV, "TENSORPACK_SERIALIZE")}
    tmp = tempfile.mkdtemp(prefix="dataflow-bench-data-")
    notes = []
    try:
        os.environ[DATA_DIR_ENV] = tmp
        if any(w in LMDB_WORKLOADS for w in args.workloads):
            # tensorpack reads its encoding once, at import: its fork server must see this.
            os.environ["TENSORPACK_SERIALIZE"] = "msgpack"
            notes.append("TENSORPACK_SERIALIZE=msgpack for tensorpack's fork server, so that its "
                         "LMDBSerializer reads the msgpack LMDB that dataflow wrote (its parallel "
                         "mappers pickle whatever this says)")
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        t0 = time.monotonic()
        print("(writing the data of %s into %s ...)" % (", ".join(items), tmp), file=sys.stderr,
              flush=True)
        try:
            r = subprocess.run([sys.executable, "-m", "benchmarks.workloads", "prepare", tmp,
                                ",".join(items)], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=PREPARE_TIMEOUT)
            failed = r.returncode != 0 and ((r.stderr or "").strip().splitlines()
                                            or ["exit code %d" % r.returncode])[-1]
        except subprocess.TimeoutExpired:
            failed = "no result within %.0f s" % PREPARE_TIMEOUT
        if failed:
            notes.append("NOTE: writing the data of %s failed (%s): the workloads that need it "
                         "are skipped" % (", ".join(items), failed))
        else:
            notes.append("data of %s written in %.1f s into a temporary directory (removed at the "
                         "end): LMDB files by dataflow.LMDBSerializer.save (format msgpack)"
                         % (", ".join(items), time.monotonic() - t0))
        yield notes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -------------------------------------------------------------------------------- main
def main(argv=None, previous_pins=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with prepared_data(args) as data_notes:
        return _main(args, previous_pins, data_notes)


def _main(args, previous_pins, data_notes):
    q = 1 if args.quick else 0
    timeout = args.timeout or RUN_TIMEOUT[q]
    teardown_cap, exit_grace = TEARDOWN_CAP[q], EXIT_GRACE[q]
    t_start = time.monotonic()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")

    notes = environment_notes(previous_pins) + data_notes
    print("# dataflow benchmarks (%s)\n" % ("quick" if args.quick else "full"))
    print("%s, Python %s, %d CPUs; repeats: %d; workloads: %s" % (
        platform.platform(), platform.python_version(), os.cpu_count() or 0, args.repeats,
        ",".join(map(str, args.workloads))))
    load = _loadavg()
    if load:
        notes.append("load average at start: %.2f %.2f %.2f (1/5/15 min)%s" % (
            load + (" — the machine is busy: expect noisy figures" if load[0] > (os.cpu_count() or 2) / 2 else "",)))
    for n in notes:
        print("- " + n)
    sys.stdout.flush()

    families = [f for f in FAMILIES if any(SYSTEMS[s][0] == f for s in args.systems)]
    servers = {f: Server(f, args.dataflow_module, args.workloads) for f in families}
    skipped = {}
    try:
        for server in servers.values():         # import all families at once, before measuring
            server.start()
        for server in servers.values():
            server.wait_ready(READY_TIMEOUT)
        systems = []
        for s in args.systems:
            server = servers[SYSTEMS[s][0]]
            reason = server.failure or server.ready["available"].get(s)
            if reason:
                skipped[s] = reason
            else:
                systems.append(s)
        extra = blas_notes(servers)
        for server in servers.values():
            if server.ready:
                extra.extend("%s: %s" % (server.family, n) for n in server.ready["notes"])
        if "tensorpack" in servers and servers["tensorpack"].ready and \
                not servers["tensorpack"].ready["notes"]:
            extra.append("tensorpack %s imported and ran under numpy %s with no workaround"
                         % (servers["tensorpack"].ready["versions"].get("tensorpack"),
                            servers["tensorpack"].ready["versions"].get("numpy")))
        for s, reason in skipped.items():
            extra.append("SKIPPED %s: %s" % (s, reason))
        unavailable = {}       # (workload, system) -> why that system cannot run that workload
        for s in systems:
            ready = servers[SYSTEMS[s][0]].ready
            for w in args.workloads:
                reason = ready.get("unavailable_for", {}).get(str(w), {}).get(s)
                if reason and applies(s, w):
                    unavailable[(w, s)] = "not run: %s" % reason
        for reason in sorted(set(unavailable.values())):
            pairs = [k for k, v in unavailable.items() if v == reason]
            extra.append("SKIPPED %s: %s" % (", ".join("W%s %s" % k for k in pairs), reason))
        for n in extra:
            print("- " + n)
        notes.extend(extra)
        sys.stdout.flush()
        runs = measure_all(args, systems, servers, timeout, teardown_cap, exit_grace,
                           unavailable)
    finally:
        for server in servers.values():
            server.stop()

    wall = time.monotonic() - t_start
    w0 = args.workers[0]
    main_runs = report.runs_at(runs, w0)
    rows = report.summarize(main_runs, args.workloads, systems)
    table = report.markdown(rows, WORKLOAD_LABELS)
    run_notes = _run_notes(runs)
    print()
    if len(args.workers) > 1:
        print("## %d workers (first of --workers %s)\n" % (w0, ",".join(map(str, args.workers))))
    print(table)
    print()
    print("Cells: median (min–max) over the ok runs. Ratios are of datapoints/s, computed repeat by "
          "repeat: 'dataflow ÷ peer' > 1 means dataflow is faster than the peer of that row; "
          "'÷ dataflow-serial' is this system over serial MapData (workloads 4, 5, img, "
          "fbresnet)."
          + (" Workloads img and fbresnet count images (datapoints/s = images/s; MB/s = bytes "
             "of the batches); a system's '(…)' is what it reported: the executor MapData "
             "chose, or torch's batching in the DataLoader."
             if {"img", "fbresnet"} & set(args.workloads) else ""))
    for w in ("img", "fbresnet"):
        for line in report.img_choice_lines(main_runs, systems, w) if w in args.workloads else ():
            print(line)
    rankings = {}
    for n in args.workers:
        rankings[n] = report.ranking(report.runs_at(runs, n), args.workloads, systems)
        print("\n## Ranking, %d workers%s: the best configuration of each library per workload\n"
              % (n, " (oversubscribed: %d CPUs)" % os.cpu_count() if n > (os.cpu_count() or n)
                 else ""))
        print(report.ranking_markdown(rankings[n], WORKLOAD_LABELS))
    print("\nCells: #place, the library's fastest system (median datapoints/s). 'best dataflow ÷ "
          "best peer' is repeat by repeat, median (min–max); goal: ≥ 1 on every workload, "
          "≥ 1.2 on img and fbresnet (issue 19). Systems that batch in their workers (%s) "
          "deliver batches where the others deliver datapoints: they are left out of the ranking "
          "(and the scaling table) and paired with each other in the table above."
          % ", ".join(BATCHING))
    scale = None
    if len(args.workers) > 1:
        scale = report.scaling(runs, args.workloads, systems, args.workers)
        print("\n## Scaling: each library's best parallel configuration ÷ its own serial one\n")
        print(report.scaling_markdown(scale, args.workers, os.cpu_count() or 0, WORKLOAD_LABELS))
        print("\nRepeat by repeat, median; the serial reference of SPDL is its pipeline with one "
              "worker thread (it has no in-thread mode). Counts above the CPU count are "
              "oversubscribed: they show overhead, not scaling.")
    print("\n## Systems (%d workers)\n" % w0)
    for sname in systems:
        by_text = {}            # description -> the workloads it runs that way
        for w in args.workloads:
            if applies(sname, w):
                by_text.setdefault(description(sname, w, w0), []).append(w)
        for text, ws in by_text.items():
            print("- `%s` (%s): %s" % (sname, ",".join(map(str, ws)), text))
    load = _loadavg()
    if load:
        run_notes.append("load average at the end: %.2f %.2f %.2f (1/5/15 min; this harness "
                         "itself keeps about one core busy)" % load)
    for n in run_notes:
        print("- " + n)
    versions = {}
    for server in servers.values():
        if server.ready:
            versions.update(server.ready["versions"])
    print("- versions: " + ", ".join("%s %s" % kv for kv in sorted(versions.items())
                                     if kv[1] and not kv[0].endswith(" file")))
    if args.json:
        doc = {
            "meta": {"started": started, "wall_s": wall, "quick": args.quick,
                     "repeats": args.repeats, "workloads": args.workloads,
                     "systems_requested": args.systems, "systems_run": systems,
                     "skipped": skipped, "counts": {w: COUNTS[w][q] for w in args.workloads},
                     "limits_s": {"run_timeout": timeout, "teardown_cap": teardown_cap,
                                  "min_measure": MIN_MEASURE_S[q],
                                  "max_measure": MAX_MEASURE_S[q],
                                  "exit_grace": exit_grace},
                     "dataflow_module": args.dataflow_module, "versions": versions,
                     "python": sys.version, "platform": platform.platform(),
                     "cpu_count": os.cpu_count(), "notes": notes + run_notes,
                     "blas": {f: s.ready.get("blas") for f, s in servers.items() if s.ready},
                     "env": {k: os.environ.get(k) for k in (
                         "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                         "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
                     "workers": args.workers,
                     "system_descriptions": {
                         str(w): {s: description(s, w, w0) for s in args.systems if applies(s, w)}
                         for w in args.workloads}},
            "runs": runs,
            "summary": rows,
            "ranking": {str(n): r for n, r in rankings.items()},
            "scaling": scale,
            "all_ratios": report.all_ratios(main_runs, args.workloads, systems),
            "markdown": table,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("- raw results written to %s" % args.json)
    if args.png:
        title = "dataflow benchmarks (%s, %d repeats, %d workers, %d CPUs)" % (
            "quick" if args.quick else "full", args.repeats, w0, os.cpu_count() or 0)
        try:
            print("- " + report.write_png(rows, WORKLOAD_LABELS, args.png, title,
                                          rank=rankings[w0]))
        except Exception as exc:   # noqa: BLE001 - the chart is optional
            print("- PNG skipped: drawing failed: %r" % (exc,))
    print("- wall time: %.1f s" % (time.monotonic() - t_start))
    return 0


def run_plan(workloads, repeats, systems, workers):
    """The runs, in order, as ``(workload, repeat, system, workers)``: workload by workload;
    within it, repeat by repeat, every system once, in the given order on even repeats and in
    the reverse order on odd ones (A B C, C B A, A B C ...). So no system always runs right after
    the same one: a run can leave the machine slower for the next (memory just freed, caches,
    a process group still ending), and a fixed order would charge that to one system."""
    plan = []
    for w in workloads:
        for r in range(repeats):
            for s in (systems if r % 2 == 0 else systems[::-1]):
                if not applies(s, w):
                    continue
                counts = sorted({workers_of(s, n) for n in workers}, key=str)
                plan.extend((w, r, s, n) for n in counts)
    return plan


def measure_all(args, systems, servers, timeout, teardown_cap, exit_grace, unavailable=None):
    """Run :func:`run_plan`'s runs."""
    q = 1 if args.quick else 0
    plan = run_plan(args.workloads, args.repeats, list(systems), args.workers)
    progress = Progress(len(plan))
    runs = []
    given_up = dict(unavailable or {})     # (workload, system) -> why no (more) runs
    try:
        for seq, (w, r, s, n) in enumerate(plan):
            family = SYSTEMS[s][0]
            server = servers[family]
            base = {"seq": seq, "workload": w, "repeat": r, "system": s, "workers": n,
                    "count": COUNTS[w][q]}
            why = given_up.get((w, s)) or given_up.get((w, s, n))
            if why or server.ready is None:
                rec = dict(base, status="skipped",
                           error=why or "fork server unavailable: %s"
                           % server.failure, notes=[])
            else:
                cmd = {"system": s, "workload": w, "count": COUNTS[w][q],
                       "limit": count_limit(w, args.quick),
                       "min_s": MIN_MEASURE_S[q], "max_s": MAX_MEASURE_S[q],
                       "workers": n if n is not None else args.workers[0]}
                t0 = time.monotonic()
                try:
                    rec = server.run(cmd, timeout, teardown_cap, exit_grace)
                except ServerDied as exc:
                    rec = exc.args[0] if isinstance(exc.args[0], dict) else \
                        {"status": "crashed", "error": str(exc), "notes": []}
                    if not server.restart(READY_TIMEOUT):
                        progress.write("fork server of %s could not be restarted: %s"
                                       % (family, server.failure))
                rec = dict(base, **rec)
                rec["wall_s"] = time.monotonic() - t0
                if rec["status"] in ("hung", "crashed"):
                    given_up[(w, s, n)] = "not run: an earlier run of it %s" % rec["status"]
                    progress.write("W%s %s repeat %d: %s (%s)%s" % (
                        w, s, r + 1, rec["status"].upper(), rec.get("error"),
                        "; remaining repeats skipped" if r + 1 < args.repeats else ""))
            runs.append(rec)
            label = s if n is None or len(args.workers) == 1 else "%s@%s" % (s, n)
            if rec["status"] == "ok":
                text = "W%s %s #%d: %s dp/s" % (w, label, r + 1,
                                                report._num(rec["throughput_dps"]))
            else:
                text = "W%s %s #%d: %s" % (w, label, r + 1, rec["status"])
            progress.step(text)
    finally:
        progress.close()
    return runs


def _loadavg():
    try:
        return os.getloadavg()
    except OSError:
        return None


def _run_notes(runs):
    notes = []
    seen = set()
    for rec in runs:
        if rec["status"] in ("hung", "crashed", "bad-output"):
            key = (rec["workload"], rec["system"], rec["status"], rec.get("error"))
            if key not in seen:
                seen.add(key)
                detail = rec.get("error") or "first datapoint has the wrong type or shape"
                tail = (rec.get("stderr_tail") or "").strip().splitlines()[-1:]
                if len(detail) > 300:
                    detail = detail[:300] + " ..."
                notes.append("W%s %s: %s — %s%s" % (rec["workload"], rec["system"],
                                                    rec["status"], detail,
                                                    (" | stderr: " + tail[0][:200]) if tail
                                                    else ""))
        for n in rec.get("notes", []):
            key = (rec["workload"], rec["system"], n)
            if key not in seen:
                seen.add(key)
                notes.append("W%s %s: %s" % (rec["workload"], rec["system"], n))
    return notes
