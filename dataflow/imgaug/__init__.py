"""Image augmentors (tensorpack's ``dataflow.imgaug``): the same 53 names, signatures and
defaults. See :mod:`dataflow.imgaug.base` for the contract (images, randomness, native flag,
legacy API) and :mod:`dataflow.imgaug.transform` for transforms and coordinates.

Importing this package is cheap: OpenCV is imported on the first operation that needs it.
"""
from .base import Augmentor, AugmentorList, ImageAugmentor, PhotometricAugmentor
from .transform import (CropTransform, FlipTransform, ResizeTransform, Transform,
                        TransformFactory, TransformList)

__all__ = ["Augmentor", "ImageAugmentor", "AugmentorList", "PhotometricAugmentor",
           "Transform", "ResizeTransform", "CropTransform", "FlipTransform", "TransformList",
           "TransformFactory"]
