"""Map functions of a module that imports torch at the top (tests/test_torch_workers.py): a
worker that loads one of them has torch before its first datapoint."""
import torch

import dataflow as D


def draw(dp):
    return [D.rng.worker_id(), float(torch.rand(1))]


def matmul_and_threads(dp):
    x = torch.ones(300, 300)
    return [dp[0], float((x @ x)[0, 0]), torch.get_num_threads()]
