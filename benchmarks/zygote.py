"""Fork server of one family of systems:
``python -m benchmarks.zygote FAMILY [DATAFLOW_MODULE [WORKLOAD,...]]``.

It imports the family once (torch alone takes ~2 s to import), then for each command line read on
stdin forks a fresh child that measures one run and exits the normal way. Each run thus gets a
process of its own (isolation, fair startup figures, a hang can be killed) without paying imports.

Protocol, one line per message on the original stdout (everything printed by the systems goes to
stderr instead): ``READY {...}`` or ``FAIL {...}`` once; then per run, from the child,
``PID {...}``, ``STAGE {...}`` (after startup, after the measured loop), ``RESULT {...}`` or
``ERROR {...}``; then from the server ``EXIT {...}`` once the child is reaped.
"""
import gc
import json
import math
import os
import resource
import signal
import sys
import time
import traceback

_PROTO = None   # fd of the protocol channel


def send(tag, payload):
    data = ("%s %s\n" % (tag, json.dumps(payload))).encode()
    while data:
        data = data[os.write(_PROTO, data):]


def _blas_info():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    try:
        return [{k: i.get(k) for k in ("internal_api", "version", "num_threads", "architecture",
                                       "threading_layer", "prefix")} for i in threadpool_info()]
    except Exception as exc:   # noqa: BLE001 - informative only
        return [{"error": repr(exc)}]


MAX_PER_ITEM = 32     # the largest batch a stream may yield (img, torch-batch32)
CHECK_EVERY = 16      # items between two looks at the clock when a run has a time cap


def _check_batch(first, n):
    """A system that collates the unbatched workloads itself: every leaf has ``n`` rows (torch's
    collate leaves byte strings in a tuple of ``n``)."""
    leaves = first if isinstance(first, (list, tuple)) else [first]
    return bool(leaves) and all(
        len(x) == n if isinstance(x, (list, tuple)) else getattr(x, "shape", (None,))[:1] == (n,)
        for x in leaves)


def measure(family, cmd):
    """The body of one run, in the forked child.

    ``count`` is in datapoints of the workload's output; for a batched workload ("img") the
    stream yields batches of ``wl.batch`` and the run reads ``count // wl.batch`` of them after
    the first (so throughput is in images/s).
    """
    from .systems import open_stream
    from .workloads import WORKLOADS, consume

    system = cmd["system"]
    wl = WORKLOADS[cmd["workload"]]
    count = int(cmd["count"])
    limit = max(count, int(cmd.get("limit") or count))
    source = wl.make_source(limit + MAX_PER_ITEM)
    if wl.warm is not None:
        wl.warm()
    # enough passes for the limit and a first item of up to MAX_PER_ITEM datapoints
    passes = max(1, math.ceil((limit + MAX_PER_ITEM) / len(source)))
    gc.collect()

    t0 = time.perf_counter()
    stream = open_stream(family, system, wl, source, passes, cmd.get("workers", 2))
    first = next(stream.it)
    consume(first)
    t1 = time.perf_counter()
    # datapoints per item: the workload's batch, or the system's own batching (torch-batch32)
    per_item = stream.per_item or wl.batch or 1
    items = count // per_item
    limit_items = max(items, limit // per_item)
    good = bool(wl.check(first)) if per_item == (wl.batch or 1) else _check_batch(first, per_item)
    del first
    startup = t1 - t0
    send("STAGE", {"stage": "started", "startup_s": startup})

    nxt = stream.it.__next__
    received = nbytes = 0          # bytes received in the measured window (after the first)
    # The window ends after ``items`` items once ``min_s`` seconds have passed (a fast system
    # goes on to the first clock check past ``min_s``, at most ``limit_items`` items), or, for a
    # slow system, at the first check past ``max_s`` seconds. The clock is read every
    # CHECK_EVERY items and at the ``items``-th: the same reads for every system.
    max_s = cmd.get("max_s")
    min_s = cmd.get("min_s") or 0.0
    check = CHECK_EVERY if (max_s or min_s) else limit_items + 1
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t2 = time.perf_counter()
    deadline = t2 + max_s if max_s else float("inf")
    at_least = t2 + min_s
    perf = time.perf_counter
    try:
        for received in range(1, limit_items + 1):   # noqa: B007
            nbytes += consume(nxt())
            if received % check == 0 or received == items:
                now = perf() if (max_s or min_s) else at_least
                if now > deadline or (received >= items and now >= at_least):
                    break
    except StopIteration:
        raise RuntimeError("the stream ended after %d items; expected up to %d (%d passes of %d "
                           "datapoints, %d datapoints per item)"
                           % (received, limit_items + 1, passes, len(source), per_item)) from None
    t3 = time.perf_counter()
    items = received
    count = items * per_item
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    del nxt
    measure_s = t3 - t2
    send("STAGE", {"stage": "measured", "startup_s": startup, "measure_s": measure_s,
                   "count": count,
                   "bytes": nbytes})

    stream_detail = stream.detail
    teardown_kind = "close()" if stream.has_close else "del+gc.collect()"
    t4 = time.perf_counter()
    stream.teardown()
    t5 = time.perf_counter()
    stream.release()
    return {
        "startup_s": startup,
        "measure_s": measure_s,
        "count": count,
        "bytes": nbytes,
        "throughput_dps": count / measure_s,
        "mbps": nbytes / measure_s / 1e6,
        "teardown_s": t5 - t4,
        "teardown_kind": teardown_kind,
        "cpu_main_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        # page faults of the consuming process in the window (fresh memory, copy-on-write)
        "minflt": cpu1.ru_minflt - cpu0.ru_minflt,
        "output_ok": good,
        "detail": stream_detail,
    }


def child(family, cmd):
    """Runs in the forked child; never returns (see exit_like_a_program)."""
    os.setpgid(0, 0)   # its own process group: the harness kills the group if it hangs
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    send("PID", {"pid": os.getpid()})
    code = 0
    try:
        send("RESULT", measure(family, cmd))
    except BaseException as exc:   # noqa: BLE001 - reported, then exit
        code = 1
        send("ERROR", {"error": "%s: %s" % (type(exc).__name__, exc),
                       "traceback": traceback.format_exc()[-4000:]})
    exit_like_a_program(code)


def exit_like_a_program(code):
    """What a normal interpreter exit does that a system can notice, then ``os._exit``.

    It joins the non-daemon threads and runs the atexit handlers (multiprocessing's joins its
    non-daemon children and terminates the daemonic ones), like a program's exit and like
    multiprocessing's own forked children do; a system that leaves something behind that blocks
    the exit shows up as "exit hung". It skips the module teardown, which in a process forked from
    a server that imported torch costs ~1 s of copy-on-write page faults and tells nothing about
    the system.
    """
    import atexit
    import threading
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
        if run_exitfuncs is not None:
            run_exitfuncs()
    except BaseException:   # noqa: BLE001 - still exit
        traceback.print_exc()
        code = code or 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _decode(status):
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status), "code": None}
    return {"signal": None, "code": os.WEXITSTATUS(status)}


