"""The ways public projects built on tensorpack 0.11 call ``tensorpack.dataflow``, made with our
names: module paths, keywords, subclassing hooks and attributes that such code relies on.

Each test is our own small pipeline making the same calls; the shapes and lengths it checks are
those tensorpack 0.11 gives for the same input (compared when these tests were written)."""
import itertools

import numpy as np
import pytest

import dataflow as df
from dataflow import imgaug


def _img(i, h=8, w=10):
    return (np.arange(h * w * 3, dtype=np.uint8).reshape(h, w, 3) + i).astype(np.uint8)


def _src(n):
    return df.DataFromList([[_img(i), i] for i in range(n)], shuffle=False)


# -- fixes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["msgpack", "pickle"])
def test_lmdbserializer_deserialize_lmdb_decodes_lmdbdata_records(tmp_path, fmt):
    # LMDBData + a map calling LMDBSerializer._deserialize_lmdb (tensorpack's private decoder)
    from dataflow.serialize import LMDBSerializer
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(_src(3), path, format=fmt)
    raw = df.LMDBData(path, shuffle=False)
    ds = df.MapData(raw, LMDBSerializer._deserialize_lmdb)
    ds.reset_state()
    out = list(ds)
    assert [dp[1] for dp in out] == [0, 1, 2]
    np.testing.assert_array_equal(out[2][0], _img(2))
    raw.close()


# -- patterns verified against tensorpack 0.11 ---------------------------------------------------
def test_old_style_rngdataflow_through_tensorpack_module_paths():
    from dataflow.base import RNGDataFlow
    from dataflow.common import BatchData, MapData, MapDataComponent

    class Cells(RNGDataFlow):              # no super().__init__(), get_data()/size()
        def __init__(self, n):
            self.idx = list(range(n))

        def size(self):
            return len(self.idx)

        def get_data(self):
            for i in self.idx:
                yield [_img(i)]

    ds = MapDataComponent(Cells(6), lambda x: x[:4, :4])
    ds = MapData(ds, lambda dp: [dp[0], dp[0][..., 0]])
    ds = MapDataComponent(BatchData(ds, 3), lambda x: x / 255.0)
    ds.reset_state()
    out = list(ds.get_data())
    assert len(ds) == ds.size() == 2 == len(out)
    assert out[0][0].shape == (3, 4, 4, 3) and out[0][0].dtype == np.float64
    assert out[0][1].shape == (3, 4, 4) and out[0][1].dtype == np.uint8


def test_old_style_proxydataflow_subclass_without_super_init():
    class Pairs(df.ProxyDataFlow):
        def __init__(self, ds, b):
            self.ds, self.b = ds, b

        def size(self):
            return self.ds.size() // self.b

        def get_data(self):
            it = self.ds.get_data()
            for _ in range(self.size()):
                yield [next(it)[1] for _ in range(self.b)]

    ds = Pairs(_src(5), 2)
    ds.reset_state()
    assert len(ds) == 2 and list(ds) == [[0, 1], [2, 3]] == list(ds.get_data())


def test_augmentor_subclasses_moco_style():
    class Gray(imgaug.PhotometricAugmentor):
        def __init__(self, prob):
            super().__init__()
            self._init(locals())

        def _get_augment_params(self, _):
            return self._rand_range() < self.prob

        def _augment(self, img, do):
            return np.stack([img[..., 0]] * 3, axis=2) if do else img

    class CropResize(imgaug.ImageAugmentor):
        def __init__(self, target_shape=4):
            super().__init__()
            self._init(locals())

        def get_transform(self, img):
            return imgaug.TransformList([
                imgaug.CropTransform(1, 1, 6, 6),
                imgaug.ResizeTransform(6, 6, self.target_shape, self.target_shape, interp=1)])

    augs = imgaug.AugmentorList([
        CropResize(), Gray(1.0), imgaug.ToFloat32(),
        imgaug.RandomOrderAug([imgaug.BrightnessScale((0.6, 1.4)),
                               imgaug.Contrast((0.6, 1.4), rgb=False),
                               imgaug.Saturation(0.4, rgb=False),
                               imgaug.Hue(range=(-72, 72), rgb=False)]),
        imgaug.RandomApplyAug(Gray(1.0), 0.8), imgaug.ToUint8(), imgaug.Flip(horiz=True)])
    out = augs.augment(_img(0))
    assert out.shape == (4, 4, 3) and out.dtype == np.uint8


