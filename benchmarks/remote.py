"""Remote dataflows side by side: ``send_dataflow_zmq`` in one process -> ``RemoteDataZMQ`` in
another, dataflow's pair against tensorpack 0.11's, over ``ipc://`` and ``tcp://127.0.0.1``.

    python -m benchmarks.remote                       # 3 alternating repeats, 10000 datapoints
    python -m benchmarks.remote --repeats 5 --n 20000 --json remote.json

Each trial starts a fresh receiver process and a fresh sender process (tensorpack patches
msgpack process-wide and reads TENSORPACK_SERIALIZE at import, so nothing is shared). The
sender runs a ``DataFromList`` of 64 distinct uint8 arrays of 150 KiB (one array per datapoint).
The receiver measures:

* startup: from the launch of the sender process to the first datapoint at the receiver
  (interpreter start, imports, connecting, the first frame);
* throughput: datapoints/s and GB/s over ``n`` datapoints, after 200 warm-up datapoints; the
  receiver reads one byte of every 4 KiB page of every array it receives (``workloads.consume``,
  as the harness's consumer does: lazily mapped memory is paid for);
* teardown: closing the receiver's iteration (sockets, context), and ending the sender
  (SIGTERM until reaped, measured by this process).

Systems: ``dataflow`` (format=None: msgpack frames), ``dataflow-pickle`` (format="pickle",
receiver allow_pickle=True), ``tensorpack`` (its default, pickle), ``tensorpack-msgpack``
(TENSORPACK_SERIALIZE=msgpack), and ``zmq-raw``: pyzmq alone sending one pre-made frame of the
same size again and again, no encoding or decoding (the transport's ceiling on this machine). Trials alternate systems within each repeat; ratios are taken
repeat by repeat (same transport), then the median and the range are reported.

``--malloc-tuned`` runs every process (all systems alike) with glibc malloc kept from returning
150 KiB blocks to the kernel (:data:`MALLOC_TUNED`): without it, a large share of the
receiver's CPU time is page faults on freshly mapped message buffers. dataflow's pair makes a
like setting itself (``tune_malloc=True``, its default: ``dataflow._malloc``), so the flag
changes the other systems' processes, and dataflow's only from the interpreter's start.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ARRAY_BYTES = 150 * 1024
# glibc malloc serves a 150 KiB block with mmap, or trims the freed heap top, so fresh pages
# fault in for many frames (ZeroMQ allocates every received message); these keep such blocks
# in the heap. Same setting for every system.
MALLOC_TUNED = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864"
WARMUP = 200

SYSTEMS = {
    # name: (library, format passed / TENSORPACK_SERIALIZE, receiver allow_pickle)
    "dataflow": ("dataflow", None, False),
    "dataflow-pickle": ("dataflow", "pickle", True),
    "tensorpack": ("tensorpack", "pickle", None),
    "tensorpack-msgpack": ("tensorpack", "msgpack", None),
    # the transport's ceiling: pyzmq alone, one pre-made 150 KiB frame sent again and again
    "zmq-raw": ("zmq", None, None),
}
PAIRS = [("dataflow", "tensorpack"), ("dataflow", "tensorpack-msgpack"),
         ("dataflow-pickle", "tensorpack")]

SENDER = """
import numpy as np
{imports}
rs = np.random.RandomState(0)
df = DataFromList([[rs.randint(0, 256, {size}, dtype=np.uint8)] for _ in range(64)],
                  shuffle=False)
{send}
"""

RECEIVER = """
import json, sys, time
from benchmarks.workloads import consume
{imports}
df = {make}
print("ready", flush=True)
t_launch = float(sys.stdin.readline())
df.reset_state()
it = iter(df)
next(it)
t_first = time.time()
for _ in range({warmup}):
    consume(next(it))
n = {n}
t0 = time.perf_counter()
for _ in range(n):
    consume(next(it))
dt = time.perf_counter() - t0
t1 = time.perf_counter()
it.close()
close = getattr(df, "close", None)
if close is not None:
    close()
teardown = time.perf_counter() - t1
print(json.dumps({{"dp_s": n / dt, "gb_s": n * {size} / dt / 1e9,
                  "startup_s": t_first - t_launch, "receiver_close_s": teardown}}), flush=True)
