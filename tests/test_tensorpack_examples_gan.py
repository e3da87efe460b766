"""More of tensorpack's example pipelines, run on generated data with only their imports changed.

As in ``test_tensorpack_examples.py``: each pipeline below makes the dataflow and imgaug calls of
the tensorpack example named above it (the version closest to 0.11), written here with
``from dataflow import ...``; the model code is left out. The data is generated in a temporary
directory in each reader's on-disk layout, ``$TENSORPACK_DATASET`` pointing there.

Covered: GAN/ConditionalGAN-mnist and InfoGAN-mnist (MNIST, GAN.py's ``RandomZData``),
GAN/DCGAN-CelebA, GAN/DiscoGAN-CelebA, GAN/CycleGAN (BEGAN, WGAN and Improved-WGAN read through
DCGAN.py's ``get_data``, which the other file covers), SpatialTransformer/mnist-addition,
DynamicFilterNetwork/steering-filter, Colorization (its LMDB pipeline, with the 0.11 names of
the reader) and Saliency/CAM-resnet with the class names CaffeModels' loaders print.
ConvolutionalPoseMachines and Saliency/saliency-maps make no dataflow or imgaug call.
"""
import glob
import gzip
import os

import cv2
import numpy as np
import pytest

from dataflow import (AugmentImageComponent, AugmentImageComponents, BatchData,  # noqa: E402
                      ConcatData, DataFlow, DataFromList, FixedSizeData, ImageFromFile,
                      JoinData, LMDBSerializer, MapData, MapDataComponent,
                      MultiProcessRunnerZMQ, PrefetchData, ProxyDataFlow, RepeatedData,
                      RNGDataFlow, dataset, imgaug)

from .test_tensorpack_examples import (_jpeg, fbresnet_augmentor, make_bsds500,  # noqa: E402
                                       make_ilsvrc12, take)


