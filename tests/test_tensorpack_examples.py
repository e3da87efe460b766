"""tensorpack's example pipelines, run on generated data with only their imports changed.

Each pipeline function below is written from the description of the tensorpack 0.11 example
named above it (shared/reference/tensorpack-0.11-missing-parts.md, section 11): the same
dataflow calls, augmentors and arguments, with ``from tensorpack.dataflow import ...`` turned
into ``from dataflow import ...``. The data is generated in a temporary directory in each
reader's on-disk layout (``$TENSORPACK_DATASET`` points there, as the examples rely on it).

The ImageNet, CIFAR, HED and SVHN pipelines read through ``dataflow.dataset``; the Faster
R-CNN box augmentation needs only ``dataflow.imgaug``; the GAN ones (Image2Image, DCGAN) read
image files with ``ImageFromFile``, and the super-resolution one goes through an LMDB.
"""
import copy
import os
import pickle

import cv2
import numpy as np
import pytest

from dataflow import (AugmentImageComponent, AugmentImageComponents, BatchData,  # noqa: E402
                      BatchDataByShape, MapDataComponent, MultiProcessRunner,
                      MultiProcessRunnerZMQ, MultiThreadMapData, imgaug)

from dataflow import dataset  # noqa: E402 (the readers of issue 16)


def take(df, n):
    """The first ``n`` datapoints of ``df`` (reset first, closed after)."""
    df.reset_state()
    out = []
    try:
        for dp in df:
            out.append(dp)
            if len(out) == n:
                break
    finally:
        df.close()
    return out


def _jpeg(path, h, w, seed):
    rs = np.random.RandomState(seed)
    img = rs.randint(0, 256, (h // 8 + 1, w // 8 + 1, 3)).astype(np.uint8)
    img = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)
    assert cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 90])


# == examples/ImageNetModels/imagenet_utils.py ===================================================

def fbresnet_augmentor(isTrain):
    """Augmentor used in fb.resnet.torch, for BGR images in range [0, 255]."""
    interpolation = cv2.INTER_CUBIC
    if isTrain:
        augmentors = [
            imgaug.GoogleNetRandomCropAndResize(interp=interpolation),
            imgaug.ToFloat32(),
            imgaug.RandomOrderAug(
                [imgaug.BrightnessScale((0.6, 1.4)),
                 imgaug.Contrast((0.6, 1.4), rgb=False),
                 imgaug.Saturation(0.4, rgb=False),
                 # the PCA lighting of fb.resnet.torch, for BGR
                 imgaug.Lighting(0.1,
                                 eigval=np.asarray([0.2175, 0.0188, 0.0045][::-1]) * 255.0,
                                 eigvec=np.array([[-0.5675, 0.7192, 0.4009],
                                                  [-0.5808, -0.0045, -0.8140],
                                                  [-0.5836, -0.6948, 0.4203]],
                                                 dtype="float32")[::-1, ::-1])]),
            imgaug.ToUint8(),
            imgaug.Flip(horiz=True),
        ]
    else:
        augmentors = [
            imgaug.ResizeShortestEdge(256, interp=cv2.INTER_CUBIC),
            imgaug.CenterCrop((224, 224)),
        ]
    return augmentors


