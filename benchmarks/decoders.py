"""JPEG decoders side by side: ``cv2.imdecode``, Pillow and simplejpeg.

``python -m benchmarks.decoders [--n 200] [--repeats 5] [--threads 1,2]``

Decodes N in-memory JPEGs of random size 300-500 px (quality 90, generated from a fixed seed)
to an RGB ``uint8`` HWC array with each decoder available, one thread and then several threads
sharing the list (which shows whether the decoder releases the GIL). Decoders run alternately,
repeat by repeat; the report gives the median images/s (min-max) and each decoder's median
ratio to Pillow, pair by pair. It also checks that every decoder gives the same shape and dtype
and reports the largest pixel difference from Pillow's output.

``dataflow.ops.Decode`` picks its default decoder from these figures (see its docstring).
"""
import argparse
import io
import statistics
import sys
import threading
import time

import numpy as np


def make_jpegs(n, seed=17, quality=90):
    """``n`` JPEG byte strings of random (h, w) in [300, 500], textured like photographs."""
    from PIL import Image
    from .workloads import _synthetic_image
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(300, 501, 2))
        buf = io.BytesIO()
        Image.fromarray(_synthetic_image(rng, h, w), "RGB").save(buf, format="JPEG",
                                                                 quality=quality)
        out.append(buf.getvalue())
    return out


def _pillow():
    from PIL import Image

    def decode(b):
        with Image.open(io.BytesIO(b)) as im:
            if im.mode != "RGB":
                im = im.convert("RGB")
            return np.asarray(im)
    return decode


def _cv2():
    import cv2
    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION

    def decode(b):
        return cv2.imdecode(np.frombuffer(b, np.uint8), flags)
    return decode


def _simplejpeg():
    import simplejpeg

    def decode(b):
        return simplejpeg.decode_jpeg(b, colorspace="RGB")
    return decode


DECODERS = {"pillow": _pillow, "cv2": _cv2, "simplejpeg": _simplejpeg}


def available():
    out = {}
    for name, make in DECODERS.items():
        try:
            out[name] = make()
        except ImportError as e:
            print(f"# {name}: not available ({e})", file=sys.stderr)
    return out


def rate(decode, jpegs, threads):
    """Images/s decoding every JPEG of ``jpegs`` once, split over ``threads`` threads."""
    parts = [jpegs[i::threads] for i in range(threads)]

    def work(part):
        for b in part:
            decode(b)

    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(jpegs) / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args(argv)
    jpegs = make_jpegs(args.n)
    decoders = available()
    ref = decoders["pillow"] if "pillow" in decoders else None
    for name, dec in decoders.items():
        a = dec(jpegs[0])
        diff = "" if ref is None else \
            f", max |diff| vs pillow {int(np.abs(a.astype(int) - ref(jpegs[0])).max())}"
        print(f"# {name}: {a.shape} {a.dtype}{diff}")
    print("\n| decoder | threads | images/s median (min-max) | vs pillow |")
    print("|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        runs = {name: [] for name in decoders}
        for dec in decoders.values():             # warm-up
            rate(dec, jpegs[:20], threads)
        for _ in range(args.repeats):
            for name, dec in decoders.items():
                runs[name].append(rate(dec, jpegs, threads))
        for name, r in runs.items():
            ratio = "" if "pillow" not in runs else \
                f"{statistics.median(a / b for a, b in zip(r, runs['pillow'])):.2f}x"
            print(f"| {name} | {threads} | {statistics.median(r):,.0f} "
                  f"({min(r):,.0f}-{max(r):,.0f}) | {ratio} |")


if __name__ == "__main__":
    main()