LEFTOVER_GRACE_S = 2.0   # for multiprocessing's resource tracker to clean up and exit


def _group_members(pgid):
    """{pid: command line} of the live (not zombie) processes of process group ``pgid``, from
    /proc; None where there is no /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    out = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()   # state, ppid, pgrp, ...
            if int(fields[2]) != pgid or fields[0] == b"Z":
                continue
            with open("/proc/%s/cmdline" % name, "rb") as f:
                out[int(name)] = f.read()
        except (OSError, ValueError, IndexError):
            continue
    return out


def _end_group(pgid):
    """End whatever the run left in its process group (e.g. workers still busy with a batch);
    returns whether anything was left. Everything but multiprocessing's resource tracker gets
    SIGKILL at once; the tracker, once its last user is gone, unlinks the named semaphores they
    leaked (instead of dying with them left in /dev/shm) and exits; SIGKILL to the group after
    LEFTOVER_GRACE_S ends whatever is still there. Without /proc: SIGTERM (which the tracker
    ignores), then the same grace and SIGKILL."""
    members = _group_members(pgid)
    if members is None:
        if not _group_alive(pgid, False):
            return False
        _kill_group(pgid, signal.SIGTERM)
    elif not members:
        return False
    else:
        for pid, cmdline in members.items():
            if b"multiprocessing.resource_tracker" not in cmdline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while _group_alive(pgid, members is not None) and time.monotonic() < deadline:
        time.sleep(0.01)    # polling processes that are not our children: nothing to wait on
    _kill_group(pgid, signal.SIGKILL)
    return True


def _group_alive(pgid, proc):
    if proc:
        return bool(_group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True


def _kill_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def serve(family_name, dataflow_module, workloads=()):
    global _PROTO
    _PROTO = os.dup(1)
    os.dup2(2, 1)            # whatever the systems print goes to stderr (the harness's log file)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the harness decides when we stop

    from .systems import Family
    try:
        family = Family(family_name, dataflow_module)
    except BaseException as exc:   # noqa: BLE001 - reported to the harness
        send("FAIL", {"error": "%s: %s" % (type(exc).__name__, exc),
                      "traceback": traceback.format_exc()[-3000:]})
        return 1
    if "img" in workloads and not family.unavailable_for.get("img"):
        # Once here, not in every run: encode the JPEGs (this also imports Pillow's JPEG plugin,
        # which the runs then find loaded, as a long-running program would).
        from .workloads import jpeg_source
        jpeg_source()
    if "fbresnet" in workloads and not family.unavailable_for.get("fbresnet"):
        # Likewise the fbresnet JPEGs, and the imports its map function makes on first use.
        from .workloads import fbresnet_augmentors, fbresnet_source
        fbresnet_source()
        fbresnet_augmentors()
    import numpy
    # Objects that exist now (the imports) are left out of every later collection: gc.collect()
    # in a run then costs what the run created, and a forked child does not take copy-on-write
    # faults on the whole heap of torch's import (~0.1-0.5 s) at its first collection.
    gc.collect()
    gc.freeze()
    send("READY", {"available": family.available, "unavailable_for": family.unavailable_for,
                   "notes": family.notes,
                   "versions": dict(family.versions, numpy=numpy.__version__),
                   "blas": _blas_info(), "pid": os.getpid()})

    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        cmd = json.loads(line)
        if cmd.get("op") == "quit":
            return 0
        pid = os.fork()
        if pid == 0:
            child(family, cmd)      # never returns
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
        leftovers = _end_group(pid)
        send("EXIT", dict(_decode(status), pid=pid, leftovers=leftovers))


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "dataflow",
                   sys.argv[3].split(",") if len(sys.argv) > 3 else ()))
