"""Dataflows across processes and machines over ZeroMQ, wire-compatible with tensorpack 0.11.

``send_dataflow_zmq(df, addr)`` runs ``df`` forever and PUSHes every datapoint, one ZeroMQ
message of one frame per datapoint; ``RemoteDataZMQ(addr)`` PULLs them and yields them, from any
number of senders (fair-queued). By default the receiver binds and the senders connect, and
both sockets have the high-water mark ``hwm`` (a sender blocks when ``hwm`` datapoints are
queued). There is no header and no end-of-stream marker: a frame is the encoded datapoint.

Encodings (see :mod:`dataflow.formats.codec`): ``format=None`` sends msgpack frames in
msgpack-numpy's layout, which a tensorpack receiver reads with ``TENSORPACK_SERIALIZE=msgpack``;
``format="pickle"`` sends tensorpack 0.11's default frames. The receiver tells them apart from
the bytes, but **never unpickles unless built with** ``allow_pickle=True``: anyone who can
connect to its port could otherwise make it run arbitrary code. Arrays received as msgpack are
read-only views of the frame (no copy), as tensorpack's msgpack path gives them.

CURVE (encryption and authentication, for ``tcp://`` endpoints that cross machines): make a
key pair for the receiver with :func:`curve_keypair`, give the receiver its secret key
(``curve_secret_key=``) and every sender its public key (``curve_server_key=``). A sender
without the right server key cannot complete the handshake, so nothing it sends is accepted;
with ``curve_client_keys=[public keys]`` the receiver also accepts only those senders (each
sender then passes its own pair as ``curve_client_keypair=``). A refused sender does not disturb the
receiver, which keeps serving the others. ``ipc://`` endpoints are not encrypted; they are
protected by file permissions (not in Linux's abstract namespace, ``ipc://@name``).

Memory: ZeroMQ allocates every message, on both sides, so with glibc's default settings every
150 KB datapoint lands in fresh memory that page-faults in (more CPU than the rest of the
sending). Both ends therefore set glibc's malloc to keep freed memory in the process
(:func:`dataflow._malloc.keep_freed_memory`: blocks up to 32 MiB from the heap, up to 128 MiB of
freed heap kept); ``tune_malloc=False`` leaves the process's malloc as it is.
"""
import errno
import os
import socket
import sys
import threading
import weakref

import zmq
from zmq.utils import z85

from ._helpers import check_flag, check_int, repeat_forever
from ._malloc import keep_freed_memory
from .base import DataFlow, DataFlowReentrantGuard, EndlessError, check_dataflow
from .formats import codec

__all__ = ["send_dataflow_zmq", "RemoteDataZMQ", "curve_keypair"]

_ZAP_DOMAIN = "dataflow"          # the ZAP domain of receivers with a client allowlist
_SEND_FORMATS = {None: "msgpack", "msgpack": "msgpack", "pickle": "pickle"}


def curve_keypair():
    """A new CURVE key pair ``(public_key, secret_key)``, both Z85-encoded ``bytes`` (40
    characters). Give the secret key to the process that holds it and only the public one to
    its peers."""
    return zmq.curve_keypair()


def _key(key, name, who):
    """CURVE key ``key`` (argument ``name`` of ``who``) as 40 Z85 bytes: given as Z85 (bytes or
    str, as :func:`curve_keypair` makes them) or as the 32 raw bytes; ``ValueError`` otherwise."""
    if key is None:
        return None
    raw = key.encode("ascii", "replace") if isinstance(key, str) else key
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw)
        if len(raw) == 32:
            return z85.encode(raw)
        if len(raw) == 40:
            try:
                z85.decode(raw)
                return raw
            except (KeyError, ValueError):
                pass
    size = f"{len(key)} characters" if hasattr(key, "__len__") else "no length"
    raise ValueError(f"{who}: {name} must be a CURVE key, 40 Z85 characters as curve_keypair() "
                     f"makes them (or its 32 raw bytes), got a {type(key).__name__} of {size}"
                     + (" that are not all Z85" if size == "40 characters" else ""))


