"""tensorpack's ImageNet training augmentation (``fbresnet_augmentor``), defined once in
``examples/imagenet_pipeline.py`` and loaded from there by file path (``examples/`` is not a
package and must stay runnable on its own), for ``benchmarks.images`` and
``benchmarks.imgaug_micro``.
"""
import importlib.util
import os

__all__ = ["fbresnet_augmentor", "EIGVAL", "EIGVEC"]

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                     "imagenet_pipeline.py")


def _load_example():
    spec = importlib.util.spec_from_file_location("_dataflow_example_imagenet_pipeline", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_example = _load_example()
EIGVAL, EIGVEC = _example.FBRESNET_EIGVAL, _example.FBRESNET_EIGVEC


def fbresnet_augmentor(imgaug, is_train=True):
    """The augmentor list, built from the imgaug module ``imgaug`` (ours or tensorpack's)."""
    return _example.fbresnet_augmentor(is_train, aug_module=imgaug)
