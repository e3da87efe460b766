#!/usr/bin/env python
"""An image-classification input pipeline: files -> decode -> augment -> batches.

    python examples/image_pipeline.py                          # synthetic images, 2 workers
    python examples/image_pipeline.py --executor process       # force worker processes
    python examples/image_pipeline.py --data ~/data/train --workers 8 --epochs 1

Without ``--data`` it first writes a small synthetic dataset (512 JPEG files of 256x320 in 4
class sub-folders) under ``$DATAFLOW_CACHE`` (default ``~/.cache/dataflow-examples``), once; later
runs reuse it. With ``--data DIR`` it reads your images: each sub-folder of DIR is a class.

The pipeline, one datapoint = ``[image, label]``::

    DataFromList([[path, label], ...], shuffle=True)
      -> MapData(read_file, Decode, Resize(256), RandomCrop(224), RandomHorizontalFlip,
                 Normalize, HWC2CHW; num_parallel_workers=N)
      -> BatchData(batch_size)          # [float32 (B, 3, 224, 224), int32 (B,)]

Where the map runs (``--executor``):

* ``auto`` (default): ``MapData(..., num_parallel_workers=N, python_multiprocessing=True)`` and
  the library's run-in-thread table decides. Every op here is *native* (it works in C with the
  GIL released: Pillow, numpy, file reads), so it picks threads.
* ``serial``: no workers, everything in the main thread (``num_parallel_workers`` not given).
* ``thread``: ``python_multiprocessing=False``: worker threads whatever the ops are.
* ``process``: the op chain is wrapped in a plain Python function, which is not native, so the
  table sends the whole chain to worker processes.

The script prints a progress bar (tqdm if installed, plain lines otherwise) and the throughput.
"""
import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import dataflow
from dataflow import BatchData, DataFromList, MapData
from dataflow.ops import (Compose, Decode, HWC2CHW, Normalize, RandomCrop, RandomHorizontalFlip,
                          Resize)
from dataflow.parallel.policy import describe_choice

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
# ImageNet statistics, on the 0..255 scale of decoded uint8 images
MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 57.12, 57.375]


# --- the synthetic dataset -------------------------------------------------------------------

def cache_dir():
    """Where the examples keep generated data: ``$DATAFLOW_CACHE`` or
    ``~/.cache/dataflow-examples``."""
    return Path(os.environ.get("DATAFLOW_CACHE") or "~/.cache/dataflow-examples").expanduser()


CLASSES = ("circles", "squares", "triangles", "stripes")
HUES = ((220, 60, 60), (60, 200, 60), (60, 90, 230), (230, 200, 40))   # one per class


def _draw_image(rng, label, height=256, width=320):
    """One RGB image of class ``CLASSES[label]``: 2 to 5 shapes of that kind, in colours near
    the class's hue, at random places on a random grey background (so a small CNN learns the
    classes in a few epochs)."""
    from PIL import Image, ImageDraw
    img = Image.new("RGB", (width, height), (int(rng.integers(0, 256)),) * 3)
    draw = ImageDraw.Draw(img)
    kind = CLASSES[label]
    for _ in range(int(rng.integers(2, 6))):
        colour = tuple(int(c) for c in np.clip(np.add(HUES[label], rng.integers(-40, 41, 3)),
                                               0, 255))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(15, 70))
        if kind == "circles":
            draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)
        elif kind == "squares":
            draw.rectangle([x - r, y - r, x + r, y + r], fill=colour)
        elif kind == "triangles":
            draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
        else:
            draw.line([(0, y), (width, y + int(rng.integers(-80, 80)))], fill=colour,
                      width=max(3, r // 4))
    return img


def make_synthetic_dataset(root, num_images=512, seed=0):
    """Write ``num_images`` JPEG files in one sub-folder per class under ``root``, unless
    ``root`` already exists. Returns ``root``.

    The files are written into a temporary sibling folder that is renamed to ``root`` at the
    end: the rename is atomic, so ``root`` either does not exist or is complete, even if a run
    is interrupted or two runs race.
    """
    root = Path(root)
    if root.is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".partial-", dir=root.parent))
    try:
        print(f"writing {num_images} synthetic images to {root} (once) ...", flush=True)
        rng = np.random.default_rng(seed)
        for label, name in enumerate(CLASSES):
            (tmp / name).mkdir()
        for i in range(num_images):
            label = i % len(CLASSES)
            _draw_image(rng, label).save(tmp / CLASSES[label] / f"{i:05d}.jpg", quality=90)
        try:
            os.rename(tmp, root)
        except OSError:
            if not root.is_dir():       # not a concurrent run that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def list_images(root):
    """``([[path, label], ...], class_names)`` for a folder with one sub-folder per class."""
    root = Path(root)
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    files = [[str(p), label]
             for label, name in enumerate(classes)
             for p in sorted((root / name).iterdir())
             if p.suffix.lower() in IMAGE_EXTENSIONS]
    if not files:
        raise SystemExit(f"no images found in class sub-folders of {root}")
    return files, classes


# --- the pipeline ----------------------------------------------------------------------------