def _bind(sock, addr, who):
    """Bind ``sock`` to ``addr``. For ``ipc://path`` (not the abstract ``ipc://@name``), return
    the socket file's ``(path, st_dev, st_ino)``: ZeroMQ leaves the file when the socket closes,
    and :func:`_remove_socket_file` removes it then."""
    _check_ipc_free(addr, who)
    sock.bind(addr)
    if not addr.startswith("ipc://") or addr.startswith("ipc://@"):
        return None
    path = addr[len("ipc://"):]
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path, st.st_dev, st.st_ino


def _remove_socket_file(made):
    """Remove the socket file that :func:`_bind` made (after its socket is closed), unless the
    path is another file by now (a socket bound there since)."""
    if made is None:
        return
    path, dev, ino = made
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == (dev, ino):
            os.unlink(path)
    except OSError:
        pass


def _check_ipc_free(addr, who):
    """Before binding ``ipc://path``: ZeroMQ removes an existing socket file and binds anew,
    which would silently take the endpoint from a receiver still bound to it (its senders' new
    connections then reach this one). A file nobody listens on (left by a killed process) is
    fine; a live one raises ``zmq.ZMQError(EADDRINUSE)``, as a ``tcp://`` address in use does."""
    if not addr.startswith("ipc://") or addr.startswith("ipc://@"):
        return
    path = addr[len("ipc://"):]
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return                          # refused (stale), or not a socket: ZeroMQ decides
    finally:
        probe.close()
    raise zmq.ZMQError(errno.EADDRINUSE, f"{who}: {addr} is in use: another socket is bound "
                                         "to it and accepting connections")


def _is_tcp(addr):
    return addr.startswith("tcp://")


_MAX_HWM = 2**31 - 1          # ZeroMQ's high-water mark is a C int


def _check_hwm(who, hwm):
    """``hwm`` as an int in 0 (no limit, as ZeroMQ's) .. ZeroMQ's C int; else ``ValueError``
    naming ``who`` (a larger one failed only when the socket was made)."""
    hwm = check_int(f"{who}: hwm", hwm, 0)
    if hwm > _MAX_HWM:
        raise ValueError(f"{who}: hwm must be at most {_MAX_HWM}, got {hwm}")
    return hwm


def _check_endpoint(who, name, addr):
    """``addr`` if it is a ZeroMQ endpoint string (``transport://address``); else an error
    naming ``who`` and the argument, here rather than a bare one when iteration starts. A
    ``tcp://`` port must be 0-65535 or ``*``: libzmq takes ``:99999`` modulo 65536 and ``:5x``
    as 5, so a typo listened on a port no one meant."""
    if not isinstance(addr, str):
        raise TypeError(f"{who}: {name} must be a ZeroMQ endpoint string such as "
                        f"'tcp://host:port' or 'ipc:///path', got {addr!r}")
    if "://" not in addr:
        raise ValueError(f"{who}: {name} must be a ZeroMQ endpoint 'transport://address' "
                         f"(tcp, ipc, inproc), got {addr!r}")
    if _is_tcp(addr):
        port = addr.split(";", 1)[0].rsplit(":", 1)[-1]   # (";": a connect's source address)
        if port != "*" and not (port.isdigit() and int(port) <= 65535):
            raise ValueError(f"{who}: the port of {name}={addr!r} must be 0-65535 or '*'")
    return addr


# How long a receiver waits for a frame before it looks whether close() was called from
# another thread (a frame that arrives ends the wait at once).
_POLL_MS = 100


