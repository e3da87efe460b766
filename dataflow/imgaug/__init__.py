"""Image augmentors (tensorpack's ``dataflow.imgaug``): the same 53 names, signatures and
defaults, split by family (``base``, ``transform``, ``misc``, ``crop``, ``geometry``,
``paste``, ``imgproc``, ``convert``, ``noise``, ``meta``, ``external``, ``deform``).

See :mod:`dataflow.imgaug.base` for the contract (accepted images, randomness and
reproducibility, the native flag, the legacy API) and :mod:`dataflow.imgaug.transform` for
transforms and coordinates. Importing this package is cheap: OpenCV is imported on the first
operation that needs it (``pip install 'dataflow-rt[images]'``).
"""
from .base import Augmentor, AugmentorList, ImageAugmentor, PhotometricAugmentor
from .transform import (CropTransform, FlipTransform, ResizeTransform, Transform,
                        TransformFactory, TransformList)
from .misc import Flip, RandomResize, Resize, ResizeShortestEdge, Transpose
from .crop import (CenterCrop, GoogleNetRandomCropAndResize, RandomCrop, RandomCropRandomShape,
                   RandomCutout)
from .geometry import Affine, Rotation, RotationAndCropValid, Shift
from .paste import BackgroundFiller, CenterPaste, ConstantBackgroundFiller, RandomPaste
from .imgproc import (Brightness, BrightnessScale, Clip, Contrast, Gamma, GaussianBlur, Hue,
                      Lighting, MeanVarianceNormalize, MinMaxNormalize, Saturation)
from .convert import ColorSpace, Grayscale, ToFloat32, ToUint8
from .noise import GaussianNoise, JpegNoise, SaltPepperNoise
from .meta import Identity, MapImage, RandomApplyAug, RandomChooseAug, RandomOrderAug
from .external import Albumentations, IAAugmentor
# The deprecated GaussianDeform is not exported, but as in tensorpack its module is an attribute
# of the package: ``imgaug.deform.GaussianDeform`` works without importing the module first.
from . import deform  # noqa: F401

__all__ = [
    # base classes
    "Augmentor", "ImageAugmentor", "AugmentorList", "PhotometricAugmentor",
    # transforms
    "Transform", "ResizeTransform", "CropTransform", "FlipTransform", "TransformList",
    "TransformFactory",
    # misc
    "Flip", "Resize", "ResizeShortestEdge", "RandomResize", "Transpose",
    # crop
    "RandomCrop", "CenterCrop", "RandomCropRandomShape", "GoogleNetRandomCropAndResize",
    "RandomCutout",
    # geometry
    "Shift", "Rotation", "RotationAndCropValid", "Affine",
    # paste
    "CenterPaste", "RandomPaste", "BackgroundFiller", "ConstantBackgroundFiller",
    # imgproc
    "Hue", "Brightness", "BrightnessScale", "Contrast", "MeanVarianceNormalize",
    "GaussianBlur", "Gamma", "Clip", "Saturation", "Lighting", "MinMaxNormalize",
    # convert
    "ColorSpace", "Grayscale", "ToUint8", "ToFloat32",
    # noise
    "JpegNoise", "GaussianNoise", "SaltPepperNoise",
    # meta
    "Identity", "RandomApplyAug", "RandomChooseAug", "RandomOrderAug", "MapImage",
    # external
    "IAAugmentor", "Albumentations",
]
