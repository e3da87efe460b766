#!/usr/bin/env python
"""A text pipeline: tokenize lines in worker processes, then batch them by length.

    python examples/text_pipeline.py                     # 20000 synthetic sentences
    python examples/text_pipeline.py --data corpus.txt   # one sentence per line

Without ``--data`` it first writes a synthetic corpus (sentences of made-up words with a Zipf-like
word frequency and lengths from 3 to about 100 tokens) to ``$DATAFLOW_CACHE/corpus.txt``
(default ``~/.cache/dataflow-examples``), once.

The pipeline, one datapoint = ``[token ids, length]``::

    DataFromList([[line], ...], shuffle=True)
      -> MapData(Tokenizer(vocab), num_parallel_workers=2, python_multiprocessing=True)
      -> BucketBatchData(boundaries [16, 32, 64], batch sizes [64, 32, 16, 8],
                         pad_info={0: (None, PAD)})   # [int32 (B, max_len), int32 (B,)]

The tokenizer is plain Python (lowercase, regex split, dict look-ups): it holds the GIL, so the
run-in-thread table runs it in worker processes. Bucketing puts sentences of similar length in a
batch, so padding each batch to its longest sentence wastes little; the script prints the share
of real tokens in the padded batches next to the throughput.
"""
import argparse
import collections
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dataflow import BucketBatchData, DataFromList, MapData
from dataflow.parallel.policy import describe_choice

PAD, UNK = 0, 1
TOKEN_RE = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")


def cache_dir():
    """Where the examples keep generated data: ``$DATAFLOW_CACHE`` or
    ``~/.cache/dataflow-examples``."""
    return Path(os.environ.get("DATAFLOW_CACHE") or "~/.cache/dataflow-examples").expanduser()


# --- the synthetic corpus --------------------------------------------------------------------

def _make_words(rng, n):
    """``n`` distinct made-up words of 1 to 3 syllables."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables, size=int(rng.integers(1, 4)))))
    return sorted(words)


def make_corpus(path, num_lines=20000, seed=0):
    """Write ``num_lines`` synthetic sentences to ``path`` unless it exists; returns ``path``.
    Written to a temporary file and renamed, so ``path`` is never a partial corpus."""
    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = rng.permutation(_make_words(rng, 3000))
    freq = 1.0 / np.arange(1, len(words) + 1)          # Zipf: a few very common words
    freq /= freq.sum()
    # what rng.choice(words, size=n, p=freq) draws, without checking freq again on each call
    cdf = freq.cumsum()
    cdf /= cdf[-1]
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".partial-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            for _ in range(num_lines):
                n = int(np.clip(rng.lognormal(2.8, 0.6), 3, 100))
                sentence = list(words[cdf.searchsorted(rng.random(n), side="right")])
                for i in rng.integers(0, n - 1, size=n // 8):   # a few commas
                    sentence[i] += ","
                end = "?" if rng.random() < 0.2 else "."
                f.write(" ".join(sentence).capitalize() + end + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# --- tokenizing ------------------------------------------------------------------------------

def tokenize(text):
    """Lowercase, then split into words and punctuation marks."""
    return TOKEN_RE.findall(text.lower())


def build_vocab(lines, min_count=2):
    """``{token: id}`` for the tokens seen at least ``min_count`` times, most frequent first,
    after ``<pad>`` (0) and ``<unk>`` (1)."""
    counts = collections.Counter(tok for line in lines for tok in tokenize(line))
    vocab = {"<pad>": PAD, "<unk>": UNK}
    for tok, c in counts.most_common():
        if c < min_count:
            break
        vocab[tok] = len(vocab)
    return vocab


class Tokenizer:
    """The map function: ``[line] -> [int32 array of token ids, number of tokens]``; an empty
    line is dropped (``None``)."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, dp):
        ids = [self.vocab.get(tok, UNK) for tok in tokenize(dp[0])]
        if not ids:
            return None
        return [np.array(ids, dtype=np.int32), len(ids)]


def build_pipeline(lines, vocab, workers=2):
    """The bucketed, padded batches of the tokenized ``lines``; ``.ds`` is the map stage."""
    ds = DataFromList([[line] for line in lines], shuffle=True)
    tokenizer = Tokenizer(vocab)
    print("executor chosen by the table:", describe_choice(tokenizer, workers, True))
    mapped = MapData(ds, tokenizer, num_parallel_workers=workers, python_multiprocessing=True)
    return BucketBatchData(
        mapped,
        bucket_boundaries=[16, 32, 64],           # buckets [0,16) [16,32) [32,64) [64,inf)
        bucket_batch_sizes=[64, 32, 16, 8],       # about 1000 tokens per batch
        pad_info={0: (None, PAD)},                # pad the ids to the longest in the batch
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a text file, one sentence per line (default: synthetic)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, help="use only the first N lines (smoke tests)")
    args = p.parse_args(argv)
    if args.data and not Path(args.data).is_file():
        p.error(f"--data {args.data}: no such file")
    if min(args.workers, args.epochs, args.limit or 1) < 1:
        p.error("--workers, --epochs and --limit must be positive")

    path = Path(args.data) if args.data else make_corpus(cache_dir() / "corpus.txt")
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if args.limit:
        lines = lines[:args.limit]
    vocab = build_vocab(lines)
    print(f"{len(lines)} lines from {path}, vocabulary of {len(vocab)} tokens")

    batches = build_pipeline(lines, vocab, args.workers)
    n_sentences = n_tokens = n_padded = n_batches = 0
    shapes = collections.Counter()
    seconds = 0.0
    try:
        batches.reset_state()                   # starts the workers
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            for ids, lengths in batches:
                if n_batches < 5:
                    print(f"batch {n_batches}: ids {ids.dtype} {ids.shape}, lengths "
                          f"{lengths.min()}..{lengths.max()}")
                n_batches += 1
                n_sentences += len(lengths)
                n_tokens += int(lengths.sum())
                n_padded += ids.size
                shapes[ids.shape[1]] += 1
            seconds += time.perf_counter() - t0
            print(f"epoch {epoch + 1}/{args.epochs} done", flush=True)
    finally:
        batches.close()     # stops the worker processes of the map
    if not n_batches:
        raise SystemExit("no batch: the text has no non-empty line")
    widths = sorted(shapes)
    print(f"{n_batches} batches, padded lengths {widths[0]}..{widths[-1]}; real tokens are "
          f"{100 * n_tokens / n_padded:.1f}% of the padded batches")
    print(f"throughput: {n_sentences / seconds:.1f} sentences/s, {n_tokens / seconds:.0f} "
          f"tokens/s, {n_batches / seconds:.2f} batches/s ({n_sentences} sentences in "
          f"{seconds:.2f}s, executor={batches.ds.executor}, workers={args.workers})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
