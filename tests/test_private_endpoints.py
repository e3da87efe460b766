"""Only the consumer that started a worker can talk to it.

Another local user (uid ``nobody`` when the suite runs as root; the same user otherwise, who does
not know the pipeline's secret either) connects to every Unix endpoint that appeared with the
pipeline, with every ZeroMQ socket type and as a raw socket, sends garbage and well-formed
protocol messages, and must receive nothing, while the pipeline's output stays complete and
unchanged.
"""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import dataflow as D

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]

MARKER = "private-payload"


def _unix_endpoints():
    """Names of the listening Unix sockets on this machine (``@name`` for abstract ones)."""
    out = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and int(fields[3], 16) & 0x10000:     # __SO_ACCEPTCON
                out.add(fields[7])
    return out


_INTRUDER = r"""
import json, os, socket, sys, time
import msgpack, zmq
from dataflow import serialize

endpoints = json.loads(sys.argv[1])
if os.getuid() == 0:                      # become another local user
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
uid = os.getuid()

def addr(name):
    return "\0" + name[1:] if name.startswith("@") else name

garbage = [b"\xff" * 64, b"\x00\x01garbage", os.urandom(300)]
task = serialize.dumps_oob([[0, 0, [1]]], [])
wellformed = [msgpack.packb(m) for m in ([1, [], 0, task], [5, [0, 1]], [2], [6],
                                          [3, 0.0, [], [], [[0, 0, task]]])]
received = []

for name in endpoints:                    # raw sockets: what comes back beyond the greeting?
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.3)
    try:
        s.connect(addr(name))
        for g in garbage:
            s.sendall(g)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        data = b"" if "data" not in dir() else data
    finally:
        s.close()
    received.append(["raw", name, data.decode("latin-1")])

ctx = zmq.Context()
types = [zmq.PAIR, zmq.PUB, zmq.SUB, zmq.REQ, zmq.REP, zmq.DEALER, zmq.ROUTER, zmq.PULL,
         zmq.PUSH, zmq.XPUB, zmq.XSUB, zmq.STREAM]
socks = []
for name in endpoints:
    for t in types:
        for creds in (None, (b"dataflow", b"wrong"), (b"intruder", b"x")):
            s = ctx.socket(t)
            s.setsockopt(zmq.LINGER, 0)
            if t == zmq.SUB:
                s.setsockopt(zmq.SUBSCRIBE, b"")
            if creds:
                s.plain_username, s.plain_password = creds
            s.connect("ipc://" + name)
            socks.append((t, name, s))
deadline = time.monotonic() + 1.0
for t, name, s in socks:
    for frame in garbage + wellformed:
        try:
            if t == zmq.ROUTER:
                s.send_multipart([b"peer", frame], zmq.NOBLOCK)
            elif t not in (zmq.PULL, zmq.SUB, zmq.REP):
                s.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
poller = zmq.Poller()
for _, _, s in socks:
    poller.register(s, zmq.POLLIN)
while time.monotonic() < deadline:       # anything that arrives in a second counts
    for s, _ in poller.poll(50):
        for t, name, s2 in socks:
            if s2 is s:
                frames = s.recv_multipart(zmq.NOBLOCK)
                kind = "raw" if t == zmq.STREAM else "zmq"    # STREAM: raw bytes, like a socket
                received.append([kind, name, b"".join(frames[1:]).decode("latin-1")
                                 if kind == "raw" else repr(frames)])
for _, _, s in socks:
    s.close(0)
ctx.term()
print(json.dumps({"uid": uid, "received": received, "sockets": len(socks)}))
"""


def _run_intruder(endpoints):
    return subprocess.Popen([sys.executable, "-c", _INTRUDER, json.dumps(sorted(endpoints))],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _check_intrusion(proc, endpoints):
    out, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    if os.getuid() == 0:
        assert report["uid"] == 65534
    assert report["sockets"] == 36 * len(endpoints)
    for entry in report["received"]:
        if entry[0] == "raw":
            # at most ZeroMQ's greeting and handshake refusal: no message of the pipeline
            assert MARKER not in entry[2] and len(entry[2]) < 256, entry
        else:
            pytest.fail(f"another user received a message: {entry}")


def _make(n):
    return [[i, np.full(5000, i, np.int32)] for i in range(n)]


def _expected(n):
    return [[i, f"{MARKER}-{i}", np.full(5000, i, np.int32) * 2] for i in range(n)]


def _f(dp):
    return [dp[0], f"private-payload-{dp[0]}", dp[1] * 2]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[0] == w[0] and g[1] == w[1] and np.array_equal(g[2], w[2])


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_another_user_cannot_talk_to_map_workers(start_method, caplog):
    n = 64
    before = _unix_endpoints()
    with caplog.at_level(logging.WARNING, logger="dataflow"), \
            D.MultiProcessMapData(D.DataFromList(_make(n), shuffle=False), 2, _f, strict=True,
                                  ordered=True, start_method=start_method) as df:
        df.reset_state()
        it = iter(df)
        first = [next(it)]
        endpoints = _unix_endpoints() - before
        assert endpoints, "the pipeline's endpoints are listed"
        intruder = _run_intruder(endpoints)
        _assert_same(first + list(it), _expected(n))
        passes = 1
        while intruder.poll() is None or passes < 2:     # the pipeline runs during the attack
            _assert_same(list(df), _expected(n))
            passes += 1
        _check_intrusion(intruder, endpoints)
        _assert_same(list(df), _expected(n))
    assert any("refused a connection" in r.getMessage() for r in caplog.records)


def test_another_user_cannot_talk_to_runner_workers():
    class Source(D.DataFlow):
        def __iter__(self):
            for i in range(8):
                yield [i, f"{MARKER}-{i}"]

        def __len__(self):
            return 8

    before = _unix_endpoints()
    with D.MultiProcessRunnerZMQ(Source(), num_proc=2, hwm=4) as df:
        df.reset_state()

        def passes():                   # each pass yields len(ds) datapoints
            while True:
                yield from df
        it = passes()
        got = [next(it)]
        endpoints = _unix_endpoints() - before
        intruder = _run_intruder(endpoints)
        while intruder.poll() is None:
            got.append(next(it))
        _check_intrusion(intruder, endpoints)
        got += [next(it) for _ in range(16)]
    counts = {}
    for i, s in got:
        assert s == f"{MARKER}-{i}"
        counts[i] = counts.get(i, 0) + 1
    assert sorted(counts) == list(range(8))


def test_a_malformed_message_is_dropped_and_logged(caplog):
    """A frame that is not a message (whatever its source) never kills a worker or the
    consumer: it is logged and dropped."""
    from dataflow.parallel import transport
    with pytest.raises(transport.MalformedMessage):
        transport.decode_task([b"\xc1garbage"])
    with pytest.raises(transport.MalformedMessage):
        transport.decode_task([transport._pack([transport.TASK, [], 0, b"\x93\x01"])])
    with pytest.raises(transport.MalformedMessage):
        transport.decode_results(b"\xc1", None)
    with pytest.raises(transport.MalformedMessage):
        transport.decode_results(transport._pack([transport.RESULTS, 0.0]), None)