def test_random_crop_random_shape_subclass_and_transforms_deeplabcut_style():
    from dataflow.imgaug.crop import RandomCropRandomShape
    from dataflow.imgaug.meta import RandomApplyAug
    from dataflow.imgaug.transform import CropTransform

    class Cropping(RandomCropRandomShape):
        def __init__(self, wmin, hmin, wmax=None, hmax=None):
            self.rng = np.random.RandomState(0)         # set before the base __init__
            super().__init__(wmin, hmin, wmax, hmax)

        def get_transform(self, img):
            h = min(self.hmax or img.shape[0], img.shape[0])
            w = min(self.wmax or img.shape[1], img.shape[1])
            return CropTransform(1, 1, h - 1, w - 1)

    augs = [RandomApplyAug(Cropping(2, 2, 5, 5), 1.0),
            RandomApplyAug(imgaug.Rotation(max_deg=25), 1.0),
            RandomApplyAug(imgaug.Brightness(0.3), 1.0),
            RandomApplyAug(imgaug.Contrast((0.5, 2.0), rgb=True, clip=True), 1.0),
            RandomApplyAug(imgaug.Saturation(0.5, rgb=True), 1.0),
            RandomApplyAug(imgaug.GaussianNoise(sigma=0.1), 1.0),
            RandomApplyAug(imgaug.GaussianBlur(max_size=3), 1.0),
            RandomApplyAug(imgaug.RandomResize(xrange=(0.9, 1.1), aspect_ratio_thres=0.0), 1.0)]
    img, coords = _img(0), np.array([[2.0, 3.0], [4.0, 5.0]])
    for aug in augs:
        tfm = aug.get_transform(img)
        img, coords = tfm.apply_image(img), tfm.apply_coords(coords)
    assert img.shape == (4, 4, 3) and img.dtype == np.uint8
    assert coords.shape == (2, 2) and coords.dtype == np.float64


def test_rotation_and_crop_valid_largest_rotated_rect_static():
    from dataflow.imgaug.geometry import RotationAndCropValid
    assert [round(float(x), 3) for x in RotationAndCropValid.largest_rotated_rect(100, 80, 0.3)] \
        == [100.0, 79.0]


def test_augment_image_component_wbaek_style_keywords():
    ds = df.DataFromList([[_img(i)[..., 0], i] for i in range(8)], shuffle=False)
    augs = [imgaug.RandomApplyAug(imgaug.RandomResize((0.8, 1.2), (0.8, 1.2)), 0.3),
            imgaug.RandomApplyAug(imgaug.RotationAndCropValid(15), 0.5),
            imgaug.RandomApplyAug(imgaug.SaltPepperNoise(white_prob=0.01, black_prob=0.01), 0.25),
            imgaug.Resize((6, 6)), imgaug.CenterPaste((8, 8)), imgaug.RandomCrop((6, 6)),
            imgaug.MapImage(lambda x: x.reshape(6, 6, 1))]
    ds = df.BatchData(df.AugmentImageComponent(ds, augs), batch_size=4, remainder=False)
    ds.reset_state()
    out = list(ds.get_data())
    assert len(out) == 2 and out[0][0].shape == (4, 6, 6, 1) and out[0][1].dtype == np.int32


def test_parallel_keywords_and_runner_pass_length(no_leaks):
    # the keywords tensorpack 0.11 code passes; a runner's pass ends after len(ds) datapoints,
    # as tensorpack's (RepeatedData(runner, -1) gives one endless stream)
    src = df.DataFromList([[i] for i in range(5)], shuffle=False)
    m = df.MultiThreadMapData(src, num_thread=2, map_func=lambda dp: [dp[0] * 2],
                              buffer_size=4, strict=True)
    m.reset_state()
    assert sorted(dp[0] for dp in m) == [0, 2, 4, 6, 8]
    r = df.RepeatedData(df.PrefetchDataZMQ(src, num_proc=1, hwm=4), -1)
    r.reset_state()
    assert [dp[0] for dp in itertools.islice(r, 7)] == [0, 1, 2, 3, 4, 0, 1]
    b = df.BatchData(df.MultiProcessRunnerZMQ(src, 1), 2)
    b.reset_state()
    assert len(b) == 2 == len(list(b.get_data()))
    m.close()
    r.ds.close()
    b.ds.close()


def test_cifar_data_attribute_is_the_list_of_datapoints(tmp_path):
    # get_data(is_train, batch_size, num_samples): DataFromList(Cifar10(...).data[:n], shuffle=False)
    from dataflow.dataset import Cifar10
    from tests.test_dataset import fake_cifar
    expected = fake_cifar(tmp_path, 10)
    data = Cifar10("test", dir=str(tmp_path))
    assert len(data.data) == len(data) == 3
    ds = df.DataFromList(data.data[:2], shuffle=False)
    ds.reset_state()
    out = list(ds)
    assert len(out) == 2 and [dp[1] for dp in out] == expected["test"][1][:2]
    assert out[1][0].shape == (32, 32, 3) and out[1][0].dtype == np.uint8
    np.testing.assert_array_equal(out[1][0], expected["test"][0][1])
