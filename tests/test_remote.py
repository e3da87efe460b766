"""send_dataflow_zmq / RemoteDataZMQ: frames, encodings, the pickle refusal, CURVE, and
tensorpack 0.11's pair on either side. Endpoints: ipc:// in a private temporary directory, or
tcp://127.0.0.1."""
import contextlib
import errno
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

import dataflow as D
from dataflow.formats import codec
from dataflow.remote import RemoteDataZMQ, curve_keypair, send_dataflow_zmq
from tests._tensorpack import run_tensorpack, start_tensorpack

SENDER = """
import numpy as np
import dataflow as D
from dataflow.remote import send_dataflow_zmq
df = D.DataFromList([[i, np.full((3, 4), i, np.uint8), "s%d" % i] for i in range({n})],
                    shuffle=False)
send_dataflow_zmq(df, {addr!r}, {kwargs})
"""


def expected(i, n=4):
    k = i % n
    return [k, np.full((3, 4), k, np.uint8), f"s{k}"]


def assert_dp(dp, i, n=4):
    e = expected(i, n)
    assert dp[0] == e[0] and dp[2] == e[2]
    np.testing.assert_array_equal(dp[1], e[1])
    assert dp[1].dtype == np.uint8


@pytest.fixture
def ipc_addr():
    d = tempfile.mkdtemp(prefix="df-remote-")      # mode 0700: only we can connect
    yield f"ipc://{d}/s"
    shutil.rmtree(d, ignore_errors=True)


