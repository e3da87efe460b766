#!/usr/bin/env python
"""Train a small PyTorch CNN on images fed by a dataflow pipeline.

    python examples/torch_training.py                  # synthetic images, 2 epochs
    python examples/torch_training.py --data ~/data/train --workers 4 --epochs 5

The input pipeline is the one of ``image_pipeline.py`` (read, decode, resize, random crop, flip,
normalize, CHW, batch) at a small resolution, so that the CPU trains quickly. The dataflow runs
its own map workers and batches; :func:`dataflow.integrations.torch.as_iterable_dataset` hands
its batches to PyTorch as tensors without copying them, through a ``DataLoader`` that must
neither batch nor start workers (``batch_size=None, num_workers=0``).

Exits with a message (and status 0) when PyTorch is not installed.
"""
import argparse
import sys
import time
from pathlib import Path

try:
    import torch
    from torch import nn
except ImportError:
    print("This example needs PyTorch, which is not installed (pip install torch). Skipping.")
    sys.exit(0)

from dataflow.integrations.torch import as_iterable_dataset

# The dataset and the pipeline of the image example (this folder is on sys.path when the
# script runs).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_pipeline import build_pipeline, cache_dir, list_images, make_synthetic_dataset  # noqa


def small_cnn(num_classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a folder of images with one sub-folder per class "
                                  "(default: the synthetic dataset of image_pipeline.py)")
    p.add_argument("--workers", type=int, default=2, help="map workers (default 2)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=64, help="training resolution (default 64)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, help="use only N images (smoke tests)")
    args = p.parse_args(argv)
    if args.data and not Path(args.data).is_dir():
        p.error(f"--data {args.data}: no such folder")
    if min(args.workers, args.batch_size, args.crop, args.epochs, args.limit or 1) < 1:
        p.error("--workers, --batch-size, --crop, --epochs and --limit must be positive")

    torch.manual_seed(0)
    root = Path(args.data) if args.data else make_synthetic_dataset(cache_dir() / "images")
    files, classes = list_images(root)
    if args.limit:
        files = files[::max(1, len(files) // args.limit)][:args.limit]
    print(f"{len(files)} images, {len(classes)} classes, from {root}")

    batches = build_pipeline(files, "auto", args.workers, args.batch_size, crop=args.crop)
    # reset_state() happens on the first iteration; with epochs=N the workers stop after the
    # N-th pass; close() (by `with`) stops them in any case.
    with as_iterable_dataset(batches, epochs=args.epochs) as dataset:
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
        model = small_cnn(len(classes))
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.CrossEntropyLoss()
        total_images, total_seconds = 0, 0.0
        for epoch in range(args.epochs):
            model.train()
            t0 = time.perf_counter()
            seen = correct = 0
            loss_sum = 0.0
            for images, labels in loader:          # float32 (B, 3, H, W), int32 (B,)
                labels = labels.long()
                logits = model(images)
                loss = loss_fn(logits, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                loss_sum += loss.item() * len(labels)
                correct += (logits.argmax(1) == labels).sum().item()
            seconds = time.perf_counter() - t0
            total_images += seen
            total_seconds += seconds
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / seen:.4f}, "
                  f"accuracy {correct / seen:.3f}, {seen / seconds:.1f} images/s", flush=True)
    print(f"throughput: {total_images / total_seconds:.1f} images/s, training included "
          f"({total_images} images in {total_seconds:.2f}s, executor={batches.ds.executor}, "
          f"workers={args.workers})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