@dataflow.native          # open() and read() release the GIL: threads can run it in parallel
def read_file(dp):
    """``[path, label] -> [encoded bytes, label]``."""
    path, label = dp
    with open(path, "rb") as f:
        return [f.read(), label]


def train_ops(crop=224):
    """The per-image ops of a training pipeline; datapoints are ``[image, label]``."""
    return [
        read_file,
        Decode(index=0),                     # bytes -> uint8 HxWx3
        Resize(crop * 8 // 7, index=0),      # shorter side -> 256 (a no-op when already so)
        RandomCrop(crop, index=0),
        RandomHorizontalFlip(index=0),
        Normalize(MEAN, STD, index=0),       # -> float32
        HWC2CHW(index=0),                    # -> 3x224x224, the layout PyTorch wants
    ]


def _call(fn, dp):
    return fn(dp)


def as_python_op(fn):
    """``fn`` as an op the run-in-thread table counts as Python (not native), so that
    ``python_multiprocessing=True`` runs it in processes."""
    return functools.partial(_call, fn)


def build_pipeline(files, executor="auto", workers=2, batch_size=32, crop=224):
    """The batched dataflow of ``files`` (``[[path, label], ...]``); ``.ds`` is its map stage.
    ``executor`` is "auto", "serial", "thread" or "process" (see the module doc)."""
    ds = DataFromList(files, shuffle=True)
    ops = train_ops(crop)
    if executor == "serial":
        mapped = MapData(ds, ops)
    elif executor == "thread":
        mapped = MapData(ds, ops, num_parallel_workers=workers, python_multiprocessing=False)
    elif executor == "process":
        mapped = MapData(ds, as_python_op(Compose(ops)), num_parallel_workers=workers,
                         python_multiprocessing=True)
    else:   # auto: the table decides
        mapped = MapData(ds, ops, num_parallel_workers=workers, python_multiprocessing=True)
        print("executor chosen by the table:", describe_choice(ops, workers, True))
    # remainder=True keeps the last, smaller batch (so --limit below the batch size works)
    return BatchData(mapped, batch_size, remainder=True)


# --- running it ------------------------------------------------------------------------------

def progress(total, desc):
    """A progress bar with ``update(n)`` and ``close()``: tqdm if installed, else a line every
    2 seconds."""
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="batch", dynamic_ncols=True)
    except ImportError:
        return _Lines(total, desc)


class _Lines:
    def __init__(self, total, desc):
        self.total, self.desc, self.n = total, desc, 0
        self.t0 = self.last = time.perf_counter()

    def update(self, n=1):
        self.n += n
        now = time.perf_counter()
        if now - self.last >= 2 or self.n == self.total:
            self.last = now
            print(f"{self.desc}: {self.n}/{self.total} batches, "
                  f"{self.n / max(now - self.t0, 1e-9):.1f} batches/s", flush=True)

    def close(self):
        pass


def run_epochs(batches, epochs):
    """Iterate ``epochs`` passes; returns ``(images, batches, seconds, first_batch)``."""
    n_images = n_batches = 0
    elapsed = 0.0
    first = None
    for epoch in range(epochs):
        bar = progress(len(batches), f"epoch {epoch + 1}/{epochs}")
        t0 = time.perf_counter()
        for images, labels in batches:
            if first is None:
                first = (images, labels)
            n_images += len(labels)
            n_batches += 1
            bar.update(1)
        elapsed += time.perf_counter() - t0
        bar.close()
    return n_images, n_batches, elapsed, first


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a folder of images with one sub-folder per class "
                                  "(default: a synthetic dataset, generated once)")
    p.add_argument("--workers", type=int, default=2, help="map workers (default 2)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--executor", choices=["auto", "serial", "thread", "process"],
                   default="auto", help="where the map runs (default: let the table decide)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, help="use only N of the images (smoke tests)")
    args = p.parse_args(argv)
    if args.data and not Path(args.data).is_dir():
        p.error(f"--data {args.data}: no such folder")
    if min(args.workers, args.batch_size, args.epochs, args.limit or 1) < 1:
        p.error("--workers, --batch-size, --epochs and --limit must be positive")

    root = Path(args.data) if args.data else make_synthetic_dataset(cache_dir() / "images")
    files, classes = list_images(root)
    if args.limit:
        files = files[::max(1, len(files) // args.limit)][:args.limit]   # keep every class
    print(f"{len(files)} images, {len(classes)} classes, from {root}")

    batches = build_pipeline(files, args.executor, args.workers, args.batch_size)
    try:
        batches.reset_state()              # once, before iterating: starts the workers
        n_images, n_batches, seconds, (images, labels) = run_epochs(batches, args.epochs)
        print(f"first batch: images {images.dtype} {images.shape}, "
              f"labels {labels.dtype} {labels.shape}")
    finally:
        batches.close()      # stops the map workers (also done at garbage collection or exit)
    print(f"throughput: {n_images / seconds:.1f} images/s, {n_batches / seconds:.2f} batches/s "
          f"({n_images} images in {seconds:.2f}s, epochs={args.epochs}, "
          f"executor={batches.ds.executor}, workers={args.workers})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
