#!/usr/bin/env python
"""An ImageNet-style training input pipeline built from ``dataflow.imgaug``.

    python examples/imagenet_pipeline.py                        # generated data, 2 workers
    python examples/imagenet_pipeline.py --data /data/ILSVRC12 --workers 8 --epochs 1
    python examples/imagenet_pipeline.py --val                  # the validation transform

Without ``--data`` it first writes a small ImageNet-like tree (JPEGs of 300-500 px, BGR
content, in ``train/<wnid>/`` class folders) under ``$DATAFLOW_CACHE`` (default
``~/.cache/dataflow-examples``), once; later runs reuse it. With ``--data DIR`` it reads a real
ILSVRC12 tree, ``DIR/train/<wnid>/*.JPEG``: the label of a class is the index of its wnid among
the sorted wnids, which is the order of Caffe's ``synsets.txt`` that tensorpack's
``dataset.ILSVRC12`` uses (that reader also needs the metadata files; this example needs only
the images).

The pipeline is tensorpack's ``fbresnet_augmentor`` (the fb.resnet.torch augmentation of
``examples/ImageNetModels``), one datapoint = ``[image, label]``::

    DataFromList([[path, label], ...], shuffle=True)
      -> MapData([read the file with cv2.imread (BGR),
                  ops.Augment(fbresnet_augmentor(train), copy=False)],
                 num_parallel_workers=N, python_multiprocessing=True)
      -> BatchData(batch_size)          # [uint8 (B, 224, 224, 3) BGR, int (B,)]

Every augmentor here is built in, so the run-in-thread table runs the map in threads
(``--executor process`` wraps the chain in a plain Python function to force processes). With
``--seed S`` the batches are the same for any worker count and executor, run after run.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import dataflow
from dataflow import BatchData, DataFromList, MapData, imgaug, ops

IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png"}


def cache_dir():
    return Path(os.environ.get("DATAFLOW_CACHE") or "~/.cache/dataflow-examples").expanduser()


# --- the augmentors ------------------------------------------------------------------------------

# the ImageNet PCA of fb.resnet.torch (eigenvalues and eigenvectors as columns), in BGR order
FBRESNET_EIGVAL = np.asarray([0.2175, 0.0188, 0.0045][::-1]) * 255.0
FBRESNET_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                            [-0.5808, -0.0045, -0.8140],
                            [-0.5836, -0.6948, 0.4203]], dtype="float32")[::-1, ::-1]


def fbresnet_augmentor(is_train, aug_module=None):
    """tensorpack's ImageNet augmentation, for BGR uint8 images: a random crop of 8-100 % of
    the area resized to 224 (bicubic), colour jitter in random order, PCA lighting and a flip
    for training; resize the short edge to 256 and crop the centre 224 x 224 for validation.

    ``aug_module`` is the imgaug module to build the augmentors from (default
    ``dataflow.imgaug``; ``benchmarks/`` passes tensorpack's too, so that both libraries run
    this one list)."""
    import cv2
    m = imgaug if aug_module is None else aug_module
    if not is_train:
        return [m.ResizeShortestEdge(256, interp=cv2.INTER_CUBIC),
                m.CenterCrop((224, 224))]
    return [
        m.GoogleNetRandomCropAndResize(interp=cv2.INTER_CUBIC),
        m.ToFloat32(),
        m.RandomOrderAug([m.BrightnessScale((0.6, 1.4)),
                          m.Contrast((0.6, 1.4), rgb=False),
                          m.Saturation(0.4, rgb=False),
                          m.Lighting(0.1, eigval=FBRESNET_EIGVAL, eigvec=FBRESNET_EIGVEC)]),
        m.ToUint8(),
        m.Flip(horiz=True),
    ]


# --- the data -----------------------------------------------------------------------------------

WNIDS = ("n01440764", "n01443537", "n01484850", "n01491361")


def make_synthetic_tree(root, per_class=64, seed=0):
    """``root/train/<wnid>/<wnid>_<k>.JPEG``: ``per_class`` JPEGs of random 300-500 px per class,
    each a smooth random colour field with a class-coloured square (written to a temporary name
    and renamed, so an interrupted run leaves no half-written file)."""
    import cv2
    rng = np.random.default_rng(seed)
    for c, wnid in enumerate(WNIDS):
        d = root / "train" / wnid
        d.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            h, w = (int(v) for v in rng.integers(300, 501, 2))
            small = rng.integers(0, 256, (h // 32 + 2, w // 32 + 2, 3)).astype(np.uint8)
            img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
            y, x = int(rng.integers(0, h - 100)), int(rng.integers(0, w - 100))
            img[y:y + 100, x:x + 100] = (60 * c, 255 - 60 * c, 128)
            ok, buf = cv2.imencode(".JPEG", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
            assert ok
            final = d / f"{wnid}_{k}.JPEG"
            tmp = final.with_name(final.name + ".tmp")
            tmp.write_bytes(buf.tobytes())
            os.replace(tmp, final)


def synthetic_root():
    root = cache_dir() / "imagenet-synthetic"
    done = root / ".complete"
    if not done.exists():
        print(f"generating a synthetic ImageNet tree in {root} (once) ...", flush=True)
        make_synthetic_tree(root)
        done.write_text("ok\n")
    return root


def list_train_images(root):
    """``[[path, label], ...]`` of ``root/train/<wnid>/*``, labels by sorted wnid."""
    train = Path(root) / "train"
    if not train.is_dir():
        raise SystemExit(f"{train}: no such directory (expected an ILSVRC12 tree with "
                         "train/<wnid>/*.JPEG)")
    wnids = sorted(p.name for p in train.iterdir() if p.is_dir())
    files = [[str(f), label] for label, wnid in enumerate(wnids)
             for f in sorted((train / wnid).iterdir()) if f.suffix.lower() in IMAGE_EXTENSIONS]
    if not files:
        raise SystemExit(f"{train}: no images in its class folders")
    return files, wnids


# --- the pipeline -------------------------------------------------------------------------------

@dataflow.native
def read_bgr(path):
    """Read an image file as tensorpack's ILSVRC12 reader does: uint8 HWC BGR (OpenCV releases
    the GIL while it reads and decodes)."""
    import cv2
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"cannot read {path!r} as an image")
    return img


def _python_chain(chain):
    def imagenet_chain(dp):           # a plain Python function: not native
        return chain(dp)
    return imagenet_chain


def build_pipeline(files, is_train=True, executor="auto", workers=2, batch_size=32):
    """The batches of ``files`` (``[[path, label], ...]``) and the mapping dataflow."""
    chain = [ops.Lambda(read_bgr, index=0),
             ops.Augment(fbresnet_augmentor(is_train), index=0, copy=False)]
    ds = DataFromList(files, shuffle=is_train)
    if executor == "serial":
        mapped = MapData(ds, chain)
    elif executor == "process":
        mapped = MapData(ds, _python_chain(ops.Compose(chain)), num_parallel_workers=workers,
                         python_multiprocessing=True)
    else:
        mapped = MapData(ds, chain, num_parallel_workers=workers,
                         python_multiprocessing=executor == "auto")
    return BatchData(mapped, batch_size, remainder=not is_train), mapped


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="an ILSVRC12 tree (DIR/train/<wnid>/*.JPEG); default: "
                                  "generated images")
    p.add_argument("--val", action="store_true", help="the validation transform (no shuffle)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--executor", choices=["auto", "serial", "thread", "process"],
                   default="auto")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit", type=int, help="use only N images (smoke tests)")
    p.add_argument("--seed", type=int, help="make the augmentation reproducible")
    args = p.parse_args(argv)
    if args.data and not Path(args.data).is_dir():
        p.error(f"--data {args.data}: no such folder")
    if args.seed is not None:
        dataflow.set_seed(args.seed)
    files, wnids = list_train_images(args.data or synthetic_root())
    if args.limit:
        files = files[::max(1, len(files) // args.limit)][:args.limit]
    print(f"{len(files)} images, {len(wnids)} classes")
    batches, mapped = build_pipeline(files, not args.val, args.executor, args.workers,
                                     args.batch_size)
    print(f"executor={mapped.executor}")
    batches.reset_state()
    try:
        t0, n, checksum = time.perf_counter(), 0, 0
        for epoch in range(args.epochs):
            for k, (x, y) in enumerate(batches):
                if epoch == 0 and k == 0:
                    print(f"first batch: images {x.dtype} {x.shape}, labels {y.dtype} "
                          f"{y.shape}", flush=True)
                n += len(y)
                checksum = (checksum * 31 + int(x[:, ::16, ::16].sum())) % (1 << 61)
        dt = time.perf_counter() - t0
    finally:
        batches.close()
    print(f"throughput: {n / dt:.0f} images/s ({n} images in {dt:.2f} s)")
    print(f"checksum: {checksum}")


if __name__ == "__main__":
    sys.exit(main())
