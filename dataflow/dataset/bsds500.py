"""The Berkeley Segmentation Data Set 500 (images and averaged boundary maps)."""
import glob
import os

import numpy as np

from .._helpers import check_flag
from ._common import IndexedDataset, require
from .download import dataset_url, download, extract_tar, get_dataset_path
from .ilsvrc import _imread

__all__ = ["BSDS500"]

_URL = "http://www.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/BSR/"
_ARCHIVE, _SIZE = "BSR_bsds500.tgz", 70763455
_SHAPE = (321, 481)


class BSDS500(IndexedDataset):
    """BSDS500: datapoints ``[image, edges]``, ``image`` uint8 (321, 481, 3) **BGR**,
    ``edges`` float32 (321, 481) in [0, 1], the mean over the annotators' boundary maps.
    Portrait images and their maps are transposed to landscape; images are in file-name order
    (tensorpack's is the directory's). ``name`` is 'train', 'test' or 'val'. Everything is
    read in the constructor from
    ``data_dir/BSR/BSDS500/data/{images,groundTruth}/<name>/`` (``data_dir`` defaults to
    ``get_dataset_path('bsds500_data')``; the archive is downloaded and extracted there when
    ``BSR`` is missing). Every image needs its ``groundTruth/<name>/<id>.mat`` and every such
    file its ``images/<name>/<id>.jpg``: a missing one raises FileNotFoundError naming it.
    Needs OpenCV and SciPy."""

    def __init__(self, name, data_dir=None, shuffle=True):
        cv2 = require("cv2", "BSDS500")
        sio = require("scipy.io", "BSDS500")
        if name not in ("train", "test", "val"):
            raise ValueError(f"BSDS500: name must be 'train', 'test' or 'val', got {name!r}")
        self.name = name
        check_flag("BSDS500: shuffle", shuffle)      # None keeps its meaning
        self.shuffle = shuffle
        data_dir = data_dir if data_dir is not None else get_dataset_path("bsds500_data")
        if not os.path.isdir(os.path.join(data_dir, "BSR")):
            path = download(dataset_url("bsds500", _URL, _ARCHIVE), data_dir,
                            expect_size=_SIZE)
            extract_tar(path, data_dir)
        # the directory of images/ and groundTruth/, as tensorpack's attribute
        self.data_root = base = os.path.join(data_dir, "BSR", "BSDS500", "data")
        files = sorted(glob.glob(os.path.join(base, "images", name, "*.jpg")))
        if not files:
            raise FileNotFoundError(f"{os.path.join(base, 'images', name)}: no *.jpg images")
        _check_every_ground_truth_has_its_image(base, name, files)
        images, edges = [], []
        for f in files:
            im = _imread(cv2, f)
            mat = os.path.join(base, "groundTruth", name,
                               os.path.splitext(os.path.basename(f))[0] + ".mat")
            edge = _mean_boundaries(sio, mat)
            if im.shape[0] > im.shape[1]:
                im, edge = im.transpose(1, 0, 2), edge.T
            if im.shape[:2] != _SHAPE or edge.shape != _SHAPE:
                raise ValueError(f"{f}: image {im.shape[:2]} and boundaries {edge.shape}, "
                                 f"expected {_SHAPE} (or its transpose)")
            images.append(np.ascontiguousarray(im))
            edges.append(np.ascontiguousarray(edge))
        self.data = np.stack(images)
        self.label = np.stack(edges)

    def __len__(self):
        return len(self.data)

    def _get(self, k):
        return [self.data[k], self.label[k]]


def _check_every_ground_truth_has_its_image(base, name, files):
    """Raise FileNotFoundError naming ``images/<name>/<id>.jpg`` when ``groundTruth/<name>/
    <id>.mat`` is there but the image is not among ``files`` (the images found): the glob
    over the images would otherwise leave the datapoint out silently."""
    found = {os.path.splitext(os.path.basename(f))[0] for f in files}
    for mat in sorted(glob.glob(os.path.join(base, "groundTruth", name, "*.mat"))):
        stem = os.path.splitext(os.path.basename(mat))[0]
        if stem not in found:
            image = os.path.join(base, "images", name, stem + ".jpg")
            raise FileNotFoundError(f"{image}: missing, but its ground truth {mat} is there")


def _mean_boundaries(sio, path):
    try:
        gt = sio.loadmat(path)["groundTruth"]
        maps = [np.asarray(gt[0, k]["Boundaries"][0, 0], np.float32) for k in range(gt.shape[1])]
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ValueError(f"{path}: not a BSDS500 groundTruth file: {type(e).__name__}: {e}") \
            from e
    if not maps:
        raise ValueError(f"{path}: no annotations")
    # summed then scaled by 1/n in float32, as tensorpack does: the same values to the last bit
    edge = sum(maps)
    edge *= np.float32(1.0 / len(maps))
    return edge
