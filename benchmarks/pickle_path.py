"""What one pickled object costs in the process transport's codec, against pickling it.

``python -m benchmarks.pickle_path [--repeats 7] [--number 20000]``

The process transport encodes each datapoint with ``serialize.dumps_oob(dp, buffers,
allow_pickle=True)`` in the worker and decodes it with ``serialize.loads_oob`` in the consumer;
objects msgpack does not carry (a ``set``, a ``Fraction``, a dataclass, ...) are pickled one by
one (protocol 5). Each row times a datapoint with such an object among its items and the same
datapoint with a list in its place (``[np.zeros(3), {"meta": {1, 2, 3}}]`` against
``[np.zeros(3), {"meta": [1, 2, 3]}]``, and the like), encode and decode; ``extra`` is the
difference, the cost of the object in the codec, shown beside ``pickle.dumps(obj, protocol=5)``
and ``pickle.loads`` of the object alone. Times are in microseconds per call: the minimum over
``--repeats`` runs of the mean of ``--number`` calls, the four calls of a row interleaved run by
run so that machine noise hits them alike. For figures that do not depend on the load, count
instructions instead (``valgrind --tool=callgrind``): the extra encode cost is then about 2.5
times ``pickle.dumps`` for a small set, the extra decode cost about 1.3 times ``pickle.loads``
(the record that holds the pickle, a search of it for ``__main__``, and msgpack's call of the
hook).
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


def _timers(obj, plain):
    with_obj = [np.zeros(3), {"meta": obj}]
    without = [np.zeros(3), {"meta": plain}]
    T = serialize.DEFAULT_OOB_THRESHOLD
    bufs_w, bufs_o = [], []
    head_w = serialize.dumps_oob(with_obj, bufs_w, T, allow_pickle=True)
    head_o = serialize.dumps_oob(without, bufs_o, T, allow_pickle=True)
    data = pickle.dumps(obj, protocol=5)
    assert pickle.loads(data) == obj
    assert serialize.loads_oob(head_w, bufs_w, allow_pickle=True)[1]["meta"] == obj
    return {
        "enc": lambda: serialize.dumps_oob(with_obj, [], T, allow_pickle=True),
        "enc0": lambda: serialize.dumps_oob(without, [], T, allow_pickle=True),
        "dec": lambda: serialize.loads_oob(head_w, bufs_w, allow_pickle=True),
        "dec0": lambda: serialize.loads_oob(head_o, bufs_o, allow_pickle=True),
        "dumps": lambda: pickle.dumps(obj, protocol=5),
        "loads": lambda: pickle.loads(data),
        "nop": lambda: None,       # the cost of calling a timed function, taken off the others
    }


def measure(obj, plain, repeats, number):
    timers = _timers(obj, plain)
    best = {k: float("inf") for k in timers}
    for _ in range(repeats):
        for k, f in timers.items():
            best[k] = min(best[k], timeit.timeit(f, number=number) / number * 1e6)
    nop = best.pop("nop")
    return {k: v - nop for k, v in best.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args(argv)
    head = (f"{'object':<22}{'encode':>8}{'without':>9}{'extra':>8}{'dumps':>8}   "
            f"{'decode':>8}{'without':>9}{'extra':>8}{'loads':>8}   (us per call)")
    print(head)
    for name, obj, plain in cases():
        t = measure(obj, plain, args.repeats, args.number)
        print(f"{name:<22}{t['enc']:8.2f}{t['enc0']:9.2f}{t['enc'] - t['enc0']:8.2f}"
              f"{t['dumps']:8.2f}   {t['dec']:8.2f}{t['dec0']:9.2f}{t['dec'] - t['dec0']:8.2f}"
              f"{t['loads']:8.2f}")


if __name__ == "__main__":
    main()
