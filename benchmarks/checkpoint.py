"""What checkpointing costs: ``python -m benchmarks.checkpoint``.

Prints, for the README's "Checkpoint and resume":

* the time of ``state_dict()`` on a ten-stage pipeline with thread and process maps, taken
  between datapoints while the workers run (median and 99th percentile of 2000 calls), and
  with ``json.dumps``;
* the JSON size of the state of ``LocallyShuffleData(buffer_size=B)`` over 1 MB datapoints,
  early and 3000 datapoints later, and the time to resume it (re-reading the B buffered
  datapoints), early and late.
"""
import argparse
import json
import time

import numpy as np

import dataflow as D
from dataflow import rng


def noisy(dp):
    return [dp[0], int(rng.datapoint_rng().integers(1000))]


def same(dp):
    return dp


def ten_stages():
    df = D.DataFromList([[k] for k in range(100000)])                 # 1
    df = D.MapData(df, noisy)                                          # 2
    df = D.MultiThreadMapData(df, 3, noisy, strict=True, ordered=True)  # 3
    df = D.MapData(df, noisy)                                          # 4
    df = D.MultiProcessMapData(df, 2, noisy, strict=True)              # 5 (unordered)
    df = D.MapData(df, same)                                           # 6
    df = D.RepeatedData(df, 5)                                         # 7
    df = D.BatchData(df, 8)                                            # 8
    df = D.MapData(df, same)                                           # 9
    return D.FixedSizeData(df, 5000)                                   # 10


def megabyte(dp):
    return [np.full(1 << 20, dp[0] % 251, dtype="uint8"), dp[0]]


def shuffled(buffer_size):
    return D.LocallyShuffleData(D.MapData(D.DataFromList([[k] for k in range(100000)]),
                                          megabyte), buffer_size)


def state_dict_cost(calls):
    D.set_seed(1)
    df = ten_stages()
    df.reset_state()
    it = iter(df)
    for _ in range(200):
        next(it)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        state = df.state_dict()
        times.append(time.perf_counter() - t0)
        next(it)
    t0 = time.perf_counter()
    for _ in range(200):
        json.dumps(df.state_dict())
    with_json = (time.perf_counter() - t0) / 200
    df.close()
    times.sort()
    print(f"ten-stage pipeline (3 threads, 2 processes): state_dict() median "
          f"{times[len(times) // 2] * 1e6:.0f} us, p99 {times[int(len(times) * 0.99)] * 1e6:.0f}"
          f" us; with json.dumps {with_json * 1e6:.0f} us; {len(json.dumps(state))} bytes")


def buffer_state(buffer_size):
    sizes, resumes = [], []
    for steps in (buffer_size + 10, buffer_size + 3010):
        D.set_seed(1)
        df = shuffled(buffer_size)
        df.reset_state()
        it = iter(df)
        for _ in range(steps):
            next(it)
        text = json.dumps(df.state_dict())
        sizes.append(len(text))
        del it, df                       # free its buffer before the resume fills another
        D.set_seed(1)
        again = shuffled(buffer_size)
        again.load_state_dict(json.loads(text))
        again.reset_state()
        t0 = time.perf_counter()
        next(iter(again))
        resumes.append(time.perf_counter() - t0)
    print(f"LocallyShuffleData(buffer_size={buffer_size}) over 1 MB datapoints: state "
          f"{sizes[0]} bytes after {buffer_size + 10} datapoints, {sizes[1]} after "
          f"{buffer_size + 3010}; resume (first datapoint) {resumes[0] * 1e3:.0f} ms, "
          f"{resumes[1] * 1e3:.0f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    state_dict_cost(args.calls)
    for b in (100, 1000):
        buffer_state(b)


if __name__ == "__main__":
    main()
