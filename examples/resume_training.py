"""Checkpoint and resume a training job mid-epoch, exactly.

Run it as is: it trains a small model on a shuffled, randomly augmented, parallel pipeline
three times and compares what each run consumed:

1. without interruption;
2. killed with SIGKILL at a random step (a preempted job), then started again: the restarted
   job loads the model and the dataflow's state_dict() saved next to it, and continues.

It prints whether the datapoints consumed by run 2, in order, equal those of run 1 (they do)
and whether the trained weights are the same. ``--train DIR`` runs one training job (what
the runs above start)."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

import dataflow as D
from dataflow import rng

STEPS = 60          # training steps (batches) of a job
SAVE_EVERY = 4      # steps between checkpoints


def augment(dp):
    """A random augmentation: its draws come from the datapoint's own random stream, so the
    resumed job sees the same augmented datapoints."""
    x, y, i = dp
    return [x + rng.datapoint_rng().normal(0, 0.05, x.shape).astype("float32"), y, i]


def pipeline():
    data = np.random.RandomState(0)
    xs = data.normal(size=(200, 8)).astype("float32")
    ys = (xs @ np.arange(8, dtype="float32") > 0).astype("float32")
    df = D.DataFromList([[xs[i], ys[i], i] for i in range(len(xs))], shuffle=True)
    df = D.LocallyShuffleData(df, buffer_size=32)
    df = D.MapData(df, augment, num_parallel_workers=2)         # ordered, exactly once
    return D.BatchData(df, 16)


def save(path, payload):
    """Write ``payload`` (JSON) so that a crash leaves either the old file or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def train(workdir):
    """One training job: resumes from ``workdir/checkpoint.json`` if it exists."""
    D.set_seed(1234)
    ckpt = os.path.join(workdir, "checkpoint.json")
    log_path = os.path.join(workdir, "consumed.log")
    df = pipeline()
    w, step = np.zeros(8, "float32"), 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            saved = json.load(f)
        w, step = np.array(saved["weights"], "float32"), saved["step"]
        df.load_state_dict(saved["dataflow"])       # the data position, next to the model
        with open(log_path, "r+") as log:             # drop what the lost steps logged
            kept = log.read().splitlines()[:step]
            log.seek(0)
            log.truncate()
            log.write("".join(line + "\n" for line in kept))
        print(f"resumed at step {step}", flush=True)
    elif os.path.exists(log_path):                    # killed before its first checkpoint:
        os.remove(log_path)                           # it starts over, and so does the log
    df.reset_state()
    with open(log_path, "a") as log:
        batches = iter(df)
        while step < STEPS:
            try:
                x, y, ids = next(batches)
            except StopIteration:                     # end of an epoch: start the next
                batches = iter(df)
                continue
            p = 1 / (1 + np.exp(-(x @ w)))
            w -= 0.5 * x.T @ (p - y) / len(y)         # one step of logistic regression
            step += 1
            log.write(json.dumps(ids.tolist()) + "\n")
            log.flush()
            if step % SAVE_EVERY == 0:
                save(ckpt, {"step": step, "weights": w.tolist(),
                            "dataflow": df.state_dict()})
            print(f"step {step}", flush=True)
    df.close()
    np.save(os.path.join(workdir, "weights.npy"), w)


def job(workdir, kill_at=None):
    """Run ``--train workdir`` in a new process; SIGKILL it after step ``kill_at``."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--train", workdir],
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if kill_at is not None and line.strip() == f"step {kill_at}":
            proc.kill()
            print(f"  killed with SIGKILL after step {kill_at}")
            break
    proc.wait()
    return proc.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", metavar="DIR", help="run one training job in DIR")
    parser.add_argument("--seed", type=int, default=None, help="picks the kill step")
    args = parser.parse_args()
    if args.train:
        return train(args.train)
    with tempfile.TemporaryDirectory() as tmp:
        whole, killed = os.path.join(tmp, "whole"), os.path.join(tmp, "killed")
        os.mkdir(whole)
        os.mkdir(killed)
        print("run 1: uninterrupted")
        assert job(whole) == 0
        kill_at = random.Random(args.seed).randint(1, STEPS - 1)
        print("run 2: preempted, then restarted")
        job(killed, kill_at=kill_at)
        assert job(killed) == 0
        logs = [open(os.path.join(d, "consumed.log")).read() for d in (whole, killed)]
        weights = [np.load(os.path.join(d, "weights.npy")) for d in (whole, killed)]
        same = logs[0] == logs[1]
        verdict = "the same datapoints, in the same order" if same else "DIFFERENT datapoints"
        print(f"datapoints consumed: {len(logs[0].splitlines())} batches; the killed and "
              f"resumed run consumed {verdict}")
        print(f"weights equal: {bool(np.array_equal(weights[0], weights[1]))}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