def free_tcp_addr():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def sender(addr, n=4, **kwargs):
    """Our send_dataflow_zmq in a child process, ended (and reaped) on exit."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    code = textwrap.dedent(SENDER.format(n=n, addr=addr, kwargs=args))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


@contextlib.contextmanager
def tensorpack_sender(addr, serialize):
    proc = start_tensorpack(f"""
        from tensorpack.dataflow import DataFromList, send_dataflow_zmq
        df = DataFromList([[i, np.full((3, 4), i, np.uint8), "s%d" % i] for i in range(4)],
                          shuffle=False)
        send_dataflow_zmq(df, {addr!r})
    """, serialize=serialize, cwd=os.getcwd())
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


def take(df, n):
    df.reset_state()
    it = iter(df)
    try:
        return [next(it) for _ in range(n)]
    finally:
        it.close()


# ------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("fmt, allow_pickle", [(None, False), ("pickle", True)])
def test_ipc_round_trip_in_order(no_leaks, ipc_addr, fmt, allow_pickle):
    with sender(ipc_addr, format=fmt):
        df = RemoteDataZMQ(ipc_addr, allow_pickle=allow_pickle)
        out = take(df, 10)
    for i, dp in enumerate(out):
        assert_dp(dp, i)
    assert df.cnt1 == 10


def test_tcp_round_trip_with_sender_binding(no_leaks):
    addr = free_tcp_addr()
    with sender(addr, bind=True):
        out = take(RemoteDataZMQ(addr, bind=False), 6)
    for i, dp in enumerate(out):
        assert_dp(dp, i)


def test_two_addresses_count_per_address(no_leaks, ipc_addr):
    tcp = free_tcp_addr()
    with sender(ipc_addr), sender(tcp, n=2):
        df = RemoteDataZMQ(ipc_addr, tcp)
        df.reset_state()
        it = iter(df)
        seen = {ipc_addr: 0, tcp: 0}
        while min(seen.values()) < 3:
            dp = next(it)
            assert dp[2] == f"s{dp[0]}"
            seen[ipc_addr if df.cnt1 > seen[ipc_addr] else tcp] += 1
        it.close()
    assert (df.cnt1, df.cnt2) == (seen[ipc_addr], seen[tcp])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract ipc names are Linux's")
def test_efficient_dataflow_tutorial_distributed_setup(no_leaks):
    """tensorpack's efficient-dataflow tutorial: a local sender on an abstract ipc name
    (``ipc://@name``, no file), a remote one over tcp, one receiver bound to both, measured with
    TestDataSpeed."""
    local = f"ipc://@df-tutorial-{os.getpid()}-{os.urandom(4).hex()}"
    tcp = free_tcp_addr()              # the tutorial binds tcp://0.0.0.0:8877; loopback here
    with sender(local), sender(tcp, n=2):
        df = RemoteDataZMQ(local, tcp)
        D.TestDataSpeed(df, size=40, warmup=2).start()
        assert df.cnt1 + df.cnt2 == 42                   # warm-up and measured datapoints
        it = iter(df)                                    # both senders get through
        while df.cnt1 < 1 or df.cnt2 < 1:
            next(it)
        it.close()
        df.close()


def test_receiver_has_no_length_and_is_not_reentrant(no_leaks, ipc_addr):
    df = RemoteDataZMQ(ipc_addr)
    with pytest.raises(NotImplementedError):
        len(df)
    # endless: a plain NotImplementedError, so list() fails at once instead of blocking
    with pytest.raises(NotImplementedError, match="endless"):
        list(df)
    with sender(ipc_addr):
        df.reset_state()
        it = iter(df)
        assert_dp(next(it), 0)
        with pytest.raises(RuntimeError, match="not reentrant"):
            next(iter(df))
        df.close()                      # ends the running iteration, closes its sockets
        with pytest.raises(StopIteration):
            next(it)
        dp = take(df, 1)[0]             # it can start again; what was queued is gone
        assert_dp(dp, dp[0])


def test_a_dropped_iteration_frees_the_receiver(no_leaks, ipc_addr):
    """An iterator its caller drops is collected at once, its sockets closed, and a new iteration
    can start (as with tensorpack's): what TestDataSpeed, or a loop left by ``break``, does."""
    import pickle
    df = RemoteDataZMQ(ipc_addr)
    with sender(ipc_addr):
        df.reset_state()
        it = iter(df)
        assert_dp(next(it), 0)
        del it
        dp = take(df, 1)[0]
        assert_dp(dp, dp[0])
        twin = pickle.loads(pickle.dumps(df))       # a copy starts with no iteration of its own
        dp = take(twin, 1)[0]
        assert_dp(dp, dp[0])


# ------------------------------------------------------------------------- bad frames, args

def test_pickle_frames_are_refused_unless_allowed(no_leaks, ipc_addr):
    with sender(ipc_addr, format="pickle"):
        df = RemoteDataZMQ(ipc_addr)
        with pytest.raises(codec.PickleRefusedError,
                           match=r"datapoint 1 from ipc://.*pickle.*could run code.*"
                                 r"allow_pickle=True"):
            take(df, 1)


@pytest.mark.parametrize("frame, error, match", [
    (b"\xc1 not msgpack", codec.DecodeError, r"datapoint 1 from ipc://.* does not decode"),
    # msgpack-numpy stores an object array as a pickle: named as such (not as a pickle frame)
    (codec.dumps([np.array(["a", 1], dtype=object)]), codec.PickleRefusedError,
     r"datapoint 1 from ipc://.*: the value holds an object array"),
])
def test_a_frame_that_does_not_decode_is_named(no_leaks, ipc_addr, frame, error, match):
    df = RemoteDataZMQ(ipc_addr)
    df.reset_state()
    it = iter(df)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(ipc_addr)
    push.send(frame)
    try:
        with pytest.raises(error, match=match):
            next(it)
    finally:
        push.close(0)
        ctx.term()


@pytest.mark.parametrize("tune", [True, False])
def test_both_ends_keep_freed_memory_unless_told_not_to(no_leaks, ipc_addr, monkeypatch, tune):
    import dataflow.remote as remote
    calls = []
    monkeypatch.setattr(remote, "keep_freed_memory", lambda: calls.append(1))
    with sender(ipc_addr):
        take(RemoteDataZMQ(ipc_addr, tune_malloc=tune), 1)
    assert len(calls) == (1 if tune else 0)
    calls.clear()
    with pytest.raises(TypeError, match="datapoint 0 cannot be encoded"):
        send_dataflow_zmq(D.DataFromList([[object()]]), ipc_addr, tune_malloc=tune)
    assert len(calls) == (1 if tune else 0)


def test_a_bad_high_water_mark_is_named():
    # send_dataflow_zmq raised a bare "ZMQError: Invalid argument"; RemoteDataZMQ took it
    with pytest.raises(ValueError, match="send_dataflow_zmq: hwm must be an int >= 0, got -1"):
        send_dataflow_zmq(D.DataFromList([[1]]), "ipc:///nonexistent/x", hwm=-1)
    with pytest.raises(ValueError, match="RemoteDataZMQ: hwm must be an int >= 0, got -1"):
        RemoteDataZMQ("ipc:///nonexistent/x", hwm=-1)


def test_zmq_ops_format_is_not_implemented():
    with pytest.raises(NotImplementedError, match="zmq_ops"):
        send_dataflow_zmq(D.DataFromList([[1]]), "ipc:///nonexistent/x", format="zmq_ops")
    with pytest.raises(ValueError, match="unknown format"):
        send_dataflow_zmq(D.DataFromList([[1]]), "ipc:///nonexistent/x", format="json")


def test_unencodable_datapoint_is_named(no_leaks, ipc_addr):
    df = D.DataFromList([[1], [object()]], shuffle=False)
    with pytest.raises(TypeError, match="datapoint 1 cannot be encoded as msgpack"):
        send_dataflow_zmq(df, ipc_addr, hwm=10)


def test_a_second_receiver_on_a_live_ipc_address_is_refused(no_leaks, ipc_addr):
    # ZeroMQ removes the socket file and binds anew: the second receiver silently took the
    # address, and the first, still running, never received again
    first = RemoteDataZMQ(ipc_addr)
    with sender(ipc_addr):
        first.reset_state()
        it = iter(first)
        assert_dp(next(it), 0)
        for second in (RemoteDataZMQ(ipc_addr), RemoteDataZMQ(ipc_addr, ipc_addr)):
            with pytest.raises(zmq.ZMQError, match="is in use") as info:
                take(second, 1)
            assert info.value.errno == errno.EADDRINUSE
        dp = next(it)
        assert_dp(dp, dp[0])
        assert os.path.exists(ipc_addr[len("ipc://"):])     # the refused ones left it alone
        it.close()
    # a socket file nobody listens on (as a killed process leaves it) is free to bind again
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(ipc_addr[len("ipc://"):])
    stale.close()
    with sender(ipc_addr):
        dp = take(RemoteDataZMQ(ipc_addr), 1)[0]
        assert_dp(dp, dp[0])


def test_a_bound_ipc_socket_file_is_removed_when_the_socket_closes(no_leaks, ipc_addr):
    # ZeroMQ leaves the file; it was left in the directory (say /tmp) after every run
    path = ipc_addr[len("ipc://"):]
    with sender(ipc_addr):
        df = RemoteDataZMQ(ipc_addr)
        df.reset_state()
        it = iter(df)
        assert_dp(next(it), 0)
        assert os.path.exists(path)
        df.close()
    assert not os.path.exists(path)
    with pytest.raises(ValueError, match="produced no datapoint"):    # the sender's end
        send_dataflow_zmq(D.DataFromList([]), ipc_addr, bind=True)
    assert not os.path.exists(path)


def test_close_ends_an_iteration_whose_thread_has_ended(no_leaks, ipc_addr):
    df = RemoteDataZMQ(ipc_addr)
    df.reset_state()
    got = []
    with sender(ipc_addr):
        def first():
            it = iter(df)
            got.append(next(it))
            got.append(it)             # kept, suspended, by a thread that then ends
        t = threading.Thread(target=first)
        t.start()
        t.join(30)
        df.close()                     # closed nothing: the sockets and the guard stayed
        dp = take(df, 1)[0]
        assert_dp(dp, dp[0])


def test_an_empty_dataflow_is_an_error_not_a_busy_loop(no_leaks, ipc_addr):
    with pytest.raises(ValueError, match="send_dataflow_zmq: a pass of DataFromList produced no "
                                         "datapoint"):
        send_dataflow_zmq(D.DataFromList([]), ipc_addr)


# ----------------------------------------------------------------------------------- CURVE

def handshake_fails(addr, server_public, client_pair=None):
    """Connect a raw CURVE PUSH client and wait (bounded) for its handshake to fail."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    public, secret = client_pair or curve_keypair()
    s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_public, public, secret
    mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH
                               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                               | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        s.connect(addr)
        s.send(codec.dumps([-1, np.zeros((3, 4), np.uint8), "bad"]))     # must never arrive
        if not mon.poll(20000):
            raise AssertionError("no handshake event within 20 s")
        return recv_monitor_message(mon)["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        s.disable_monitor()
        mon.close(0)
        s.close(0)
        ctx.term()


def test_curve_refuses_a_wrong_server_key_and_keeps_serving(no_leaks):
    addr = free_tcp_addr()
    server_public, server_secret = curve_keypair()
    wrong_public, _ = curve_keypair()
    df = RemoteDataZMQ(addr, curve_secret_key=server_secret)
    with sender(addr, curve_server_key=server_public):
        df.reset_state()
        it = iter(df)
        assert_dp(next(it), 0)
        assert handshake_fails(addr, wrong_public)
        out = [next(it) for _ in range(8)]
        it.close()
    for i, dp in enumerate(out, start=1):
        assert_dp(dp, i)                # nothing from the refused client in between


def test_curve_client_allowlist(no_leaks):
    addr = free_tcp_addr()
    server_public, server_secret = curve_keypair()
    good, stranger = curve_keypair(), curve_keypair()
    df = RemoteDataZMQ(addr, curve_secret_key=server_secret, curve_client_keys=[good[0]])
    with sender(addr, curve_server_key=server_public, curve_client_keypair=good):
        df.reset_state()
        it = iter(df)
        assert_dp(next(it), 0)
        assert handshake_fails(addr, server_public, stranger)     # right server key, unlisted
        out = [next(it) for _ in range(5)]
        it.close()
    for i, dp in enumerate(out, start=1):
        assert_dp(dp, i)


def test_curve_arguments_are_checked():
    _, secret = curve_keypair()
    with pytest.raises(ValueError, match="tcp://"):
        RemoteDataZMQ("ipc:///tmp/x", curve_secret_key=secret)
    with pytest.raises(ValueError, match="curve_client_keys needs curve_secret_key"):
        RemoteDataZMQ("tcp://127.0.0.1:1", curve_client_keys=[b"x" * 40])
    with pytest.raises(ValueError, match="tcp://"):
        send_dataflow_zmq(D.DataFromList([[1]]), "ipc:///tmp/x", curve_server_key=b"x" * 40)
    # a malformed key is named at once, and not echoed (it may be a secret)
    for bad in (b"short", "~" * 40, secret[:-1] + b"\x00", 7):
        with pytest.raises(ValueError, match="curve_secret_key must be a CURVE key") as info:
            RemoteDataZMQ("tcp://127.0.0.1:1", curve_secret_key=bad)
        assert "~~~" not in str(info.value)
        with pytest.raises(ValueError, match="curve_server_key must be a CURVE key"):
            send_dataflow_zmq(D.DataFromList([[1]]), "tcp://127.0.0.1:1", curve_server_key=bad)
    raw = RemoteDataZMQ("tcp://127.0.0.1:1", curve_secret_key=z85.decode(secret))
    assert raw.curve_secret_key == secret           # the 32 raw bytes are taken as well


# ---------------------------------------------------------------------- tensorpack, both ways

@pytest.mark.parametrize("serialize, allow_pickle", [("pickle", True), ("msgpack", False)])
def test_tensorpack_sender_to_our_receiver(no_leaks, ipc_addr, serialize, allow_pickle):
    with tensorpack_sender(ipc_addr, serialize):
        out = take(RemoteDataZMQ(ipc_addr, allow_pickle=allow_pickle), 6)
    for i, dp in enumerate(out):
        assert_dp(dp, i)


@pytest.mark.parametrize("fmt, serialize", [(None, "msgpack"), ("pickle", "pickle")])
def test_our_sender_to_tensorpack_receiver(no_leaks, ipc_addr, fmt, serialize):
    with sender(ipc_addr, format=fmt):
        out = run_tensorpack(f"""
            import json
            from tensorpack.dataflow import RemoteDataZMQ
            df = RemoteDataZMQ({ipc_addr!r})
            df.reset_state()
            it = iter(df)
            dps = [next(it) for _ in range(6)]
            print(json.dumps([[int(dp[0]), dp[1].tolist(), dp[1].dtype.str, dp[2]]
                              for dp in dps]))
        """, serialize=serialize)
    got = json.loads(out.strip().splitlines()[-1])
    for i, (k, arr, dtype, s) in enumerate(got):
        assert_dp([k, np.array(arr, dtype=dtype), s], i)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("with_sender", [False, True])
def test_close_from_another_thread_ends_the_running_iteration(no_leaks, ipc_addr, with_sender):
    # waiting for a frame (no sender) or receiving them: the consuming thread's loop ends
    # (the sockets are closed in that thread), and close() itself raises nothing
    df = D.BatchData(RemoteDataZMQ(ipc_addr), 2)
    df.reset_state()
    ended = []

    def consume():
        ended.append(sum(1 for _ in df))

    def receiving():
        # the consuming thread's iteration has begun (its generator runs, in that thread): a
        # close() before that would leave nothing to end, and the iteration would then wait
        # for senders for ever
        return any(owner[0] is t for _, owner in list(df.ds._active.values()))

    with (sender(ipc_addr, n=4) if with_sender else contextlib.nullcontext()):
        t = threading.Thread(target=consume)
        t.start()
        deadline = time.monotonic() + 10
        while not receiving() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert receiving()
        if with_sender:
            while df.ds.cnt1 < 10:        # datapoints are flowing
                time.sleep(0.01)
        df.close()
        t.join(5)
        assert not t.is_alive() and len(ended) == 1


@pytest.mark.parametrize("make, error, match", [
    # a string flag was taken by its truth: allow_pickle="False" unpickled what any sender sent
    (lambda a: RemoteDataZMQ(a, allow_pickle="False"), TypeError,
     "RemoteDataZMQ: allow_pickle must be True or False, got 'False'"),
    (lambda a: RemoteDataZMQ(a, bind="no"), TypeError, "RemoteDataZMQ: bind must be True or False"),
    # bind="False" bound, and the sender then waited for ever for a receiver that also bound
    (lambda a: send_dataflow_zmq(D.DataFromList([[1]]), a, bind="False"), TypeError,
     "send_dataflow_zmq: bind must be True or False"),
    (lambda a: send_dataflow_zmq([[1]], a), TypeError, "send_dataflow_zmq: expected a DataFlow"),
    (lambda a: send_dataflow_zmq(D.DataFromList([[1]]), a, format=[]), ValueError,
     r"send_dataflow_zmq: unknown format \[\]"),
    # addresses and high-water marks failed only when iteration started, with bare errors
    (lambda a: RemoteDataZMQ(5), TypeError, "RemoteDataZMQ: addr1 must be a ZeroMQ endpoint"),
    (lambda a: RemoteDataZMQ(a, b"ipc://x"), TypeError,
     "RemoteDataZMQ: addr2 must be a ZeroMQ endpoint"),
    (lambda a: RemoteDataZMQ("localhost:5555"), ValueError, "'transport://address'"),
    (lambda a: RemoteDataZMQ(a, hwm=2**31), ValueError, "hwm must be at most 2147483647"),
    (lambda a: send_dataflow_zmq(D.DataFromList([[1]]), None), TypeError,
     "send_dataflow_zmq: addr must be a ZeroMQ endpoint"),
    (lambda a: send_dataflow_zmq(D.DataFromList([[1]]), a, hwm=10**20), ValueError,
     "send_dataflow_zmq: hwm must be at most"),
    # libzmq took :99999 modulo 65536 and :5x as 5: a typo listened on another port
    (lambda a: RemoteDataZMQ("tcp://127.0.0.1:99999"), ValueError, "must be 0-65535 or"),
    (lambda a: send_dataflow_zmq(D.DataFromList([[1]]), "tcp://127.0.0.1:5x"), ValueError,
     "must be 0-65535 or"),
    (lambda a: RemoteDataZMQ("tcp://127.0.0.1:5555", curve_secret_key=zmq.curve_keypair()[1],
                             curve_client_keys=5), TypeError,
     "curve_client_keys must be a list of public keys"),
    (lambda a: send_dataflow_zmq(D.DataFromList([[1]]), "tcp://127.0.0.1:5555",
                                 curve_server_key=zmq.curve_keypair()[0], curve_client_keypair=5),
     TypeError, r"curve_client_keypair must be a pair \(public key, secret key\)"),
])
def test_bad_arguments_are_refused_before_any_socket(no_leaks, ipc_addr, make, error, match):
    with pytest.raises(error, match=match):
        make(ipc_addr)


def test_codec_refuses_a_pickle_flag_given_as_text():
    frame = pickle.dumps([1])
    with pytest.raises(TypeError, match="allow_pickle must be True or False, got 'False'"):
        codec.loads(frame, allow_pickle="False")
    assert codec.loads(frame, allow_pickle=1) == [1]            # 0/1 as tensorpack code passes
