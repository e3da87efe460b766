"""What one pickled object costs in the process transport's codec, against pickling it.

``python -m benchmarks.pickle_path [--repeats 7] [--number 20000]``

The process transport encodes the datapoints of one message with ``serialize.dumps_oob(dp,
buffers, allow_pickle=True, to_pickle=objects)`` in the worker: objects msgpack does not carry (a
``set``, a ``Fraction``, a dataclass, ...) are set aside, and ``serialize.pickle_objects`` pickles
them all at once (protocol 5) for the message; the consumer decodes with ``serialize.loader_oob(
buffers, allow_pickle=True, pickled=record)``. Each row times a message of ``MESSAGE`` (64, the
transport's chunk) datapoints with such an object among each one's items, and the same message with
a list in its place (``[np.zeros(3), {"meta": {1, 2, 3}}]`` against ``[np.zeros(3), {"meta": [1,
2, 3]}]``, and the like), encode and decode, per datapoint; ``extra`` is the difference, the cost
of the object in the transport, shown beside ``pickle.dumps(obj, protocol=5)`` and
``pickle.loads`` of the object alone. The ``alone`` columns are the extra cost when a datapoint is
encoded on its own (``dumps_oob`` without ``to_pickle``: the object pickled in place). Times are
in microseconds: the minimum over ``--repeats`` runs of the mean of ``--number`` datapoints,
the calls of a row interleaved run by run so that machine noise hits them alike.
"""
import argparse
import dataclasses
import fractions
import pickle
import timeit

import numpy as np

from dataflow import serialize


@dataclasses.dataclass
class Record:
    name: str
    score: float


def cases():
    """(row, the object, the same datapoint's plain stand-in for it)."""
    # Record as imported by its module's name (plain pickle), and as a class of __main__ (when
    # run with -m this module is __main__): cloudpickle then carries the class by value.
    from benchmarks.pickle_path import Record as Imported
    return [
        ("set of 3 ints", {1, 2, 3}, [1, 2, 3]),
        ("Fraction", fractions.Fraction(1, 3), [1, 3]),
        ("dataclass", Imported("a", 0.5), ["a", 0.5]),
        ("frozenset of 20 str", frozenset(f"tag{i}" for i in range(20)),
         [f"tag{i}" for i in range(20)]),
        (f"dataclass of {Record.__module__}", Record("a", 0.5), ["a", 0.5]),
    ]


MESSAGE = 64


def _timers(obj, plain):
    with_obj = [np.zeros(3), {"meta": obj}]
    without = [np.zeros(3), {"meta": plain}]
    T = serialize.DEFAULT_OOB_THRESHOLD

    def encode_message(dp):
        buffers, objects = [], []
        headers = [serialize.dumps_oob(dp, buffers, T, allow_pickle=True, to_pickle=objects)
                   for _ in range(MESSAGE)]
        pickled = serialize.pickle_objects(objects, buffers, T) if objects else None
        return headers, buffers, pickled

    def decode_message(message):
        headers, buffers, pickled = message
        load = serialize.loader_oob(buffers, allow_pickle=True, pickled=pickled)
        return [load(h) for h in headers]

    msg_w, msg_o = encode_message(with_obj), encode_message(without)
    assert msg_o[2] is None and decode_message(msg_w)[-1][1]["meta"] == obj
    bufs_w, bufs_o = [], []
    head_w = serialize.dumps_oob(with_obj, bufs_w, T, allow_pickle=True)
    head_o = serialize.dumps_oob(without, bufs_o, T, allow_pickle=True)
    data = pickle.dumps(obj, protocol=5)
    assert pickle.loads(data) == obj
    assert serialize.loads_oob(head_w, bufs_w, allow_pickle=True)[1]["meta"] == obj
    # (name, function, calls per datapoint): each time is then per datapoint
    return {
        "enc": (lambda: encode_message(with_obj), MESSAGE),
        "enc0": (lambda: encode_message(without), MESSAGE),
        "dec": (lambda: decode_message(msg_w), MESSAGE),
        "dec0": (lambda: decode_message(msg_o), MESSAGE),
        "enc1": (lambda: serialize.dumps_oob(with_obj, [], T, allow_pickle=True), 1),
        "enc10": (lambda: serialize.dumps_oob(without, [], T, allow_pickle=True), 1),
        "dec1": (lambda: serialize.loads_oob(head_w, bufs_w, allow_pickle=True), 1),
        "dec10": (lambda: serialize.loads_oob(head_o, bufs_o, allow_pickle=True), 1),
        "dumps": (lambda: pickle.dumps(obj, protocol=5), 1),
        "loads": (lambda: pickle.loads(data), 1),
        "nop": (lambda: None, 1),   # the cost of calling a timed function, taken off the others
    }


def measure(obj, plain, repeats, number):
    timers = _timers(obj, plain)
    best = {k: float("inf") for k in timers}
    for _ in range(repeats):
        for k, (f, per) in timers.items():
            calls = max(1, number // per)
            best[k] = min(best[k], timeit.timeit(f, number=calls) / (calls * per) * 1e6)
    nop = best.pop("nop")
    return {k: v - nop / (timers[k][1]) for k, v in best.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args(argv)
    print(f"{'':<22}{'in a message of ' + str(MESSAGE):-^36}   {'alone':-^15}")
    print(f"{'object':<22}{'encode':>8}{'extra':>8}{'decode':>8}{'extra':>8}   "
          f"{'encode':>7}{'decode':>8}   {'dumps':>6}{'loads':>7}   (us per datapoint; "
          "extra: over the same without the object)")
    for name, obj, plain in cases():
        t = measure(obj, plain, args.repeats, args.number)
        print(f"{name:<22}{t['enc']:8.2f}{t['enc'] - t['enc0']:8.2f}{t['dec']:8.2f}"
              f"{t['dec'] - t['dec0']:8.2f}   {t['enc1'] - t['enc10']:7.2f}"
              f"{t['dec1'] - t['dec10']:8.2f}   {t['dumps']:6.2f}{t['loads']:7.2f}")


if __name__ == "__main__":
    main()
