"""ImageNet (ILSVRC-12) and Tiny ImageNet, in the layouts tensorpack reads. Images are decoded
with OpenCV, so they are **BGR** uint8 (``pip install 'dataflow-rt[datasets]'``)."""
import os
import pathlib
import struct
import xml.etree.ElementTree as ET

import numpy as np

from ..image import _truncated_jpeg
from ._common import IndexedDataset, read_lines, require
from .download import dataset_url, download, extract_tar, get_dataset_path

__all__ = ["ILSVRCMeta", "ILSVRC12Files", "ILSVRC12", "TinyImageNet"]

_META_URL = "http://dl.caffe.berkeleyvision.org/"
_META_ARCHIVE, _META_SIZE = "caffe_ilsvrc12.tar.gz", 17858008


def _imread(cv2, path):
    """Image file ``path`` as OpenCV decodes it: uint8 HWC **BGR**. One OpenCV cannot read
    raises OSError, and a JPEG file cut short (OpenCV decodes it partly blank, with only a
    warning on stderr) ValueError; both name the file."""
    im = cv2.imread(path, cv2.IMREAD_COLOR)
    if im is None:
        raise IOError(f"{path}: cannot read this image (missing or not an image file)")
    if _truncated_jpeg(path):
        raise ValueError(f"{path}: a truncated JPEG file (it ends before its end-of-image "
                         "marker; OpenCV would give a partly blank image)")
    return im


class ILSVRCMeta:
    """The ILSVRC-12 metadata of Caffe's ``caffe_ilsvrc12.tar.gz``: ``synsets.txt``,
    ``synset_words.txt``, ``{train,val,test}.txt`` and ``imagenet_mean.binaryproto``, in
    ``dir`` (``~`` expanded; default ``get_dataset_path('ilsvrc_metadata')``; downloaded and
    extracted there when ``synsets.txt`` is missing)."""

    def __init__(self, dir=None):
        self.dir = os.path.expanduser(dir) if dir is not None \
            else get_dataset_path("ilsvrc_metadata")
        os.makedirs(self.dir, exist_ok=True)
        self.caffepb = None
        if not os.path.isfile(os.path.join(self.dir, "synsets.txt")):
            path = download(dataset_url("ilsvrc_metadata", _META_URL, _META_ARCHIVE), self.dir,
                            expect_size=_META_SIZE)
            extract_tar(path, self.dir)

    def _lines(self, name):
        """The stripped lines of file ``name``, blank ones included (line k is class k). A line
        that does not decode raises ValueError naming the file and the line."""
        return [line.strip() for line in read_lines(os.path.join(self.dir, name))]

    def get_synset_words_1000(self):
        """``{class index: "wnid words"}``, from ``synset_words.txt`` (index = line number,
        counted from 0, as tensorpack's)."""
        return dict(enumerate(self._lines("synset_words.txt")))

    def get_synset_1000(self):
        """``{class index: wnid}``, from ``synsets.txt`` (index = line number, counted from
        0, as tensorpack's)."""
        return dict(enumerate(self._lines("synsets.txt")))

    def get_image_list(self, name, dir_structure="original"):
        """``[(relative path, class index)]`` of split ``name`` ('train', 'val' or 'test'),
        from ``<name>.txt``. With ``dir_structure='train'`` the images of 'val' and 'test' are
        looked up in class sub-folders (``<wnid>/<file>``), as in the train split."""
        if name not in ("train", "val", "test"):
            raise ValueError(f"ILSVRCMeta: name must be 'train', 'val' or 'test', got {name!r}")
        if dir_structure not in ("original", "train"):
            raise ValueError(f"ILSVRCMeta: dir_structure must be 'original' or 'train', "
                             f"got {dir_structure!r}")
        path = os.path.join(self.dir, name + ".txt")
        synsets = self.get_synset_1000() if (name != "train" and dir_structure == "train") \
            else None
        ret = []
        for i, line in enumerate(self._lines(name + ".txt")):
            if not line:
                continue
            try:
                fname, cls = line.split()
                cls = int(cls)
            except ValueError:
                raise ValueError(f"{path}, line {i + 1}: expected 'path label', got {line!r}") \
                    from None
            if synsets is not None:
                fname = os.path.join(synsets[cls], fname)
            ret.append((fname.strip(), cls))
        if not ret:
            raise ValueError(f"{path}: no images listed")
        return ret

    def get_per_pixel_mean(self, size=None):
        """Caffe's ImageNet mean image, float32 (256, 256, 3) BGR, from
        ``imagenet_mean.binaryproto`` (parsed directly: neither Caffe nor protoc is needed);
        resized to ``size`` = (height, width) with OpenCV if given."""
        path = os.path.join(self.dir, "imagenet_mean.binaryproto")
        with open(path, "rb") as f:
            arr = _parse_blob_proto(f.read(), path)
        arr = np.transpose(arr, (1, 2, 0))
        if size is not None:
            cv2 = require("cv2", "ILSVRCMeta.get_per_pixel_mean(size=...)")
            arr = cv2.resize(arr, tuple(size[::-1]))
        return arr

    @staticmethod
    def guess_dir_structure(dir):
        """'train' if ``dir`` has class sub-folders (``n*`` directories), else 'original'."""
        for name in sorted(os.listdir(dir)):
            if name.startswith("n") and os.path.isdir(os.path.join(dir, name)):
                return "train"
        return "original"