def send_dataflow_zmq(df, addr, hwm=50, format=None, bind=False, *, curve_server_key=None,
                      curve_client_keypair=None, tune_malloc=True):
    """Run ``df`` (``reset_state()`` once, then pass after pass, forever) and send each
    datapoint to ``addr`` on a PUSH socket. Never returns; stop it by ending the process.

    Args:
        df (DataFlow): the datapoints to send.
        addr (str): a ZeroMQ endpoint, e.g. ``"tcp://trainer:8877"`` or ``"ipc:///tmp/sock"``.
        hwm (int): the high-water mark: at most this many datapoints are queued.
        format: ``None`` (msgpack frames) or ``"pickle"`` (tensorpack's default frames).
            ``"zmq_ops"`` (tensorpack's TensorFlow op format) is not supported.
        bind (bool): bind ``addr`` instead of connecting to it.
        curve_server_key (bytes): the receiver's CURVE public key; enables CURVE (``tcp://``).
        curve_client_keypair (tuple): this sender's ``(public, secret)`` CURVE keys, when the receiver
            accepts only listed senders; a fresh pair is made otherwise.
        tune_malloc (bool): set this process's glibc malloc to keep freed memory (see the
            module doc); False leaves it as it is.
    """
    df = check_dataflow(df, "send_dataflow_zmq")
    if format in ("zmq_op", "zmq_ops"):
        raise NotImplementedError(
            "send_dataflow_zmq(format='zmq_ops') writes the frames of tensorpack's external "
            "zmq_ops TensorFlow op, which dataflow does not implement; use format=None "
            "(msgpack) or format='pickle', which RemoteDataZMQ and tensorpack read.")
    if not isinstance(format, (str, type(None))) or format not in _SEND_FORMATS:
        raise ValueError(f"send_dataflow_zmq: unknown format {format!r}; use None (msgpack) "
                         "or 'pickle'")
    bind = check_flag("send_dataflow_zmq: bind", bind)
    encoding = _SEND_FORMATS[format]
    hwm = _check_hwm("send_dataflow_zmq", hwm)
    _check_endpoint("send_dataflow_zmq", "addr", addr)
    if curve_client_keypair is not None and (
            isinstance(curve_client_keypair, (str, bytes)) or
            not isinstance(curve_client_keypair, (tuple, list)) or len(curve_client_keypair) != 2):
        raise TypeError(f"send_dataflow_zmq: curve_client_keypair must be a pair (public key, "
                        f"secret key), got {curve_client_keypair!r:.80}")
    if curve_server_key is None and curve_client_keypair is not None:
        raise ValueError("send_dataflow_zmq: curve_client_keypair needs curve_server_key (the "
                         "receiver's public key)")
    if curve_server_key is not None and not _is_tcp(addr):
        raise ValueError(f"send_dataflow_zmq: CURVE is for tcp:// endpoints, not {addr!r}")
    if tune_malloc:
        keep_freed_memory()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    made = None
    try:
        sock.set_hwm(hwm)
        if curve_server_key is not None:
            public, secret = (curve_client_keypair if curve_client_keypair is not None
                              else zmq.curve_keypair())
            who = "send_dataflow_zmq"
            sock.curve_serverkey = _key(curve_server_key, "curve_server_key", who)
            sock.curve_publickey = _key(public, "curve_client_keypair[0]", who)
            sock.curve_secretkey = _key(secret, "curve_client_keypair[1]", who)
        if bind:
            made = _bind(sock, addr, "send_dataflow_zmq")
        else:
            sock.connect(addr)
        df.reset_state()
        # msgpack frames are packed into one buffer reused from frame to frame, and ZeroMQ
        # copies each into its message (a fresh buffer per frame costs page faults: about 25x
        # slower for 150 KB arrays).
        encode = codec.Encoder(encoding)
        send = sock.send
        index = 0
        for dp in repeat_forever(df, "send_dataflow_zmq"):
            try:
                frame = encode(dp)
            except TypeError as e:
                raise TypeError(f"send_dataflow_zmq: datapoint {index} cannot be encoded "
                                f"as {encoding}: {e}") from e
            send(frame, copy=True)          # ZeroMQ copies the frame: the buffer is reusable
            index += 1
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)
        _remove_socket_file(made)


