"""OpenCV, imported on first use: ``import dataflow`` and ``import dataflow.imgaug`` never load it.

The interpolation and border constants the augmentors take as defaults are plain ints equal to
OpenCV's (``cv2.INTER_LINEAR == 1`` and so on), so defining an augmentor needs no OpenCV either.
"""
__all__ = ["cv2", "INTER_NEAREST", "INTER_LINEAR", "INTER_CUBIC", "INTER_AREA",
           "BORDER_CONSTANT", "BORDER_REPLICATE"]

INTER_NEAREST, INTER_LINEAR, INTER_CUBIC, INTER_AREA = 0, 1, 2, 3
BORDER_CONSTANT, BORDER_REPLICATE = 0, 1

_cv2 = None


def cv2():
    """The ``cv2`` module; ImportError naming the extra when OpenCV is not installed."""
    global _cv2
    if _cv2 is None:
        try:
            import cv2 as mod
        except ImportError as e:
            raise ImportError("dataflow.imgaug needs OpenCV for this augmentor: "
                              "pip install 'dataflow-rt[images]'") from e
        _cv2 = mod
        # the thread limit of the worker we run in, if any, applies from this first use on
        # (local import: dataflow.imgaug never needs parallel/ otherwise)
        from ..parallel import cvthreads
        cvthreads.apply_pending()
    return _cv2