def _varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _parse_blob_proto(buf, path):
    """A Caffe ``BlobProto`` (num=1, channels=2, height=3, width=4, data=5 floats,
    shape=7 {dim=1}) as a float32 (C, H, W) array."""
    dims, legacy, data = [], {}, []
    pos = 0
    try:
        while pos < len(buf):
            key, pos = _varint(buf, pos)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = _varint(buf, pos)
                legacy[field] = value
            elif wire == 2:
                n, pos = _varint(buf, pos)
                chunk = buf[pos:pos + n]
                if len(chunk) != n:
                    raise ValueError("truncated field")
                pos += n
                if field == 5:
                    data.append(np.frombuffer(chunk, "<f4"))
                elif field == 7:
                    p = 0
                    while p < len(chunk):
                        k, p = _varint(chunk, p)
                        if k & 7 == 2:          # packed dims
                            m, p = _varint(chunk, p)
                            q = p
                            while q < p + m:
                                d, q = _varint(chunk, q)
                                dims.append(d)
                            p += m
                        else:
                            d, p = _varint(chunk, p)
                            dims.append(d)
            elif wire == 5:
                if field == 5:
                    data.append(np.frombuffer(buf[pos:pos + 4], "<f4"))
                pos += 4
            elif wire == 1:
                pos += 8
            else:
                raise ValueError(f"unsupported wire type {wire}")
    except (IndexError, ValueError) as e:
        raise ValueError(f"{path}: not a Caffe BlobProto (truncated or corrupted?): {e}") \
            from None
    arr = np.concatenate(data).astype(np.float32) if data else np.zeros(0, np.float32)
    if not dims:
        dims = [legacy.get(f, 1) for f in (1, 2, 3, 4)]
    if len(dims) == 4:
        dims = dims[1:] if dims[0] == 1 else dims
    if int(np.prod(dims)) != arr.size:
        raise ValueError(f"{path}: BlobProto shape {dims} does not match its {arr.size} values")
    return arr.reshape(dims)


class ILSVRC12Files(IndexedDataset):
    """ILSVRC-12 image files: datapoints ``[path, label]`` (``path`` is ``dir/name/<file>``).

    ``dir`` (``~`` expanded) holds the split folders ``train/<wnid>/*.JPEG`` and ``val/``,
    ``test/`` (flat, the 'original' structure, or with class sub-folders, the 'train'
    structure; guessed when ``dir_structure`` is None). The image list comes from
    :class:`ILSVRCMeta` (``meta_dir``). ``shuffle=None`` shuffles the train split only."""

    def __init__(self, dir, name, meta_dir=None, shuffle=None, dir_structure=None):
        if name not in ("train", "test", "val"):
            raise ValueError(f"{type(self).__name__}: name must be 'train', 'val' or 'test', "
                             f"got {name!r}")
        self.full_dir = os.path.join(os.path.expanduser(dir), name)
        if not os.path.isdir(self.full_dir):
            raise FileNotFoundError(f"{self.full_dir}: no such directory")
        if meta_dir is not None and not os.path.isdir(os.path.expanduser(meta_dir)):
            # as tensorpack: a meta_dir given must exist (ILSVRCMeta would create it and start
            # a download there, on a typo)
            raise FileNotFoundError(f"{type(self).__name__}: meta_dir {meta_dir!r}: no such "
                                    "directory")
        self.name = name
        self.shuffle = (name == "train") if shuffle is None else shuffle
        if name == "train":
            dir_structure = "train"
        if dir_structure is None:
            dir_structure = ILSVRCMeta.guess_dir_structure(self.full_dir)
        meta = ILSVRCMeta(meta_dir)
        self.imglist = meta.get_image_list(name, dir_structure)
        for fname, _ in self.imglist[:10]:
            path = os.path.join(self.full_dir, fname)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: listed in {name}.txt of {meta.dir} but "
                                        "missing")

    def __len__(self):
        return len(self.imglist)

    def _get(self, k):
        fname, label = self.imglist[k]
        return [os.path.join(self.full_dir, fname), label]

    @staticmethod
    def get_training_bbox(bbox_dir, imglist):
        """For each ``(file, label)`` of ``imglist``, the first bounding box of
        ``bbox_dir/<file minus extension>.xml`` as float32 ``[xmin, ymin, xmax, ymax]``, or
        None where there is no readable annotation."""
        ret = []
        for fname, _ in imglist:
            xml = os.path.join(bbox_dir, os.path.splitext(fname)[0] + ".xml")
            try:
                box = ET.parse(xml).getroot().find("object").find("bndbox")
                ret.append(np.asarray([float(box.find(t).text)
                                       for t in ("xmin", "ymin", "xmax", "ymax")], np.float32))
            except (OSError, ET.ParseError, AttributeError, ValueError):
                ret.append(None)
        return ret