"""


def _scripts(system, addr, n, tunables=""):
    lib, fmt, allow_pickle = SYSTEMS[system]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    if lib == "dataflow":
        s_imports = ("from dataflow import DataFromList\n"
                     "from dataflow.remote import send_dataflow_zmq")
        send = f"send_dataflow_zmq(df, {addr!r}, format={fmt!r})"
        r_imports = "from dataflow.remote import RemoteDataZMQ"
        make = f"RemoteDataZMQ({addr!r}, allow_pickle={allow_pickle!r})"
    elif lib == "zmq":
        s_imports = "import zmq"
        send = textwrap.dedent(f"""
            sock = zmq.Context().socket(zmq.PUSH)
            sock.set_hwm(50)
            sock.connect({addr!r})
            frame = bytes({ARRAY_BYTES})
            while True:
                sock.send(frame, copy=True)
        """)
        r_imports = textwrap.dedent("""
            import zmq
            class RawPull:
                def __init__(self, addr):
                    self.addr = addr
                def reset_state(self):
                    pass
                def __iter__(self):
                    ctx = zmq.Context()
                    sock = ctx.socket(zmq.PULL)
                    sock.set_hwm(50)
                    sock.bind(self.addr)
                    try:
                        while True:
                            yield sock.recv(copy=False).buffer
                    finally:
                        ctx.destroy(linger=0)
        """)
        make = f"RawPull({addr!r})"
    else:
        env["TENSORPACK_SERIALIZE"] = fmt
        s_imports = "from tensorpack.dataflow import DataFromList, send_dataflow_zmq"
        send = f"send_dataflow_zmq(df, {addr!r})"
        r_imports = "from tensorpack.dataflow import RemoteDataZMQ"
        make = f"RemoteDataZMQ({addr!r})"
    if lib == "zmq":
        sender = s_imports + "\n" + send
    else:
        sender = SENDER.format(imports=s_imports, size=ARRAY_BYTES, send=send)
    receiver = RECEIVER.format(imports=r_imports, make=make, warmup=WARMUP, n=n,
                               size=ARRAY_BYTES)
    return textwrap.dedent(sender), textwrap.dedent(receiver), env


def _free_tcp():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def trial(system, transport, n, timeout, tunables=""):
    """One sender process -> one receiver process; returns the receiver's measurements plus
    the sender's teardown."""
    tmp = tempfile.mkdtemp(prefix="df-bench-remote-")
    addr = f"ipc://{tmp}/s" if transport == "ipc" else _free_tcp()
    sender_code, receiver_code, env = _scripts(system, addr, n, tunables)
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    receiver = subprocess.Popen([sys.executable, "-c", receiver_code], env=env, cwd=cwd,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    sender = None
    try:
        for line in receiver.stdout:          # tensorpack prints a line about TensorFlow
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError(f"{system}: the receiver did not start")
        t_launch = time.time()
        sender = subprocess.Popen([sys.executable, "-c", sender_code], env=env, cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        receiver.stdin.write(f"{t_launch!r}\n")
        receiver.stdin.flush()
        out, _ = receiver.communicate(timeout=timeout)
        result = json.loads(out.strip().splitlines()[-1])
        t0 = time.perf_counter()
        sender.terminate()
        sender.wait(30)
        result["sender_stop_s"] = time.perf_counter() - t0
        return result
    finally:
        for p in (receiver, sender):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def _fmt_range(values, scale=1.0, digits=0):
    vals = sorted(v * scale for v in values)
    med = statistics.median(vals)
    return f"{med:,.{digits}f} ({vals[0]:,.{digits}f}–{vals[-1]:,.{digits}f})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="datapoints measured per trial")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--transports", default="ipc,tcp")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--timeout", type=float, default=120, help="seconds per trial")
    ap.add_argument("--json", default="", help="write the raw results here")
    ap.add_argument("--malloc-tuned", action="store_true",
                    help="run every sender and receiver (all systems alike) with "
                         f"GLIBC_TUNABLES={MALLOC_TUNED} (see the module doc)")
    args = ap.parse_args(argv)
    transports = args.transports.split(",")
    systems = args.systems.split(",")
    results = {(s, t): [] for s in systems for t in transports}
    started = time.time()
    for r in range(args.repeats):
        order = systems if r % 2 == 0 else systems[::-1]      # alternate who goes first
        for t in transports:
            for s in order:
                res = trial(s, t, args.n, args.timeout,
                            MALLOC_TUNED if args.malloc_tuned else "")
                res["repeat"] = r
                results[(s, t)].append(res)
                print(f"repeat {r} {t:3s} {s:18s} {res['dp_s']:8,.0f} dp/s "
                      f"{res['gb_s']:5.2f} GB/s  startup {res['startup_s'] * 1e3:6.0f} ms",
                      file=sys.stderr, flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {args.repeats} repeats x {args.n} datapoints "
          f"of {ARRAY_BYTES // 1024} KiB, {time.time() - started:.0f} s; "
          f"load average at the end {os.getloadavg()[0]:.1f}\n")
    print("| transport | system | datapoints/s | GB/s | startup ms | receiver close ms "
          "| sender stop ms |")
    print("|---|---|---|---|---|---|---|")
    for t in transports:
        for s in systems:
            rs = results[(s, t)]
            print(f"| {t} | {s} | {_fmt_range([x['dp_s'] for x in rs])} "
                  f"| {_fmt_range([x['gb_s'] for x in rs], digits=2)} "
                  f"| {_fmt_range([x['startup_s'] for x in rs], 1e3)} "
                  f"| {_fmt_range([x['receiver_close_s'] for x in rs], 1e3, 1)} "
                  f"| {_fmt_range([x['sender_stop_s'] for x in rs], 1e3, 1)} |")
    print("\n| transport | pair | ratio (median, min–max) |\n|---|---|---|")
    for t in transports:
        for a, b in PAIRS:
            if a in systems and b in systems:
                ratios = [x["dp_s"] / y["dp_s"]
                          for x, y in zip(results[(a, t)], results[(b, t)])]
                print(f"| {t} | {a} ÷ {b} | **{_fmt_range(ratios, digits=2)}×** |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{s}/{t}": v for (s, t), v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