class RemoteDataZMQ(DataFlow):
    """The datapoints that senders (:func:`send_dataflow_zmq`, ours or tensorpack's) push to
    ``addr1`` (and ``addr2``, if given), in arrival order; an endless iteration, no ``len()``.

    The sockets are made when iteration starts and closed when it ends (``close()``, or the
    iterator being closed or collected). ``cnt1``/``cnt2`` count the datapoints received from
    each address since ``reset_state()``. Not reentrant.

    Args:
        addr1, addr2 (str): ZeroMQ endpoints to receive on.
        hwm (int): the high-water mark of the receiving sockets.
        bind (bool): bind the addresses (default) rather than connect to them.
        allow_pickle (bool): decode pickle frames. Off by default: a pickle frame then raises
            ``PickleRefusedError`` in the consumer, since anyone who can reach the port could
            run code here. Turn it on only when every sender is trusted.
        curve_secret_key (bytes): this receiver's CURVE secret key; its ``tcp://`` sockets
            then accept only CURVE senders that know the matching public key.
        curve_client_keys (iterable of bytes): if given, the public keys of the only senders
            accepted (needs ``curve_secret_key``).
        tune_malloc (bool): when iteration starts, set this process's glibc malloc to keep
            freed memory (see the module doc); False leaves it as it is.
    """

    def __init__(self, addr1, addr2=None, hwm=50, bind=True, *, allow_pickle=False,
                 curve_secret_key=None, curve_client_keys=None, tune_malloc=True):
        if not addr1:
            raise ValueError("RemoteDataZMQ: addr1 is required")
        self.addr1 = _check_endpoint("RemoteDataZMQ", "addr1", addr1)
        self.addr2 = _check_endpoint("RemoteDataZMQ", "addr2", addr2) if addr2 else addr2
        self.hwm = _check_hwm("RemoteDataZMQ", hwm)
        who = "RemoteDataZMQ"
        self.bind = check_flag(f"{who}: bind", bind)
        self.allow_pickle = check_flag(f"{who}: allow_pickle", allow_pickle)
        self.tune_malloc = check_flag(f"{who}: tune_malloc", tune_malloc)
        self.curve_secret_key = _key(curve_secret_key, "curve_secret_key", who)
        if curve_client_keys is not None and (isinstance(curve_client_keys, (str, bytes)) or
                                              not hasattr(curve_client_keys, "__iter__")):
            raise TypeError(f"{who}: curve_client_keys must be a list of public keys, got "
                            f"{curve_client_keys!r:.80}")
        self.curve_client_keys = (None if curve_client_keys is None
                                  else [_key(k, "curve_client_keys[%d]" % i, who)
                                        for i, k in enumerate(curve_client_keys)])
        addrs = [a for a in (addr1, addr2) if a]
        if self.curve_client_keys is not None and curve_secret_key is None:
            raise ValueError("RemoteDataZMQ: curve_client_keys needs curve_secret_key")
        if curve_secret_key is not None and not any(_is_tcp(a) for a in addrs):
            raise ValueError(f"RemoteDataZMQ: CURVE is for tcp:// endpoints; none in {addrs}")
        self.cnt1 = self.cnt2 = 0
        self._guard = DataFlowReentrantGuard()
        # the running iterations, for close(); held weakly, so that an iteration its caller
        # dropped is collected at once (its sockets closed), as tensorpack's is, and a new one
        # can start
        self._active = weakref.WeakKeyDictionary()     # running iterations -> their stop

    def __len__(self):
        raise EndlessError("RemoteDataZMQ is endless: len() is unavailable")

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_active"]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._active = weakref.WeakKeyDictionary()

    def reset_state(self):
        self.cnt1 = self.cnt2 = 0

    def close(self):
        """End running iterations (their sockets are closed); idempotent. An iteration that
        another thread is running ends there: at once if it is waiting for a datapoint (within
        ``_POLL_MS``), else before its next one."""
        active, self._active = list(self._active.items()), weakref.WeakKeyDictionary()
        here = threading.current_thread()
        for gen, (stop, owner) in active:
            stop.set()
            # another thread's iteration ends in that thread, which owns its sockets: at its
            # next step, or within _POLL_MS if it is waiting for a frame; one whose thread has
            # ended (leaving it suspended) is closed here
            if owner[0] is None or owner[0] is here or not owner[0].is_alive():
                try:
                    gen.close()
                except ValueError:      # (running: it sees ``stop``)
                    pass

    def __iter__(self):
        stop, owner = threading.Event(), [None]
        gen = self._receive(stop, owner)
        self._active[gen] = (stop, owner)
        return gen

    def _socket(self, ctx, addr):
        sock = ctx.socket(zmq.PULL)
        sock.set_hwm(self.hwm)
        if self.curve_secret_key is not None and _is_tcp(addr):
            sock.curve_server = True
            sock.curve_secretkey = self.curve_secret_key
            sock.curve_publickey = zmq.curve_public(self.curve_secret_key)
            if self.curve_client_keys is not None:
                sock.zap_domain = _ZAP_DOMAIN.encode()
        if self.bind:
            return sock, _bind(sock, addr, "RemoteDataZMQ")
        sock.connect(addr)
        return sock, None

    def _receive(self, stop, owner):
        owner[0] = threading.current_thread()
        with self._guard:
            if self.tune_malloc:
                keep_freed_memory()
            ctx = zmq.Context()
            auth = None
            socks, files = [], []
            try:
                if self.curve_client_keys is not None:
                    auth = _start_authenticator(ctx, self.curve_client_keys)
                for a in (self.addr1, self.addr2):
                    if a:
                        sock, made = self._socket(ctx, a)
                        socks.append(sock)
                        files.append(made)
                if len(socks) == 1:
                    socks[0].rcvtimeo = _POLL_MS     # to look at ``stop`` while no data comes
                    recv = socks[0].recv
                    while not stop.is_set():
                        try:
                            frame = recv(copy=False)
                        except zmq.Again:
                            continue
                        self.cnt1 += 1
                        yield self._decode(frame, self.addr1, self.cnt1)
                else:
                    poller = zmq.Poller()
                    for s in socks:
                        poller.register(s, zmq.POLLIN)
                    while not stop.is_set():
                        for s, _ in poller.poll(_POLL_MS):
                            frame = s.recv(copy=False)
                            if s is socks[0]:
                                self.cnt1 += 1
                                addr, n = self.addr1, self.cnt1
                            else:
                                self.cnt2 += 1
                                addr, n = self.addr2, self.cnt2
                            yield self._decode(frame, addr, n)
            finally:
                for sock in socks:
                    sock.close(linger=0)
                if auth is not None:
                    auth.stop()
                if not sys.is_finalizing():     # at exit pyzmq may have dropped its sockets
                    ctx.destroy(linger=0)       # already; terminating could then block
                for made in files:
                    _remove_socket_file(made)

    def _decode(self, frame, addr, n):
        try:
            return codec.loads(frame.buffer, allow_pickle=self.allow_pickle)
        except codec.PickleRefusedError as e:
            if codec.sniff(frame.buffer) != "pickle":   # an object array inside msgpack
                raise codec.PickleRefusedError(f"RemoteDataZMQ: datapoint {n} from {addr}: "
                                               f"{e}") from None
            raise codec.PickleRefusedError(
                f"RemoteDataZMQ: datapoint {n} from {addr} is a pickle frame, and unpickling "
                "runs whatever code the frame names: anyone who can connect to this endpoint "
                "could run code in this process. Send msgpack frames instead "
                "(send_dataflow_zmq(..., format=None); tensorpack: TENSORPACK_SERIALIZE="
                "msgpack), or pass RemoteDataZMQ(..., allow_pickle=True) if every sender is "
                "trusted.") from None
        except codec.DecodeError as e:
            raise codec.DecodeError(f"RemoteDataZMQ: datapoint {n} from {addr} does not "
                                    f"decode: {e}") from e


def _start_authenticator(ctx, client_keys):
    """A ZAP handler (a thread of pyzmq's) that admits CURVE clients with a listed key."""
    from zmq.auth.thread import ThreadAuthenticator

    allowed = frozenset(client_keys)

    class _Allowed:
        def callback(self, domain, key):
            return key in allowed

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(_ZAP_DOMAIN, credentials_provider=_Allowed())
    return auth