def get_imagenet_dataflow(datadir, name, batch_size, augmentors=None, parallel=None):
    assert name in ["train", "val", "test"]
    isTrain = name == "train"
    assert datadir is not None
    if augmentors is None:
        augmentors = fbresnet_augmentor(isTrain)
    assert isinstance(augmentors, list)
    if parallel is None:
        parallel = min(40, os.cpu_count() // 2)   # assuming hyperthreading
    if isTrain:
        ds = dataset.ILSVRC12(datadir, name, shuffle=True)
        ds = AugmentImageComponent(ds, augmentors, copy=False)
        if parallel < 16:
            pass                                  # (the example logs a warning here)
        ds = MultiProcessRunnerZMQ(ds, parallel)
        ds = BatchData(ds, batch_size, remainder=False)
    else:
        ds = dataset.ILSVRC12Files(datadir, name, shuffle=False)
        aug = imgaug.AugmentorList(augmentors)

        def mapf(dp):
            fname, cls = dp
            im = cv2.imread(fname, cv2.IMREAD_COLOR)
            im = aug.augment(im)
            return im, cls
        ds = MultiThreadMapData(ds, parallel, mapf, buffer_size=2000, strict=True)
        ds = BatchData(ds, batch_size, remainder=True)
        ds = MultiProcessRunnerZMQ(ds, 1)
    return ds


WNIDS = ["n01440764", "n01443537", "n01484850"]


def make_ilsvrc12(root, per_class=4, n_val=5):
    """A small ILSVRC12 tree (train/<wnid>/*.JPEG, flat val/) and Caffe's metadata files in
    ``root/ilsvrc_metadata`` (where ``$TENSORPACK_DATASET`` makes the readers look)."""
    data, meta = root / "ilsvrc12", root / "ilsvrc_metadata"
    meta.mkdir(parents=True)
    (meta / "synsets.txt").write_text("".join(w + "\n" for w in WNIDS))
    (meta / "synset_words.txt").write_text("".join(f"{w} class {i}\n"
                                                   for i, w in enumerate(WNIDS)))
    train, val = [], []
    for c, wnid in enumerate(WNIDS):
        (data / "train" / wnid).mkdir(parents=True)
        for k in range(per_class):
            name = f"{wnid}_{k}.JPEG"
            _jpeg(data / "train" / wnid / name, 150 + 37 * k, 200 + 29 * c, seed=10 * c + k)
            train.append(f"{wnid}/{name} {c}\n")
    (data / "val").mkdir()
    for k in range(n_val):
        name = f"ILSVRC2012_val_{k + 1:08d}.JPEG"
        _jpeg(data / "val" / name, 260 + 11 * k, 300, seed=100 + k)
        val.append(f"{name} {k % len(WNIDS)}\n")
    (meta / "train.txt").write_text("".join(train))
    (meta / "val.txt").write_text("".join(val))
    (meta / "test.txt").write_text("".join(val))
    return str(data)


def test_fbresnet_augmentor_on_bgr_images():
    rs = np.random.RandomState(0)
    train = imgaug.AugmentorList(fbresnet_augmentor(True))
    val = imgaug.AugmentorList(fbresnet_augmentor(False))
    for h, w in ((300, 500), (480, 320), (224, 224)):
        img = rs.randint(0, 256, (h, w, 3)).astype(np.uint8)
        out = train.augment(img)
        assert out.shape == (224, 224, 3) and out.dtype == np.uint8
        out = val.augment(img)
        assert out.shape == (224, 224, 3) and out.dtype == np.uint8


@pytest.mark.usefixtures("no_leaks")
def test_get_imagenet_dataflow_train_and_val(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    datadir = make_ilsvrc12(tmp_path)
    # each pass of the runner is len(ds) = 12 images: 3 batches
    batches = take(get_imagenet_dataflow(datadir, "train", 4, parallel=2), 3)
    assert len(batches) == 3
    for x, y in batches:
        assert x.shape == (4, 224, 224, 3) and x.dtype == np.uint8
        assert y.shape == (4,) and set(y.tolist()) <= {0, 1, 2}
    df = get_imagenet_dataflow(datadir, "val", 2, parallel=2)
    batches = take(df, 3)                       # 5 images: batches of 2, 2 and 1
    assert [len(b[1]) for b in batches] == [2, 2, 1]
    # MultiThreadMapData (as tensorpack's) does not keep the order: every image once
    assert sorted(sum((b[1].tolist() for b in batches), [])) == [0, 0, 1, 1, 2]
    for x, _ in batches:
        assert x.shape[1:] == (224, 224, 3) and x.dtype == np.uint8


# == examples/ResNet/cifar10-resnet.py ===========================================================

BATCH_SIZE = 64


def get_cifar_data(train_or_test):
    isTrain = train_or_test == "train"
    ds = dataset.Cifar10(train_or_test)
    pp_mean = ds.get_per_pixel_mean(("train",))
    if isTrain:
        augmentors = [
            imgaug.CenterPaste((40, 40)),
            imgaug.RandomCrop((32, 32)),
            imgaug.Flip(horiz=True),
            imgaug.MapImage(lambda x: x - pp_mean),
        ]
    else:
        augmentors = [
            imgaug.MapImage(lambda x: x - pp_mean)
        ]
    ds = AugmentImageComponent(ds, augmentors)
    ds = BatchData(ds, BATCH_SIZE, remainder=not isTrain)
    if isTrain:
        ds = MultiProcessRunner(ds, 3, 2)
    return ds


def make_cifar10(root, n_train=2 * 64, n_test=80):
    """CIFAR-10 python batches (data_batch_1..5, test_batch, batches.meta) with few rows."""
    d = root / "cifar10_data" / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rs = np.random.RandomState(1)

    def batch(path, n):
        with open(path, "wb") as f:
            pickle.dump({b"data": rs.randint(0, 256, (n, 3072)).astype(np.uint8),
                         b"labels": [int(v) for v in rs.randint(0, 10, n)]}, f)
    for k in range(1, 6):
        batch(d / f"data_batch_{k}", n_train // 5 + (k <= n_train % 5))
    batch(d / "test_batch", n_test)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)


@pytest.mark.usefixtures("no_leaks")
def test_cifar10_resnet_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_cifar10(tmp_path)
    for x, y in take(get_cifar_data("train"), 3):
        assert x.shape == (64, 32, 32, 3) and x.dtype == np.float32
        assert y.shape == (64,) and y.dtype.kind == "i"
    test = take(get_cifar_data("test"), 10)
    assert [len(b[1]) for b in test] == [64, 16]           # remainder kept for test
    # the per-pixel mean was subtracted
    assert abs(float(np.concatenate([b[0] for b in test]).mean())) < 5


# == examples/FasterRCNN/data.py + common.py: boxes through the Transform API ======================

class CustomResize(imgaug.ImageAugmentor):
    """Scale the shortest edge to a random size in ``short_edge_length``, capping the longest
    edge at ``max_size``."""

    def __init__(self, short_edge_length, max_size, interp=cv2.INTER_LINEAR):
        super(CustomResize, self).__init__()
        if isinstance(short_edge_length, int):
            short_edge_length = (short_edge_length, short_edge_length)
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        size = self.rng.randint(self.short_edge_length[0], self.short_edge_length[1] + 1)
        scale = size * 1.0 / min(h, w)
        if h < w:
            newh, neww = size, scale * w
        else:
            newh, neww = scale * h, size
        if max(newh, neww) > self.max_size:
            scale = self.max_size * 1.0 / max(newh, neww)
            newh = newh * scale
            neww = neww * scale
        neww = int(neww + 0.5)
        newh = int(newh + 0.5)
        return imgaug.ResizeTransform(h, w, newh, neww, self.interp)


def box_to_point4(boxes):
    """(N, 4) boxes x1y1x2y2 -> (4N, 2) corners x1y1, x1y2, x2y2, x2y1."""
    b = boxes[:, [0, 1, 0, 3, 2, 3, 2, 1]]
    return b.reshape((-1, 2))


def point4_to_box(points):
    """(4N, 2) corners -> (N, 4) boxes (min and max of each group of four)."""
    p = points.reshape((-1, 4, 2))
    return np.concatenate((p.min(axis=1), p.max(axis=1)), axis=1)


class TrainingDataPreprocessor:
    """The image, box and polygon part of the Faster R-CNN example's preprocessor, with the
    example's default config (short edge [800, 800], max size 1333)."""

    def __init__(self):
        self.aug = imgaug.AugmentorList([
            CustomResize([800, 800], 1333),
            imgaug.Flip(horiz=True)])

    def __call__(self, roidb):
        fname, boxes = roidb["file_name"], roidb["boxes"]
        boxes = np.copy(boxes)
        im = cv2.imread(fname, cv2.IMREAD_COLOR)
        assert im is not None, fname
        im = im.astype("float32")
        height, width = im.shape[:2]
        assert boxes.dtype == np.float32
        # augmentation:
        tfms = self.aug.get_transform(im)
        im = tfms.apply_image(im)
        points = box_to_point4(boxes)
        points = tfms.apply_coords(points)
        boxes = point4_to_box(points)
        ret = {"image": im, "gt_boxes": boxes}
        # augmentation will modify the polys in-place
        segmentation = copy.deepcopy(roidb["segmentation"])
        ret["gt_polys"] = [[tfms.apply_coords(p) for p in polys] for polys in segmentation]
        return ret


def test_faster_rcnn_box_augmentation(tmp_path):
    fname = str(tmp_path / "img.jpg")
    _jpeg(fname, 200, 300, seed=3)                        # h=200, w=300: scale 4 -> 800x1200
    boxes = np.array([[10, 20, 110, 60], [0, 0, 300, 200]], np.float32)
    poly = np.array([[10, 20], [110, 20], [110, 60]], np.float32)
    roidb = {"file_name": fname, "boxes": boxes, "segmentation": [[poly]]}
    pre = TrainingDataPreprocessor()
    flips = set()
    for _ in range(12):
        ret = pre(roidb)
        assert ret["image"].shape == (800, 1200, 3) and ret["image"].dtype == np.float32
        assert ret["gt_boxes"].dtype == np.float32
        flipped = ret["gt_boxes"][0, 0] > 600
        flips.add(bool(flipped))
        want = boxes * 4
        if flipped:
            want = np.stack([1200 - want[:, 2], want[:, 1], 1200 - want[:, 0], want[:, 3]], 1)
        np.testing.assert_allclose(ret["gt_boxes"], want, rtol=1e-5)
        p = ret["gt_polys"][0][0]
        np.testing.assert_allclose(p[:, 1], poly[:, 1] * 4, rtol=1e-5)
        np.testing.assert_allclose(p[:, 0], 1200 - poly[:, 0] * 4 if flipped else poly[:, 0] * 4,
                                   rtol=1e-5)
    assert flips == {True, False}
    np.testing.assert_array_equal(roidb["boxes"][0], [10, 20, 110, 60])   # input untouched
    np.testing.assert_array_equal(roidb["segmentation"][0][0], poly)


# == examples/HED/hed.py ==========================================================================

class CropMultiple16(imgaug.ImageAugmentor):
    """Crop a random window whose height and width are the largest multiples of 16."""

    def get_transform(self, img):
        newh = img.shape[0] // 16 * 16
        neww = img.shape[1] // 16 * 16
        assert newh > 0 and neww > 0
        diffh = img.shape[0] - newh
        h0 = 0 if diffh == 0 else self.rng.randint(diffh)
        diffw = img.shape[1] - neww
        w0 = 0 if diffw == 0 else self.rng.randint(diffw)
        return imgaug.CropTransform(h0, w0, newh, neww)


def get_hed_data(name):
    isTrain = name == "train"
    ds = dataset.BSDS500(name, shuffle=True)

    if isTrain:
        shape_aug = [
            imgaug.RandomResize(xrange=(0.7, 1.5), yrange=(0.7, 1.5),
                                aspect_ratio_thres=0.15),
            imgaug.RotationAndCropValid(90),
            CropMultiple16(),
            imgaug.Flip(horiz=True),
            imgaug.Flip(vert=True),
        ]
    else:
        # the original image shape (321x481) in BSDS is not a multiple of 16
        IMAGE_SHAPE = (320, 480)
        shape_aug = [imgaug.CenterCrop(IMAGE_SHAPE)]
    ds = AugmentImageComponents(ds, shape_aug, (0, 1), copy=False)

    def f(m):   # thresholding
        m[m >= 0.50] = 1
        m[m < 0.50] = 0
        return m
    ds = MapDataComponent(ds, f, 1)

    if isTrain:
        augmentors = [
            imgaug.Brightness(63, clip=False),
            imgaug.Contrast((0.4, 1.5)),
        ]
        ds = AugmentImageComponent(ds, augmentors, copy=False)
        ds = BatchDataByShape(ds, 8, idx=0)
        ds = MultiProcessRunnerZMQ(ds, 1)
    else:
        ds = BatchData(ds, 1)
    return ds


def make_bsds500(root, sizes=(("train", 8), ("test", 3), ("val", 1))):
    """BSDS500's layout: BSR/BSDS500/data/images/<split>/*.jpg (321x481, one portrait) and
    groundTruth/<split>/*.mat (a cell array of annotator structs with 'Boundaries'). The train
    split has 8 images: BatchDataByShape(8) needs that many."""
    import scipy.io as sio
    base = root / "bsds500_data" / "BSR" / "BSDS500" / "data"
    for split, n in sizes:
        (base / "images" / split).mkdir(parents=True)
        (base / "groundTruth" / split).mkdir(parents=True)
        for k in range(n):
            h, w = (481, 321) if k == 0 else (321, 481)
            _jpeg(base / "images" / split / f"{k}.jpg", h, w, seed=k)
            rs = np.random.RandomState(k)
            gt = np.empty((1, 2), dtype=object)
            for a in range(2):
                gt[0, a] = {"Boundaries": (rs.rand(h, w) > 0.9).astype(np.uint8),
                            "Segmentation": np.ones((h, w), np.uint16)}
            sio.savemat(str(base / "groundTruth" / split / f"{k}.mat"), {"groundTruth": gt})


@pytest.mark.usefixtures("no_leaks")
def test_hed_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_bsds500(tmp_path)
    test = take(get_hed_data("test"), 10)
    assert len(test) == 3
    for x, y in test:
        assert x.shape == (1, 320, 480, 3) and x.dtype == np.uint8
        assert y.shape == (1, 320, 480) and y.dtype == np.float32
        assert set(np.unique(y)) <= {0.0, 1.0}
    # train: the stages before shape batching (BatchDataByShape(8) waits for 8 images of one
    # random shape, which a 3-image dataset rarely gives)
    train = get_hed_data("train")
    assert isinstance(train, MultiProcessRunnerZMQ)
    by_shape = train.map_func.ds             # what the runner's workers run (their own copies)
    assert isinstance(by_shape, BatchDataByShape)
    for x, y in take(by_shape.ds, 12):
        assert x.ndim == 3 and x.shape[2] == 3 and x.dtype == np.uint8
        assert x.shape[:2] == y.shape and y.dtype == np.float32
        assert x.shape[0] % 16 == 0 and x.shape[1] % 16 == 0
        assert set(np.unique(y)) <= {0.0, 1.0}


# == section 11.6: examples/basics/svhn-digit-convnet.py ==========================================

def get_svhn_data():
    """svhn-digit-convnet.py's get_data(): RandomMixData of train and extra, resized to 40 x 40
    with brightness and contrast jitter, batches of 128 from 5 processes; the test split
    resized, in batches of 128 with the remainder."""
    from dataflow import RandomMixData
    d1 = dataset.SVHNDigit('train')
    d2 = dataset.SVHNDigit('extra')
    data_train = RandomMixData([d1, d2])
    data_test = dataset.SVHNDigit('test', shuffle=False)
    augmentors = [imgaug.Resize((40, 40)), imgaug.Brightness(30), imgaug.Contrast((0.5, 1.5))]
    data_train = AugmentImageComponent(data_train, augmentors)
    data_train = BatchData(data_train, 128)
    data_train = MultiProcessRunner(data_train, 5, 5)
    data_test = AugmentImageComponent(data_test, [imgaug.Resize((40, 40))])
    data_test = BatchData(data_test, 128, remainder=True)
    return data_train, data_test


def make_svhn(root, sizes=(("train", 100), ("extra", 40), ("test", 5))):
    import scipy.io as sio
    d = root / "svhn_data"
    d.mkdir(parents=True, exist_ok=True)
    rs = np.random.RandomState(0)
    for name, n in sizes:
        X = rs.randint(0, 256, (32, 32, 3, n)).astype(np.uint8)
        y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)      # 10 stands for 0
        sio.savemat(str(d / f"{name}_32x32.mat"), {"X": X, "y": y})


def test_svhn_digit_convnet_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_svhn(tmp_path)
    train, test = get_svhn_data()
    for images, labels in take(train, 2):
        assert images.shape == (128, 40, 40, 3) and images.dtype == np.uint8
        assert labels.shape == (128,) and set(labels.tolist()) <= set(range(10))
    batches = take(test, 10)
    assert len(batches) == 1                                  # 5 images, remainder kept
    images, labels = batches[0]
    assert images.shape == (5, 40, 40, 3) and labels.tolist() == [1, 2, 3, 4, 5]


# == section 11.6: examples/GAN/Image2Image.py and DCGAN.py =======================================

def get_image2image_data(datadir, batch=1):
    """Image2Image.py's get_data(): each file holds input and output side by side; both halves
    get the same resize and random crop."""
    import glob
    from dataflow import ImageFromFile, MapData

    def split_input(img):
        s = img.shape[0]
        assert img.shape[2] == 3 and s * 2 == img.shape[1]
        return [img[:, :s, :], img[:, s:, :]]

    imgs = glob.glob(os.path.join(datadir, '*.jpg'))
    ds = ImageFromFile(imgs, channel=3, shuffle=True)
    ds = MapData(ds, lambda dp: split_input(dp[0]))
    augs = [imgaug.Resize(286), imgaug.RandomCrop(256)]
    ds = AugmentImageComponents(ds, augs, (0, 1))
    ds = BatchData(ds, batch)
    ds = MultiProcessRunner(ds, 100, 1)
    return ds


def test_image2image_get_data(tmp_path):
    rs = np.random.RandomState(0)
    for k in range(3):
        half = cv2.resize(rs.randint(0, 256, (8, 8, 3)).astype(np.uint8), (64, 64))
        half[0, 0] = (255, 0, 0)                         # blue in OpenCV's BGR
        ok, png = cv2.imencode(".png", np.concatenate([half, half], axis=1))
        assert ok
        (tmp_path / f"{k}.jpg").write_bytes(png.tobytes())   # lossless, so both halves match
    for a, b in take(get_image2image_data(str(tmp_path)), 6):
        assert a.shape == b.shape == (1, 256, 256, 3) and a.dtype == np.uint8
        np.testing.assert_array_equal(a, b)              # one transform for both components
    # RGB, as tensorpack's ImageFromFile(channel=3) gives: the blue corner is (0, 0, 255)
    from dataflow import ImageFromFile
    img = take(ImageFromFile([str(tmp_path / "0.jpg")], channel=3), 1)[0][0]
    assert tuple(img[0, 0]) == (0, 0, 255)


def get_dcgan_data(datadir, load_size=72, crop_size=64, final_size=64, batch=128):
    """DCGAN.py's get_data() with its get_augmentors(): resize, centre crop, resize."""
    import glob
    from dataflow import ImageFromFile
    imgs = glob.glob(datadir + '/*.jpg')
    ds = ImageFromFile(imgs, channel=3, shuffle=True)
    augs = [imgaug.Resize(load_size), imgaug.CenterCrop(crop_size), imgaug.Resize(final_size)]
    ds = AugmentImageComponent(ds, augs)
    ds = BatchData(ds, batch)
    ds = MultiProcessRunnerZMQ(ds, 5)
    return ds


def test_dcgan_get_data(tmp_path):
    for k in range(128):
        _jpeg(tmp_path / f"{k}.jpg", 40 + k % 7, 48 + k % 5, k)
    for (images,) in take(get_dcgan_data(str(tmp_path)), 2):
        assert images.shape == (128, 64, 64, 3) and images.dtype == np.uint8


# == section 11.6: examples/SuperResolution (data_sampler.py + enet-pat.py) =======================

def test_super_resolution_lmdb_pipeline(tmp_path):
    """data_sampler.py writes ``[uint8 array of JPEG bytes]`` datapoints to an LMDB; enet-pat.py
    reads it shuffled, decodes with ``MapDataComponent(cv2.imdecode)`` and crops and flips."""
    from dataflow import DataFromList, LMDBSerializer
    jpegs = []
    for k in range(6):
        _jpeg(tmp_path / f"{k}.jpg", 160 + 8 * k, 200, k)
        jpegs.append([np.frombuffer((tmp_path / f"{k}.jpg").read_bytes(), np.uint8)])
    db = str(tmp_path / "train.lmdb")
    LMDBSerializer.save(DataFromList(jpegs, shuffle=False), db)
    ds = LMDBSerializer.load(db, shuffle=True)
    ds = MapDataComponent(ds, lambda buf: cv2.imdecode(buf, cv2.IMREAD_COLOR), index=0)
    ds = AugmentImageComponent(ds, [imgaug.RandomCrop(128), imgaug.Flip(horiz=True)], index=0,
                               copy=True)
    out = take(ds, 10)
    assert len(out) == 6
    for (img,) in out:
        assert img.shape == (128, 128, 3) and img.dtype == np.uint8


# == section 11.1: docs/tutorial/efficient-dataflow.md ============================================

def write_ilsvrc12_lmdb(datadir, path):
    """The tutorial's LMDB writer: ILSVRC12Files subclassed to yield the JPEG bytes (as a uint8
    array) and the label, run in one process by MultiProcessRunnerZMQ, saved with
    LMDBSerializer."""
    from dataflow import LMDBSerializer

    class BinaryILSVRC12(dataset.ILSVRC12Files):
        def __iter__(self):
            for fname, label in super(BinaryILSVRC12, self).__iter__():
                with open(fname, 'rb') as f:
                    jpeg = f.read()
                jpeg = np.asarray(bytearray(jpeg), dtype='uint8')
                yield [jpeg, label]

    ds0 = BinaryILSVRC12(datadir, 'train')
    ds1 = MultiProcessRunnerZMQ(ds0, num_proc=1)
    LMDBSerializer.save(ds1, path)
    return ds1          # its worker lives on (the tutorial leaves it to the end of the script)


def read_ilsvrc12_lmdb(path, augmentors, batch_size):
    """The tutorial's reader: sequential LMDB read, local shuffle, decode, augment, batch."""
    from dataflow import LMDBSerializer, LocallyShuffleData
    ds = LMDBSerializer.load(path, shuffle=False)
    ds = LocallyShuffleData(ds, 50000)
    ds = MapDataComponent(ds, lambda x: cv2.imdecode(x, cv2.IMREAD_COLOR), 0)
    ds = AugmentImageComponent(ds, augmentors)
    ds = BatchData(ds, batch_size, use_list=True)
    return ds


@pytest.mark.usefixtures("no_leaks")
def test_efficient_dataflow_tutorial_lmdb_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    datadir = make_ilsvrc12(tmp_path)                 # 12 training JPEGs in 3 classes
    path = str(tmp_path / "ILSVRC-train.lmdb")
    write_ilsvrc12_lmdb(datadir, path).close()
    from dataflow import LMDBSerializer
    stored = take(LMDBSerializer.load(path, shuffle=False), 20)
    assert sorted(label for _, label in stored) == [0] * 4 + [1] * 4 + [2] * 4
    with open(os.path.join(datadir, "train", WNIDS[0], f"{WNIDS[0]}_0.JPEG"), "rb") as f:
        first = f.read()
    assert any(jpeg.tobytes() == first for jpeg, _ in stored)     # the file's bytes, as is
    del stored          # views of the LMDB file's map, which holds a file descriptor
    # LocallyShuffleData never ends a pass (as tensorpack's): take the first 3 batches
    batches = take(read_ilsvrc12_lmdb(path, [imgaug.Resize(224)], 4), 3)
    for images, _ in batches:
        assert len(images) == 4                       # use_list=True: lists, not arrays
        assert all(im.shape == (224, 224, 3) and im.dtype == np.uint8 for im in images)
    # the map variant of the tutorial: AugmentorList in MultiThreadMapData over ILSVRC12Files
    augmentor = imgaug.AugmentorList([imgaug.Resize(224)])
    ds0 = dataset.ILSVRC12Files(datadir, 'train', shuffle=True)
    ds1 = MultiThreadMapData(
        ds0, num_thread=2, buffer_size=1000,
        map_func=lambda dp: [augmentor.augment(cv2.imread(dp[0], cv2.IMREAD_COLOR)), dp[1]])
    images = take(BatchData(ds1, 4), 3)
    assert [b[0].shape for b in images] == [(4, 224, 224, 3)] * 3