def _write_idx(path, magic, arr):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def make_mnist(root, n_train=150, n_test=50):
    """MNIST's four gzipped IDX files in ``root/mnist_data``; labels cycle through 0..9."""
    d = root / "mnist_data"
    d.mkdir(parents=True)
    rs = np.random.RandomState(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(d / f"{split}-images-idx3-ubyte.gz", 2051, rs.randint(0, 256, (n, 28, 28)))
        _write_idx(d / f"{split}-labels-idx1-ubyte.gz", 2049, np.arange(n) % 10)


# == examples/GAN/ConditionalGAN-mnist.py, InfoGAN-mnist.py (and GAN.py's RandomZData) ==========

BATCH = 128


def get_conditional_gan_data():
    ds = ConcatData([dataset.Mnist('train'), dataset.Mnist('test')])
    return BatchData(ds, BATCH)


def get_infogan_data():
    ds = ConcatData([dataset.Mnist('train'), dataset.Mnist('test')])
    ds = BatchData(ds, BATCH)
    return MapData(ds, lambda dp: [dp[0]])        # the images only


class RandomZData(DataFlow):
    """GAN.py's source of latent vectors for sampling: endless, uniform in [-1, 1]."""

    def __init__(self, shape):
        super(RandomZData, self).__init__()
        self.shape = shape

    def __iter__(self):
        while True:
            yield [np.random.uniform(-1, 1, size=self.shape)]


def test_conditional_gan_and_infogan_mnist_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_mnist(tmp_path)
    df = get_conditional_gan_data()
    assert len(df.ds) == 200 and len(df) == 1             # 150 + 50 images, full batches only
    [(images, labels)] = take(df, 5)
    assert images.shape == (128, 28, 28) and images.dtype == np.float32
    assert 0 <= images.min() and images.max() <= 1
    assert labels.shape == (128,) and labels.dtype == np.uint8 and labels.max() <= 9
    [dp] = take(get_infogan_data(), 5)
    assert len(dp) == 1 and dp[0].shape == (128, 28, 28) and dp[0].dtype == np.float32
    # ConditionalGAN's sample(): a label per row of latent vectors
    zs = MapData(RandomZData((100, 100)), lambda dp: [np.arange(100) % 10, dp[0]])
    with pytest.raises(NotImplementedError):               # endless: no len()
        len(zs)
    for y, z in take(zs, 2):
        assert y.tolist() == [k % 10 for k in range(100)]
        assert z.shape == (100, 100) and z.dtype == np.float64 and np.abs(z).max() <= 1


# == examples/GAN/DCGAN-CelebA.py ================================================================

def get_dcgan_celeba_data(datadir, batch=BATCH):
    imgs = glob.glob(datadir + '/*.jpg')
    ds = ImageFromFile(imgs, channel=3, shuffle=True)
    ds = AugmentImageComponent(ds, [imgaug.CenterCrop(140), imgaug.Resize(64)])
    ds = BatchData(ds, batch)
    return MultiProcessRunnerZMQ(ds, 1)


def _celeba_like(folder, n):
    """``n`` aligned-CelebA-sized JPEGs (218 x 178) named 000001.jpg, ...; returns their paths."""
    folder.mkdir(exist_ok=True)
    paths = []
    for k in range(n):
        paths.append(str(folder / f"{k + 1:06d}.jpg"))
        _jpeg(paths[-1], 218, 178, seed=k)
    return paths


def _center_resize(path, crop, size):
    """The file as RGB, centre-cropped to ``crop`` and resized to ``size`` (bilinear)."""
    img = cv2.imread(path, cv2.IMREAD_COLOR)[:, :, ::-1]
    h0, w0 = (img.shape[0] - crop) // 2, (img.shape[1] - crop) // 2
    return cv2.resize(img[h0:h0 + crop, w0:w0 + crop], (size, size),
                      interpolation=cv2.INTER_LINEAR)


@pytest.mark.usefixtures("no_leaks")
def test_dcgan_celeba_get_data(tmp_path):
    paths = _celeba_like(tmp_path, 8)
    want = [_center_resize(p, 140, 64) for p in paths]
    batches = take(get_dcgan_celeba_data(str(tmp_path), batch=4), 2)
    got = np.concatenate([b[0] for b in batches])
    assert got.shape == (8, 64, 64, 3) and got.dtype == np.uint8
    # one pass of the shuffled files: each image once, cropped and resized as computed here
    sources = []
    for img in got:
        sources.append(min(range(8), key=lambda j: np.abs(img.astype(int) - want[j]).max()))
        np.testing.assert_array_equal(img, want[sources[-1]])
    assert sorted(sources) == list(range(8))


# == examples/GAN/DiscoGAN-CelebA.py =============================================================

def get_discogan_celeba_data(datadir, styleA, styleB=None, batch=64, num_proc=3):
    def read_attr(attrfname):
        with open(attrfname) as f:
            nr_record = int(f.readline())
            headers = f.readline().strip().split()
            rows = [list(map(int, line.strip().split()[1:])) for line in f]
        assert len(rows) == nr_record and all(len(r) == len(headers) for r in rows)
        return headers, np.asarray(rows, dtype='int8')

    headers, attrs = read_attr(os.path.join(datadir, 'list_attr_celeba.txt'))
    listA = np.nonzero(attrs[:, headers.index(styleA)] == 1)[0]
    if styleB is not None:
        listB = np.nonzero(attrs[:, headers.index(styleB)] == 1)[0]
    else:
        listB = np.nonzero(attrs[:, headers.index(styleA)] == -1)[0]

    def files(idxlist):
        return [os.path.join(datadir, '{:06d}.jpg'.format(x + 1)) for x in idxlist]

    df = JoinData([ImageFromFile(files(listA), channel=3, shuffle=True),
                   ImageFromFile(files(listB), channel=3, shuffle=True)])
    df = AugmentImageComponents(df, [imgaug.CenterCrop(160), imgaug.Resize(64)], (0, 1))
    df = BatchData(df, batch)
    return MultiProcessRunnerZMQ(df, num_proc)


@pytest.mark.usefixtures("no_leaks")
def test_discogan_celeba_get_data(tmp_path):
    paths = _celeba_like(tmp_path, 10)
    male = [k % 3 == 0 for k in range(10)]                   # 4 male, 6 not
    lines = ["10", "Bald Male Smiling"] + [
        f"{k + 1:06d}.jpg -1 {1 if male[k] else -1} {1 if k % 2 else -1}" for k in range(10)]
    (tmp_path / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    want = {k: _center_resize(p, 160, 64) for k, p in enumerate(paths)}

    def source(img):
        return min(want, key=lambda k: np.abs(img.astype(int) - want[k]).max())

    df = get_discogan_celeba_data(str(tmp_path), "Male", batch=2, num_proc=1)
    batches = take(df, 2)
    assert len(df) == 2                                       # min(4, 6) // 2
    for a, b in batches:
        assert a.shape == b.shape == (2, 64, 64, 3) and a.dtype == b.dtype == np.uint8
        for img in a:
            np.testing.assert_array_equal(img, want[source(img)])
            assert male[source(img)]
        for img in b:
            np.testing.assert_array_equal(img, want[source(img)])
            assert not male[source(img)]
    # with style B: the smiling ones (odd numbers) against the male ones
    df = get_discogan_celeba_data(str(tmp_path), "Male", "Smiling", batch=2, num_proc=1)
    for a, b in take(df, 2):
        assert all(source(img) % 2 == 1 for img in b)


# == examples/GAN/CycleGAN.py ====================================================================

SHAPE = 256
TEST_BATCH = 32


def get_cyclegan_data(datadir, isTrain=True):
    if isTrain:
        augs = [imgaug.Resize(int(SHAPE * 1.12)), imgaug.RandomCrop(SHAPE),
                imgaug.Flip(horiz=True)]
    else:
        augs = [imgaug.Resize(SHAPE)]

    def image_df(folder):
        files = sorted(glob.glob(os.path.join(folder, '*.jpg')))
        return AugmentImageComponent(ImageFromFile(files, channel=3, shuffle=isTrain), augs)

    names = ['trainA', 'trainB'] if isTrain else ['testA', 'testB']
    df = JoinData([image_df(os.path.join(datadir, n)) for n in names])
    df = BatchData(df, 1 if isTrain else TEST_BATCH, remainder=not isTrain)
    return MultiProcessRunnerZMQ(df, 2 if isTrain else 1)


@pytest.mark.usefixtures("no_leaks")
def test_cyclegan_get_data(tmp_path):
    for s, (split, n) in enumerate((("trainA", 3), ("trainB", 4), ("testA", 3), ("testB", 3))):
        (tmp_path / split).mkdir()
        for k in range(n):
            _jpeg(tmp_path / split / f"{k}.jpg", 200 + 10 * k, 240, seed=10 * s + k)
    train = get_cyclegan_data(str(tmp_path))
    assert len(train) == 3                     # the shorter side (JoinData warns of the other)
    for a, b in take(train, 4):
        assert a.shape == b.shape == (1, 256, 256, 3) and a.dtype == np.uint8
    # the test set, as VisualizeTestSet reads it: one remainder batch of 3, pass after pass
    test = get_cyclegan_data(str(tmp_path), isTrain=False)
    files = sorted(glob.glob(str(tmp_path / "testA" / "*.jpg")))
    want = np.stack([cv2.resize(cv2.imread(f)[:, :, ::-1], (256, 256)) for f in files])
    test.reset_state()
    try:
        for _ in range(2):
            [(a, b)] = list(test)
            assert a.shape == b.shape == (3, 256, 256, 3)
            np.testing.assert_array_equal(a, want)
    finally:
        test.close()


# == examples/SpatialTransformer/mnist-addition.py ===============================================

IMAGE_SIZE = 42


def get_mnist_addition_data(isTrain, batch=128):
    ds = dataset.Mnist('train' if isTrain else 'test')
    augs = [
        imgaug.MapImage(lambda x: x * 255.0),
        imgaug.RandomResize((0.7, 1.2), (0.7, 1.2)),
        imgaug.RotationAndCropValid(45),
        imgaug.RandomPaste((IMAGE_SIZE, IMAGE_SIZE)),
        imgaug.SaltPepperNoise(white_prob=0.01, black_prob=0.01),
    ]
    ds = AugmentImageComponent(ds, augs)
    ds = JoinData([ds, ds])                 # the same dataflow twice: two independent digits
    ds = MapData(ds, lambda dp: [np.stack([dp[0], dp[2]], axis=2), dp[1] + dp[3]])
    return BatchData(ds, batch)


def test_mnist_addition_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_mnist(tmp_path)
    train = get_mnist_addition_data(True)
    assert train.size() == len(train) == 1           # get_config: steps from size()
    [(x, y)] = take(train, 5)
    assert x.shape == (128, 42, 42, 2) and x.dtype == np.float32
    assert x.min() >= 0 and x.max() <= 255
    assert y.shape == (128,) and y.dtype == np.uint8 and y.max() <= 18
    # the two channels come from two passes over the shuffled split, augmented apart
    assert not any(np.array_equal(x[k, :, :, 0], x[k, :, :, 1]) for k in range(128))
    assert (y % 2 == 1).any()                       # not always twice the same digit
    test = take(get_mnist_addition_data(False, batch=16), 10)
    assert len(test) == 3                            # 50 test images: 3 full batches
    # the 28 x 28 digit, scaled by at most 1.2, is pasted into 42 x 42 zeros
    assert all(((b[0] == 0).sum(axis=(1, 2)) >= 42 * 42 - 34 * 34 - 40).all() for b in test)


# == examples/DynamicFilterNetwork/steering-filter.py ============================================

def _steering(theta, sigma=1., filter_size=9):
    x = np.arange(-filter_size // 2 + 1, filter_size // 2 + 1)
    g = np.array([np.exp(-(x ** 2) / (2 * sigma ** 2))])              # 1-D Gaussian
    gp = np.array([-(x / sigma) * np.exp(-(x ** 2) / (2 * sigma ** 2))])  # its derivative
    return g, gp, np.cos(theta) * (g.T @ gp) + np.sin(theta) * (g.T @ gp).T


def _convolve_same(image, kernel):
    """``scipy.signal.convolve2d(image, kernel, mode='same')`` (zero fill) in OpenCV, whose
    import costs nothing here (scipy.signal's takes a second)."""
    return cv2.filter2D(np.asarray(image, np.float64), -1, kernel[::-1, ::-1],
                        borderType=cv2.BORDER_CONSTANT)


class ThetaImages(ProxyDataFlow, RNGDataFlow):
    """Each grey image with a random angle, the image filtered by the steerable filter of that
    angle, and the filter."""

    @staticmethod
    def filter_with_theta(image, theta):
        g, gp, used_filter = _steering(theta)
        ix = _convolve_same(_convolve_same(image, -gp), g.T)
        iy = _convolve_same(_convolve_same(image, g), -gp.T)
        return np.cos(theta) * ix + np.sin(theta) * iy, used_filter

    def __init__(self, ds):
        ProxyDataFlow.__init__(self, ds)

    def reset_state(self):
        ProxyDataFlow.reset_state(self)
        RNGDataFlow.reset_state(self)

    def __len__(self):
        return len(self.ds)

    def __iter__(self):
        for image in self.ds:
            theta = self.rng.uniform(0, 2 * np.pi)
            filtered, used_filter = ThetaImages.filter_with_theta(image[0], theta)
            yield [theta, image[0], filtered, used_filter]


def get_steering_data(num_proc=2):
    ds = dataset.BSDS500('train', shuffle=True)
    ds = AugmentImageComponent(ds, [imgaug.Grayscale(keepdims=False),
                                    imgaug.Resize((64, 64))])
    ds = ThetaImages(ds)
    ds = RepeatedData(ds, 50)
    ds = MultiProcessRunnerZMQ(ds, num_proc)
    return BatchData(ds, 32)


@pytest.mark.usefixtures("no_leaks")
def test_steering_filter_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_bsds500(tmp_path)                                   # 8 training images
    df = get_steering_data()
    assert len(df) == 8 * 50 // 32
    batches = take(df, 2)
    thetas = np.concatenate([b[0] for b in batches])
    # each worker reseeds its copy of the RNGDataFlow: no angle comes twice
    assert len(set(thetas.tolist())) == 64
    for theta, image, filtered, used_filter in batches:
        assert theta.dtype == np.float32 and 0 <= theta.min() and theta.max() < 2 * np.pi
        assert image.shape == (32, 64, 64) and image.dtype == np.uint8
        assert filtered.shape == (32, 64, 64) and filtered.dtype == np.float64
        assert used_filter.shape == (32, 9, 9)
        for k in (0, 31):                                    # the components belong together
            want, f = ThetaImages.filter_with_theta(image[k], float(theta[k]))
            np.testing.assert_allclose(filtered[k], want, rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(used_filter[k], f, rtol=1e-4, atol=1e-6)


# == examples/Colorization/let-there-be-color.py (LMDB written as data_converter.py does) ========

class ImageDecode(MapDataComponent):
    """JPEG bytes to an RGB uint8 image."""

    def __init__(self, ds, mode='.jpg', dtype=np.uint8, index=0):
        def func(im_data):
            img = cv2.imdecode(np.asarray(bytearray(im_data), dtype=dtype), cv2.IMREAD_COLOR)
            return img[:, :, ::-1]
        super(ImageDecode, self).__init__(ds, func, index=index)


class RejectTooSmallImages(MapDataComponent):
    def __init__(self, ds, thresh=224, index=0):
        def func(img):
            h, w, _ = img.shape
            return None if h < thresh or w < thresh else img
        super(RejectTooSmallImages, self).__init__(ds, func, index=index)


class RejectGrayscaleImages(MapDataComponent):
    def __init__(self, ds, thresh=224, index=0):
        def func(img):
            if img.shape[2] == 1 or np.max((img[:, :, 0] - img[:, :, 1]) ** 2) < 1:
                return None
            return img
        super(RejectGrayscaleImages, self).__init__(ds, func, index=index)


def get_colorization_data(train_lmdb, val_lmdb, batch=32):
    ds_train = LMDBSerializer.load(train_lmdb, shuffle=True)
    ds_train = PrefetchData(ds_train, 100, 1)
    ds_train = ImageDecode(ds_train, index=0)
    ds_train = RejectTooSmallImages(ds_train, index=0)
    ds_train = AugmentImageComponent(ds_train, [imgaug.RandomCrop(224), imgaug.Flip(horiz=True)],
                                     index=0, copy=True)
    ds_train = RejectGrayscaleImages(ds_train, index=0)
    ds_train = BatchData(ds_train, batch)       # (the example runs this in 12 more processes)

    ds_val = LMDBSerializer.load(val_lmdb, shuffle=False)
    ds_val = ImageDecode(ds_val, index=0)
    ds_val = RejectTooSmallImages(ds_val, index=0)
    ds_val = AugmentImageComponent(ds_val, [imgaug.CenterCrop(224)], index=0, copy=True)
    ds_val = RejectGrayscaleImages(ds_val, index=0)
    ds_val = FixedSizeData(ds_val, 500)
    ds_val = BatchData(ds_val, batch)
    return ds_train, ds_val


@pytest.mark.usefixtures("no_leaks")
def test_colorization_lmdb_pipeline(tmp_path):
    dps, rgb = [], {}
    for k in range(8):
        path = str(tmp_path / f"{k}.jpg")
        _jpeg(path, 200 if k == 1 else 230 + 4 * k, 240, seed=k)   # 1: too small
        img = cv2.imread(path)
        if k == 2:                                                   # 2: grey
            img = cv2.cvtColor(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), cv2.COLOR_GRAY2BGR)
            assert cv2.imwrite(path, img)
        rgb[k] = cv2.imread(path)[:, :, ::-1]
        with open(path, "rb") as f:
            dps.append([np.frombuffer(f.read(), np.uint8), k])
    db = str(tmp_path / "places.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), db)
    train, val = get_colorization_data(db, db, batch=4)
    # val: images 1 and 2 dropped, FixedSizeData restarts the source to make up its 500
    assert len(val) == 125
    batches = take(val, 3)
    assert [b[1].tolist() for b in batches] == [[0, 3, 4, 5], [6, 7, 0, 3], [4, 5, 6, 7]]
    images = batches[0][0]
    assert images.shape == (4, 224, 224, 3) and images.dtype == np.uint8
    h0 = (rgb[0].shape[0] - 224) // 2
    np.testing.assert_array_equal(images[0], rgb[0][h0:h0 + 224, 8:232])
    for images, labels in take(train, 3):
        assert images.shape == (4, 224, 224, 3) and images.dtype == np.uint8
        assert not set(labels.tolist()) & {1, 2}


# == examples/Saliency/CAM-resnet.py; CaffeModels/load-*.py's class names =======================

def get_cam_data(datadir, train_or_test, batch):
    isTrain = train_or_test == 'train'
    ds = dataset.ILSVRC12(datadir, train_or_test, shuffle=isTrain)
    augmentors = fbresnet_augmentor(isTrain)
    augmentors.append(imgaug.ToUint8())
    ds = AugmentImageComponent(ds, augmentors, copy=False)
    if isTrain:
        ds = MultiProcessRunnerZMQ(ds, 2)
    return BatchData(ds, batch, remainder=not isTrain)


def test_cam_resnet_val_data_and_class_names(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    datadir = make_ilsvrc12(tmp_path)                 # val: 5 images, 300 wide, labels k % 3
    batches = take(get_cam_data(datadir, 'val', 2), 5)
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 0], [1]]
    first = cv2.imread(os.path.join(datadir, "val", "ILSVRC2012_val_00000001.JPEG"))
    h, w = first.shape[:2]                            # 260 x 300: shortest edge to 256
    resized = cv2.resize(first, (int(256 / h * w + 0.5), 256), interpolation=cv2.INTER_CUBIC)
    w0 = (resized.shape[1] - 224) // 2
    np.testing.assert_array_equal(batches[0][0][0], resized[16:240, w0:w0 + 224])
    assert batches[0][0].dtype == np.uint8
    meta = dataset.ILSVRCMeta().get_synset_words_1000()
    assert meta[int(batches[0][1][1])].split(',')[0] == "n01443537 class 1"
