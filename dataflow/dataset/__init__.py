"""Readers of public datasets in the on-disk layouts tensorpack reads, with its class names and
arguments: ``from dataflow import dataset; dataset.Cifar10('train')``.

Optional dependencies (OpenCV for image files, SciPy for ``.mat`` files) are imported when a
reader that needs them is constructed, never here (``pip install 'dataflow-rt[datasets]'``).
Where a reader downloads, see :mod:`dataflow.dataset.download` for the directory, the mirror
variables and the checks.
"""
from .mnist import FashionMnist, Mnist
from .cifar import Cifar10, Cifar100, CifarBase
from .ilsvrc import ILSVRC12, ILSVRC12Files, ILSVRCMeta, TinyImageNet
from .places import Places365Standard
from .bsds500 import BSDS500
from .svhn import SVHNDigit
from .caltech101 import Caltech101Silhouettes

__all__ = ["BSDS500", "Caltech101Silhouettes", "Cifar10", "Cifar100", "CifarBase",
           "FashionMnist", "ILSVRC12", "ILSVRC12Files", "ILSVRCMeta", "Mnist",
           "Places365Standard", "SVHNDigit", "TinyImageNet"]