class ILSVRC12(ILSVRC12Files):
    """ILSVRC-12 images: datapoints ``[image, label]``, ``image`` uint8 HWC **BGR** as OpenCV
    decodes it (see :class:`ILSVRC12Files` for the arguments)."""

    def __init__(self, dir, name, meta_dir=None, shuffle=None, dir_structure=None):
        self._cv2 = require("cv2", "ILSVRC12")
        super().__init__(dir, name, meta_dir, shuffle, dir_structure)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_cv2", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._cv2 = require("cv2", "ILSVRC12")

    def _get(self, k):
        path, label = super()._get(k)
        return [_imread(self._cv2, path), label]


class TinyImageNet(IndexedDataset):
    """Tiny ImageNet 200: datapoints ``[image, label]``, ``image`` uint8 (64, 64, 3) **BGR**,
    ``label`` in [0, 200) (the line of its wnid in ``dir/wnids.txt``). Split 'train' reads
    ``dir/train/<wnid>/images/*`` (sorted), 'val' reads ``dir/val/val_annotations.txt`` and
    ``dir/val/images/`` (``~`` in ``dir`` is expanded). ``shuffle=None`` shuffles the train
    split only."""

    def __init__(self, dir, name, shuffle=None):
        self._cv2 = require("cv2", "TinyImageNet")
        if name not in ("train", "val"):
            raise ValueError(f"TinyImageNet: name must be 'train' or 'val', got {name!r}")
        self.name = name
        self.shuffle = (name == "train") if shuffle is None else shuffle
        dir = os.path.expanduser(dir)
        self.full_dir = pathlib.Path(dir) / name      # tensorpack's attribute
        wnids = [line.strip() for line in read_lines(os.path.join(dir, "wnids.txt"))
                 if line.strip()]
        if len(wnids) != 200 or len(set(wnids)) != 200:
            raise ValueError(f"{os.path.join(dir, 'wnids.txt')}: {len(set(wnids))} distinct "
                             f"wnids in {len(wnids)} lines, expected 200")
        index = {w: i for i, w in enumerate(wnids)}
        self.imglist = []
        if name == "train":
            for w in wnids:
                folder = os.path.join(dir, "train", w, "images")
                for fname in sorted(os.listdir(folder)):
                    self.imglist.append((os.path.join(folder, fname), index[w]))
        else:
            ann = os.path.join(dir, "val", "val_annotations.txt")
            for i, line in enumerate(read_lines(ann)):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) < 2 or parts[1] not in index:
                    raise ValueError(f"{ann}, line {i + 1}: expected 'file wnid ...' with "
                                     f"a wnid of wnids.txt, got {line.strip()!r}")
                self.imglist.append((os.path.join(dir, "val", "images", parts[0]),
                                     index[parts[1]]))

    __getstate__ = ILSVRC12.__getstate__

    def __setstate__(self, state):
        super().__setstate__(state)
        self._cv2 = require("cv2", "TinyImageNet")

    def __len__(self):
        return len(self.imglist)

    def _get(self, k):
        path, label = self.imglist[k]
        return [_imread(self._cv2, path), label]
