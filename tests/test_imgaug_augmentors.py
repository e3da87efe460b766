"""Every dataflow.imgaug augmentor: output shapes, dtypes and value ranges on uint8 and float32
images; deterministic ones equal to OpenCV/numpy (and to tensorpack 0.11 where 0.11 is right);
random ones checked against the formula with their drawn parameter."""
import subprocess
import sys

import cv2
import numpy as np
import pytest

from dataflow import imgaug
from dataflow.imgaug.deform import GaussianDeform

EIGVAL = np.asarray([0.2175, 0.0188, 0.0045][::-1]) * 255.0
EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                   [-0.5808, -0.0045, -0.8140],
                   [-0.5836, -0.6948, 0.4203]], dtype="float32")[::-1, ::-1]


class FixedRNG:
    """Stands in for an augmentor's rng: ``uniform``/``randint``/``rand``/``randn`` return
    the given values in order."""

    def __init__(self, *values):
        self.values = list(values)

    def _next(self, size):
        v = self.values.pop(0)
        return np.full(size, v) if size is not None else v

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._next(size)

    def randint(self, low, high=None, size=None):
        return self._next(size)

    def rand(self):
        return self._next(None)

    def randn(self, *shape):
        return np.asarray(self.values.pop(0), dtype=np.float64)


def image(h=30, w=40, c=3, dtype=np.uint8, seed=0):
    shape = (h, w, c) if c else (h, w)
    return (np.random.RandomState(seed).rand(*shape) * 255).astype(dtype)


def fixed(aug, *values):
    aug.rng = FixedRNG(*values)
    return aug


# -- all augmentors: shape, dtype, range ----------------------------------------------------------
SHAPE_KEEPING_PHOTOMETRIC = [
    lambda: imgaug.Hue(), lambda: imgaug.Hue((0, 180), rgb=False),
    lambda: imgaug.Brightness(50), lambda: imgaug.BrightnessScale((0.5, 1.5)),
    lambda: imgaug.Contrast((0.5, 1.5)), lambda: imgaug.Contrast((0.5, 1.5), rgb=False),
    lambda: imgaug.GaussianBlur(), lambda: imgaug.Gamma(), lambda: imgaug.Clip(),
    lambda: imgaug.Saturation(), lambda: imgaug.Lighting(0.1, EIGVAL, EIGVEC),
    lambda: imgaug.JpegNoise(), lambda: imgaug.GaussianNoise(5),
    lambda: imgaug.SaltPepperNoise(), lambda: imgaug.RandomCutout((3, 8), (3, 8)),
    lambda: imgaug.Identity(), lambda: imgaug.Flip(horiz=True), lambda: imgaug.Flip(vert=True),
    lambda: imgaug.Shift(0.2, 0.2), lambda: imgaug.Rotation(30), lambda: imgaug.Affine(
        (0.8, 1.2), (0.1, 0.1), 20, 10),
    lambda: imgaug.RandomOrderAug([imgaug.Brightness(10), imgaug.Contrast((0.8, 1.2))]),
    lambda: imgaug.RandomApplyAug(imgaug.Brightness(10), 0.5),
    lambda: imgaug.RandomChooseAug([imgaug.Brightness(10), imgaug.Identity()]),
    lambda: imgaug.MapImage(lambda x: x),
]


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("make", SHAPE_KEEPING_PHOTOMETRIC)
def test_shape_dtype_and_range_are_kept(make, dtype):
    aug = make()
    for seed in range(3):
        img = image(dtype=dtype, seed=seed)
        out = aug.augment(img.copy())
        assert out.shape == img.shape, aug
        assert out.dtype == dtype, aug
        assert out.min() >= 0 and out.max() <= 255, aug


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("make", [
    lambda: imgaug.Hue(), lambda: imgaug.Brightness(50), lambda: imgaug.Contrast((0.5, 1.5)),
    lambda: imgaug.Saturation(), lambda: imgaug.Lighting(0.1, EIGVAL, EIGVEC),
    lambda: imgaug.GaussianNoise(5), lambda: imgaug.Gamma(), lambda: imgaug.Clip(10, 100),
    lambda: imgaug.MeanVarianceNormalize(), lambda: imgaug.MinMaxNormalize(),
    lambda: imgaug.ToUint8(), lambda: imgaug.Grayscale(), lambda: imgaug.JpegNoise(),
    lambda: imgaug.BrightnessScale((0.5, 1.5)), lambda: imgaug.GaussianBlur()])
def test_photometric_augmentors_do_not_modify_their_input(make, dtype):
    img = image(dtype=dtype)
    keep = img.copy()
    make().augment(img)
    np.testing.assert_array_equal(img, keep)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("shape", [(30, 40), (30, 40, 1), (30, 40, 2), (30, 40, 5)])
@pytest.mark.parametrize("make", [
    lambda: imgaug.Brightness(50), lambda: imgaug.BrightnessScale((0.5, 1.5)),
    lambda: imgaug.Contrast((0.5, 1.5)), lambda: imgaug.GaussianBlur(), lambda: imgaug.Gamma(),
    lambda: imgaug.GaussianNoise(), lambda: imgaug.JpegNoise(), lambda: imgaug.Resize(10),
    lambda: imgaug.Rotation(10), lambda: imgaug.MeanVarianceNormalize(all_channel=False),
    lambda: imgaug.MinMaxNormalize(all_channel=False), lambda: imgaug.RandomCrop(5)])
def test_other_channel_counts_keep_their_layout(make, shape, dtype):
    img = image(*shape[:2], c=shape[2] if len(shape) == 3 else None, dtype=dtype)
    aug = make()
    if isinstance(aug, imgaug.JpegNoise) and img.ndim == 3 and img.shape[2] not in (1, 3, 4):
        with pytest.raises(ValueError, match="JpegNoise needs a grey image"):
            aug.augment(img)            # JPEG holds 1 or 3 channels
        return
    out = aug.augment(img)
    assert out.ndim == img.ndim and out.shape[2:] == img.shape[2:]


def test_more_than_four_channels_take_the_numpy_path():
    img = image(c=6, dtype=np.float32)
    out = fixed(imgaug.Brightness(50), 10.0).augment(img)
    np.testing.assert_allclose(out, np.clip(img + 10, 0, 255), rtol=1e-6)
    u8 = image(c=6)
    out = fixed(imgaug.BrightnessScale((0.5, 2)), 1.5).augment(u8)
    np.testing.assert_array_equal(out, np.clip(np.rint(u8 * 1.5), 0, 255).astype(np.uint8))


# -- geometry -------------------------------------------------------------------------------------
def test_flip_prob():
    img = image()
    np.testing.assert_array_equal(imgaug.Flip(horiz=True, prob=1.0).augment(img), img[:, ::-1])
    np.testing.assert_array_equal(imgaug.Flip(vert=True, prob=1.0).augment(img), img[::-1])
    np.testing.assert_array_equal(imgaug.Flip(horiz=True, prob=0.0).augment(img), img)
    with pytest.raises(ValueError):
        imgaug.Flip(horiz=True, vert=True)
    with pytest.raises(ValueError):
        imgaug.Flip()


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_resize_and_resize_shortest_edge_equal_cv2(dtype):
    img = image(dtype=dtype)
    np.testing.assert_array_equal(imgaug.Resize((12, 17), cv2.INTER_CUBIC).augment(img),
                                  cv2.resize(img, (17, 12), interpolation=cv2.INTER_CUBIC))
    np.testing.assert_array_equal(imgaug.Resize(9).augment(img), cv2.resize(img, (9, 9)))
    assert imgaug.ResizeShortestEdge(15).augment(img).shape == (15, 20, 3)
    assert imgaug.ResizeShortestEdge(15).augment(image(41, 30)).shape == (21, 15, 3)
    np.testing.assert_array_equal(imgaug.ResizeShortestEdge(15).augment(img),
                                  cv2.resize(img, (20, 15)))


def test_random_resize_sizes():
    img = image(40, 60)
    for _ in range(20):
        h, w = imgaug.RandomResize((0.5, 1.5)).augment(img).shape[:2]
        assert 20 <= h <= 60 and 30 <= w <= 90
        assert abs((w / h) / 1.5 - 1) < 0.15 + 0.05     # thres, plus rounding
        h, w = imgaug.RandomResize((0.5, 1.5), aspect_ratio_thres=0).augment(img).shape[:2]
        assert abs(w / h - 1.5) < 0.1
        h, w = imgaug.RandomResize((50, 70), (30, 50), aspect_ratio_thres=0.5).augment(
            img).shape[:2]
        assert 50 <= w <= 70 and 30 <= h <= 50
    h, w = imgaug.RandomResize((0.1, 0.2), minimum=(25, 15)).augment(img).shape[:2]
    assert (w, h) == (25, 15)
    with pytest.raises(ValueError):
        imgaug.RandomResize((0.5, 1.5), (10, 20))


def test_transpose():
    img = image()
    np.testing.assert_array_equal(imgaug.Transpose(prob=1.0).augment(img), img.swapaxes(0, 1))
    np.testing.assert_array_equal(imgaug.Transpose(prob=0.0).augment(img), img)


def test_rotation_step_and_shape():
    img = image(31, 31)
    for _ in range(10):
        out = imgaug.Rotation(180, step_deg=90, center_range=(0.5, 0.5),
                              border=cv2.BORDER_CONSTANT).augment(img)
        # a multiple of 90 degrees about the centre of a square image loses no pixel
        assert any(np.array_equal(out, np.rot90(img, k)) for k in range(4))
    with pytest.raises(ValueError):
        imgaug.Rotation(90, step_deg=45)


# tensorpack 0.11's RotationAndCropValid.largest_rotated_rect(w, h, deg), recorded from it
TP_RECTS = {(30, 20, 0): (30, 20), (30, 20, 5): (29, 18), (30, 20, 30): (20, 12),
            (30, 20, 45): (14, 14), (30, 20, 60): (12, 20), (30, 20, 90): (20, 30),
            (30, 20, -20): (28, 11), (30, 20, 135): (14, 14), (20, 30, 5): (18, 29),
            (20, 30, 60): (20, 12), (20, 30, -20): (11, 28), (50, 50, 5): (46, 46),
            (50, 50, 30): (37, 37), (50, 50, 45): (35, 35), (50, 50, -20): (39, 39),
            (100, 17, 5): (98, 9), (100, 17, 30): (17, 10), (100, 17, 45): (12, 12),
            (100, 17, 60): (10, 17), (100, 17, -20): (25, 9)}


def test_rotation_and_crop_valid_rectangle_matches_tensorpack():
    for (w, h, deg), expected in TP_RECTS.items():
        assert imgaug.RotationAndCropValid.largest_rotated_rect(w, h, deg) == expected, \
            (w, h, deg)
    img = image(40, 60)
    for _ in range(5):
        out = imgaug.RotationAndCropValid(30).augment(img)
        assert out.shape[0] <= 40 and out.shape[1] <= 60 and out.ndim == 3


# -- crops and paste ------------------------------------------------------------------------------
def test_center_crop_equals_slicing():
    img = image(31, 40)
    out = imgaug.CenterCrop((10, 13)).augment(img)
    np.testing.assert_array_equal(out, img[10:20, 13:26])
    with pytest.raises(ValueError):
        imgaug.CenterCrop(50).augment(img)


def test_random_crop_positions():
    img = np.arange(5 * 6).reshape(5, 6).astype(np.float32)
    seen = set()
    aug = imgaug.RandomCrop((4, 4))
    for _ in range(200):
        out = aug.augment(img)
        assert out.shape == (4, 4)
        seen.add((int(out[0, 0]) // 6, int(out[0, 0]) % 6))
    assert seen == {(y, x) for y in range(2) for x in range(3)}
    with pytest.raises(ValueError):
        aug.augment(img[:3])


def test_random_crop_random_shape_sizes():
    img = image(20, 30)
    for _ in range(50):
        h, w = imgaug.RandomCropRandomShape(5, 8, 10, 12).augment(img).shape[:2]
        assert 8 <= h <= 12 and 5 <= w <= 10
    h, w = imgaug.RandomCropRandomShape(30, 20).augment(img).shape[:2]
    assert (h, w) == (20, 30)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_googlenet_crop_and_resize(dtype):
    img = image(60, 80, dtype=dtype)
    for _ in range(10):
        out = imgaug.GoogleNetRandomCropAndResize(target_shape=32).augment(img)
        assert out.shape == (32, 32, 3) and out.dtype == dtype
    # no window fits: resize the short edge to the target and crop the centre
    aug = fixed(imgaug.GoogleNetRandomCropAndResize(target_shape=32), *([1.0, 100.0, 0.9] * 10))
    out = aug.augment(img)
    np.testing.assert_array_equal(out, cv2.resize(img, (43, 32))[:, 5:37])


def test_random_cutout_with_tuple_and_int_ranges():
    img = np.full((20, 30), 9.0, np.float32)
    for h_range, w_range in [((2, 6), (3, 9)), (4, 5), ((4, 5), 7)]:
        out = imgaug.RandomCutout(h_range, w_range, fill=1.0).augment(img.copy())
        ys, xs = np.nonzero(out == 1.0)
        h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
        hr = h_range if isinstance(h_range, tuple) else (h_range, h_range + 1)
        wr = w_range if isinstance(w_range, tuple) else (w_range, w_range + 1)
        assert hr[0] <= h < hr[1] and wr[0] <= w < wr[1]
        assert len(ys) == h * w


def test_center_and_random_paste():
    img = image(10, 12)
    out = imgaug.CenterPaste((20, 30)).augment(img)
    np.testing.assert_array_equal(out[5:15, 9:21], img)
    out = imgaug.CenterPaste((20, 30), imgaug.ConstantBackgroundFiller(7)).augment(img)
    assert out[0, 0, 0] == 7 and out.dtype == np.uint8
    for _ in range(10):
        out = imgaug.RandomPaste((20, 30)).augment(img)
        ys, xs = np.nonzero((out != 0).any(axis=2))
        np.testing.assert_array_equal(out[ys.min():ys.min() + 10, xs.min():xs.min() + 12], img)
    np.testing.assert_array_equal(imgaug.RandomPaste((10, 12)).augment(img), img)
    with pytest.raises(ValueError):
        imgaug.CenterPaste((5, 30)).augment(img)
    with pytest.raises(NotImplementedError):
        imgaug.BackgroundFiller().fill((3, 3), img)


def test_paste_background_shape_may_be_a_numpy_array():
    # tensorpack's pastes take any indexable pair (e.g. np.array(img.shape[:2]) + 20); ours
    # raised "Illegal shape" for an array
    img = image(10, 12)
    out = imgaug.CenterPaste(np.array([20, 30])).augment(img)
    assert out.shape == (20, 30, 3)
    np.testing.assert_array_equal(out[5:15, 9:21], img)
    assert imgaug.RandomPaste(np.array([20, 30])).augment(img).shape == (20, 30, 3)
    filler = imgaug.ConstantBackgroundFiller(7)
    np.testing.assert_array_equal(filler.fill(np.array([3, 4]), img), np.full((3, 4, 3), 7))


def test_constant_filler_keeps_dtype_and_refuses_a_value_that_does_not_fit():
    img = image(4, 4)                                   # uint8, 3 channels
    out = imgaug.ConstantBackgroundFiller(127.5).fill((3, 3), img)
    assert out.dtype == np.uint8 and out.shape == (3, 3, 3)
    np.testing.assert_array_equal(imgaug.ConstantBackgroundFiller([1, 2, 3]).fill((2, 2), img),
                                  np.tile(np.uint8([1, 2, 3]), (2, 2, 1)))
    with pytest.raises(ValueError, match=r"ConstantBackgroundFiller: value \[1, 2, 3\] does "
                                         r"not fit .* image of shape \(4, 4, 1\)"):
        imgaug.ConstantBackgroundFiller([1, 2, 3]).fill((3, 3), img[..., :1])


# -- photometric: the formula with the drawn parameter --------------------------------------------
def test_brightness_and_scale_formulas():
    img = image(dtype=np.float32)
    np.testing.assert_allclose(fixed(imgaug.Brightness(50), 30.0).augment(img),
                               np.clip(img + 30, 0, 255), rtol=1e-6)
    np.testing.assert_allclose(fixed(imgaug.Brightness(50, clip=False), 30.0).augment(img),
                               img + 30, rtol=1e-6)
    u8 = image()
    np.testing.assert_array_equal(fixed(imgaug.Brightness(50), -20.4).augment(u8),
                                  np.clip(np.rint(u8 - 20.4), 0, 255).astype(np.uint8))
    np.testing.assert_allclose(fixed(imgaug.BrightnessScale((0.5, 2)), 1.7).augment(img),
                               np.clip(img * 1.7, 0, 255), rtol=1e-6)
    np.testing.assert_array_equal(fixed(imgaug.BrightnessScale((0.5, 2)), 1.7).augment(u8),
                                  np.clip(np.rint(u8 * 1.7), 0, 255).astype(np.uint8))


def test_brightness_on_float64_keeps_the_dtype():
    img = image(dtype=np.float64)
    out = fixed(imgaug.Brightness(50), 30.0).augment(img)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, np.clip(img + 30, 0, 255), rtol=1e-5)


@pytest.mark.parametrize("rgb", [None, True, False])
def test_contrast_formula(rgb):
    img = image(dtype=np.float32)
    if rgb is None:
        mean = img.mean(axis=(0, 1), keepdims=True)
    else:
        grey = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY if rgb else cv2.COLOR_BGR2GRAY)
        mean = grey.mean()
    expected = np.clip(img * 1.4 + mean * (1 - 1.4), 0, 255)
    np.testing.assert_allclose(fixed(imgaug.Contrast((0.5, 1.5), rgb=rgb), 1.4).augment(img),
                               expected, rtol=1e-4, atol=1e-3)
    grey2d = img[:, :, 0].copy()
    out = fixed(imgaug.Contrast((0.5, 1.5)), 0.6).augment(grey2d)
    np.testing.assert_allclose(out, grey2d * 0.6 + grey2d.mean() * 0.4, rtol=1e-4)


@pytest.mark.parametrize("rgb", [True, False])
def test_saturation_formula(rgb):
    img = image(dtype=np.float32)
    grey = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY if rgb else cv2.COLOR_BGR2GRAY)[:, :, None]
    expected = np.clip(img * 1.3 + grey * (1 - 1.3), 0, 255)
    out = fixed(imgaug.Saturation(0.4, rgb=rgb), 0.3).augment(img)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    u8 = image()
    out = fixed(imgaug.Saturation(0.4, rgb=rgb), -0.3).augment(u8)
    grey = cv2.cvtColor(u8.astype(np.float32), cv2.COLOR_RGB2GRAY if rgb else
                        cv2.COLOR_BGR2GRAY)[:, :, None]
    exact = np.clip(u8 * 0.7 + grey * 0.3, 0, 255)
    # the nearest integer (OpenCV's 8-bit transform of a channel-mixing matrix was up to 0.6
    # off before rounding, so 1.08 off after it)
    assert np.abs(out - exact).max() <= 0.5 + 1e-3
    with pytest.raises(ValueError):
        imgaug.Saturation(0.4).augment(image(c=1))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("make", [
    lambda: fixed(imgaug.Hue(), 50.0), lambda: fixed(imgaug.Saturation(0.4), 0.3),
    lambda: fixed(imgaug.Contrast((0.5, 1.5), rgb=True), 1.4),
    lambda: fixed(imgaug.Contrast((0.5, 1.5), rgb=False), 0.7),
    lambda: fixed(imgaug.JpegNoise(), 60)])
def test_colour_augmentors_keep_the_alpha_of_four_channels(make, dtype):
    rgba = image(c=4, dtype=dtype)
    out = make().augment(rgba)
    assert out.shape == rgba.shape and out.dtype == rgba.dtype
    np.testing.assert_array_equal(out[:, :, 3], rgba[:, :, 3])
    # (OpenCV's 4-channel kernels may sum in another order: the last bits of a float differ)
    np.testing.assert_allclose(out[:, :, :3], make().augment(rgba[:, :, :3].copy()),
                               rtol=1e-6, atol=1e-4)


def test_rotation_centre_is_computed_in_float64_as_0_11():
    # 0.11: the image's shape (ints) times the float32 draws, in float64, and OpenCV's
    # matrix; a float32 centre moved the warp by about 1e-6 px, which flipped a rounded pixel
    # now and then
    img = image(48, 48)
    aug = imgaug.Rotation(180, center_range=(0.2, 0.5))
    aug.rng = np.random.RandomState(35)
    t = aug.get_transform(img)
    rs = np.random.RandomState(35)
    centre = np.array([48, 48]) * rs.uniform(0.2, 0.5, (2,)).astype(np.float32)
    deg = float(np.float32(rs.uniform(-180, 180)))
    np.testing.assert_array_equal(t.mat, cv2.getRotationMatrix2D(tuple(centre - 0.5), deg, 1))


def test_random_resize_draws_51_times_before_giving_up_as_0_11():
    class Count(FixedRNG):
        def uniform(self, low=0.0, high=1.0, size=None):
            self.draws += 1
            return 30.0 if self.draws % 2 else 3.0      # width 30, height 3: never accepted

    aug = imgaug.RandomResize((20, 40), (2, 4), aspect_ratio_thres=0.15)
    aug.rng = Count()
    aug.rng.draws = 0
    t = aug.get_transform(image())
    assert aug.rng.draws == 2 * 51
    assert (t.new_h, t.new_w) == (30, 40)       # kept at its size


def test_lighting_formula():
    img = image(dtype=np.float32)
    v = np.array([0.5, -1.0, 2.0])
    out = fixed(imgaug.Lighting(0.1, EIGVAL, EIGVEC), v).augment(img)
    inc = EIGVEC.astype(np.float32) @ ((v * 0.1).astype(np.float32) * EIGVAL.astype(np.float32))
    np.testing.assert_allclose(out, np.clip(img + inc, 0, 255), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError):
        imgaug.Lighting(0.1, EIGVAL, EIGVEC).augment(image(c=None, dtype=np.float32))
    with pytest.raises(ValueError):
        imgaug.Lighting(0.1, [1, 2], EIGVEC)


def test_hue_formula():
    u8 = image()
    hsv = cv2.cvtColor(u8, cv2.COLOR_RGB2HSV)
    hsv[..., 0] = (hsv[..., 0].astype(int) + 50) % 180
    np.testing.assert_array_equal(fixed(imgaug.Hue(), 50.0).augment(u8),
                                  cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB))
    f = image(dtype=np.float32) / 255
    hsv = cv2.cvtColor(f, cv2.COLOR_BGR2HSV)
    hsv[..., 0] = (hsv[..., 0] + 100) % 360
    np.testing.assert_allclose(fixed(imgaug.Hue(rgb=False), 50.0).augment(f),
                               cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR), atol=1e-5)


def test_gaussian_blur_equals_cv2():
    img = image(dtype=np.float32)
    aug = fixed(imgaug.GaussianBlur((0, 5), (0.5, 2)), 2, 1.5)
    expected = cv2.GaussianBlur(img, (5, 5), sigmaX=1.5, sigmaY=1.5,
                                borderType=cv2.BORDER_REPLICATE)
    np.testing.assert_allclose(aug.augment(img), expected, rtol=1e-6)
    assert imgaug.GaussianBlur(4).size_range == (0, 4)
    assert imgaug.GaussianBlur(max_size=2).size_range == (0, 2)


def test_gamma_formula():
    u8 = image()
    g = 0.3
    lut = np.clip(np.rint((np.arange(256) / 255) ** (1 / (1 + g)) * 255), 0, 255)
    np.testing.assert_array_equal(fixed(imgaug.Gamma(), g).augment(u8), lut[u8])
    f = image(dtype=np.float32)
    out = fixed(imgaug.Gamma(), g).augment(f)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, lut[f.astype(np.uint8)])


def test_clip():
    f = image(dtype=np.float32)
    np.testing.assert_array_equal(imgaug.Clip(10, 100).augment(f), np.clip(f, 10, 100))
    u8 = image()
    np.testing.assert_array_equal(imgaug.Clip(10, 100).augment(u8), np.clip(u8, 10, 100))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_mean_variance_normalize(dtype):
    img = image(dtype=dtype)
    f = img.astype(np.float64)
    out = imgaug.MeanVarianceNormalize().augment(img)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (f - f.mean()) / f.std(), rtol=1e-4, atol=1e-4)
    out = imgaug.MeanVarianceNormalize(all_channel=False).augment(img)
    m, s = f.mean(axis=(0, 1)), f.std(axis=(0, 1))
    np.testing.assert_allclose(out, (f - m) / s, rtol=1e-4, atol=1e-4)
    const = imgaug.MeanVarianceNormalize().augment(np.full((4, 4), 3, dtype))
    np.testing.assert_array_equal(const, np.zeros((4, 4)))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_min_max_normalize(dtype):
    img = image(dtype=dtype)
    f = img.astype(np.float64)
    out = imgaug.MinMaxNormalize(-1, 1).augment(img)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (f - f.min()) / (f.max() - f.min()) * 2 - 1, atol=1e-5)
    out = imgaug.MinMaxNormalize(all_channel=False).augment(img)
    lo, hi = f.min(axis=(0, 1)), f.max(axis=(0, 1))
    np.testing.assert_allclose(out, (f - lo) / (hi - lo) * 255, atol=1e-3)
    const = imgaug.MinMaxNormalize(5, 9).augment(np.full((4, 4, 3), 3, dtype))
    np.testing.assert_array_equal(const, np.full((4, 4, 3), 5))      # not NaN


def test_normalizing_a_nearly_constant_image_keeps_its_precision():
    # (x - min) * scale, not x * scale + (out_min - min * scale): the large terms of the
    # second cancel in float32 ([0, 100] came out [-28, 72])
    two = np.array([[44.300907, 44.30091]], np.float32)
    np.testing.assert_allclose(imgaug.MinMaxNormalize(0, 100).augment(two), [[0, 100]],
                               rtol=1e-6, atol=1e-6)
    flat = (100 + 0.01 * np.random.RandomState(0).rand(64, 64)).astype(np.float32)
    f = flat.astype(np.float64)
    for all_channel in (True, False):
        out = imgaug.MinMaxNormalize(all_channel=all_channel).augment(flat)
        np.testing.assert_allclose(out, (f - f.min()) / (f.max() - f.min()) * 255, atol=1e-3)
        out = imgaug.MeanVarianceNormalize(all_channel=all_channel).augment(flat)
        std = max(f.std(), 1 / np.sqrt(f.size))         # the floor, 1/64 here
        np.testing.assert_allclose(out, (f - f.mean()) / std, atol=1e-3)


# -- conversions ----------------------------------------------------------------------------------
def test_colorspace_and_grayscale_equal_cv2():
    img = image()
    np.testing.assert_array_equal(imgaug.ColorSpace(cv2.COLOR_BGR2HSV).augment(img),
                                  cv2.cvtColor(img, cv2.COLOR_BGR2HSV))
    grey = imgaug.ColorSpace(cv2.COLOR_BGR2GRAY).augment(img)
    assert grey.shape == (30, 40, 1)
    assert imgaug.ColorSpace(cv2.COLOR_BGR2GRAY, keepdims=False).augment(img).shape == (30, 40)
    np.testing.assert_array_equal(imgaug.Grayscale().augment(img)[:, :, 0],
                                  cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
    np.testing.assert_array_equal(imgaug.Grayscale(rgb=True).augment(img)[:, :, 0],
                                  cv2.cvtColor(img, cv2.COLOR_RGB2GRAY))
    out = imgaug.Grayscale(keepshape=True).augment(img)
    assert out.shape == img.shape and (out[..., 0] == out[..., 2]).all()
    # float64: converted in float32 (OpenCV's float type), given back as float64
    f64 = img.astype(np.float64)
    for aug, shape in ((imgaug.Grayscale(), (30, 40, 1)),
                       (imgaug.Grayscale(keepshape=True), (30, 40, 3))):
        out = aug.augment(f64)
        assert out.dtype == np.float64 and out.shape == shape
        np.testing.assert_allclose(out[..., 0], cv2.cvtColor(img.astype(np.float32),
                                                             cv2.COLOR_BGR2GRAY), rtol=1e-6)
    with pytest.raises(ValueError):
        imgaug.Grayscale(keepdims=False, keepshape=True)


def test_colorspace_and_grayscale_name_an_image_they_cannot_convert():
    # OpenCV's own cv2.error came out before ("'scn' is 1", "'depth' is 7 (CV_16F)")
    for img in (np.zeros((6, 8), np.uint8), np.zeros((6, 8, 1), np.float32),
                np.zeros((6, 8), np.float16)):
        with pytest.raises(ValueError, match=r"Grayscale: got an image of shape \(6, 8(, 1)?\), "
                           rf"dtype {img.dtype}; it needs 3 or 4 channels"):
            imgaug.Grayscale().augment(img)
    with pytest.raises(ValueError, match=r"ColorSpace: got an image of shape \(6, 8\), dtype "
                       r"uint8; cv2.cvtColor mode 40 cannot convert it \(OpenCV: "):
        imgaug.ColorSpace(cv2.COLOR_BGR2HSV).augment(np.zeros((6, 8), np.uint8))
    # float16, an image dtype like float64: converted in float32, given back in its dtype
    img = image()
    for aug in (imgaug.Grayscale(), imgaug.Grayscale(keepshape=True),
                imgaug.ColorSpace(cv2.COLOR_BGR2HSV)):
        out = aug.augment(img.astype(np.float16))
        assert out.dtype == np.float16
        np.testing.assert_allclose(out, aug.augment(img.astype(np.float32)), rtol=1e-3)


def test_to_uint8_and_to_float32():
    f = np.array([[-3.0, 0.4, 254.9, 300.0]], np.float32)
    np.testing.assert_array_equal(imgaug.ToUint8().augment(f), [[0, 0, 254, 255]])
    assert imgaug.ToUint8().augment(f).dtype == np.uint8
    np.testing.assert_array_equal(imgaug.ToUint8().augment(f.astype(np.float64)),
                                  [[0, 0, 254, 255]])
    u8 = image()
    out = imgaug.ToFloat32().augment(u8)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, u8)


def test_to_uint8_and_to_float32_always_give_a_new_array():
    # as 0.11 (clip/astype copy): an in-place augmentor after them never writes into the input
    u8, f32 = image(), image().astype(np.float32)
    for aug, img in ((imgaug.ToUint8(), u8), (imgaug.ToFloat32(), f32)):
        out = aug.augment(img)
        assert out is not img and not np.shares_memory(out, img)
        np.testing.assert_array_equal(out, img)
    before = u8.copy()
    imgaug.AugmentorList([imgaug.ToUint8(), imgaug.SaltPepperNoise(white_prob=0.5,
                                                                   black_prob=0.5)]).augment(u8)
    np.testing.assert_array_equal(u8, before)


# -- noise ----------------------------------------------------------------------------------------
def test_jpeg_noise_equals_an_encode_decode_round_trip():
    img = image(64, 64)
    out = fixed(imgaug.JpegNoise(), 50).augment(img)
    ok, enc = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 50])
    np.testing.assert_array_equal(out, cv2.imdecode(enc, cv2.IMREAD_COLOR))
    grey = imgaug.JpegNoise().augment(image(64, 64, c=None))
    assert grey.shape == (64, 64) and grey.dtype == np.uint8


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_jpeg_noise_converts_other_dtypes_as_the_encoder_does(dtype):
    # negatives, values past 255 and halves (rounded to even), as OpenCV's encoder converts
    # an image it cannot encode as is
    rs = np.random.RandomState(1)
    img = (rs.randint(-60, 320, (48, 64, 3)) + rs.choice([0, 0.5, 0.25], (48, 64, 3)))
    img = img.astype(dtype)
    img[0, :4, 0] = [-0.5, 0.5, 2.5, 254.5]
    u8 = np.rint(np.clip(img.astype(np.float64), 0, 255)).astype(np.uint8)
    assert list(u8[0, :4, 0]) == [0, 0, 2, 254]
    out = fixed(imgaug.JpegNoise(), 70).augment(img)
    ok, enc = cv2.imencode(".jpg", u8, [cv2.IMWRITE_JPEG_QUALITY, 70])
    assert out.dtype == dtype and out.shape == img.shape
    np.testing.assert_array_equal(out, cv2.imdecode(enc, cv2.IMREAD_COLOR).astype(dtype))


def test_gaussian_noise_statistics_and_determinism():
    img = np.full((200, 200), 100.0, np.float32)
    aug = imgaug.GaussianNoise(sigma=5)
    t = aug.get_transform(img)
    out = t.apply_image(img)
    assert abs(out.mean() - 100) < 0.2 and abs(out.std() - 5) < 0.2
    np.testing.assert_array_equal(t.apply_image(img), out)
    u8 = np.full((50, 50), 250, np.uint8)
    assert imgaug.GaussianNoise(sigma=20).augment(u8).max() == 255


def test_salt_pepper_noise_fractions_and_determinism():
    img = np.full((200, 200), 100, np.uint8)
    t = imgaug.SaltPepperNoise(0.1, 0.2).get_transform(img)
    out = t.apply_image(img.copy())
    assert abs((out == 255).mean() - 0.1) < 0.01 and abs((out == 0).mean() - 0.2) < 0.01
    np.testing.assert_array_equal(t.apply_image(img.copy()), out)
    with pytest.raises(ValueError):
        imgaug.SaltPepperNoise(0.6, 0.6)


# -- meta -----------------------------------------------------------------------------------------
def test_random_apply_and_choose():
    img = image()
    flip = imgaug.Flip(horiz=True, prob=1.0)
    np.testing.assert_array_equal(imgaug.RandomApplyAug(flip, 1.0).augment(img), img[:, ::-1])
    np.testing.assert_array_equal(imgaug.RandomApplyAug(flip, 0.0).augment(img), img)
    choose = imgaug.RandomChooseAug([(flip, 0.0), (imgaug.Identity(), 1.0)])
    for _ in range(10):
        np.testing.assert_array_equal(choose.augment(img), img)
    choose = imgaug.RandomChooseAug([flip, imgaug.Identity()])
    outs = {choose.augment(img)[0, 0, 0] for _ in range(40)}
    assert outs == {img[0, 0, 0], img[0, -1, 0]}


def test_random_order_applies_all_in_some_order():
    img = np.full((4, 4), 10.0, np.float32)
    add = imgaug.MapImage(lambda x: x + 1)
    mul = imgaug.MapImage(lambda x: x * 2)
    outs = {float(imgaug.RandomOrderAug([add, mul]).augment(img)[0, 0]) for _ in range(40)}
    assert outs == {22.0, 21.0}


def test_map_image():
    img = image()
    t = imgaug.MapImage(lambda x: x[::2], lambda c: c / 2).get_transform(img)
    np.testing.assert_array_equal(t.apply_image(img), img[::2])
    np.testing.assert_allclose(t.apply_coords(np.array([[2.0, 4.0]])), [[1.0, 2.0]])
    with pytest.raises(NotImplementedError):
        imgaug.MapImage(lambda x: x).get_transform(img).apply_coords(np.zeros((1, 2)))


def test_meta_augmentors_reset_their_members():
    inner = imgaug.Flip(horiz=True)
    for outer in [imgaug.RandomApplyAug(inner, 0.5), imgaug.RandomChooseAug([inner]),
                  imgaug.RandomOrderAug([inner])]:
        before = inner.rng
        outer.reset_state()
        assert inner.rng is not before


# -- external and deform ---------------------------------------------------------------------------
class FakeAlbumentation:
    def get_params(self):
        return {"delta": 3}

    def apply(self, img, delta):
        return img + delta


class FakeIAA:
    def to_deterministic(self):
        return self

    def augment_image(self, img):
        return img[::-1]


def test_external_wrappers_call_the_wrapped_augmentor():
    img = image(dtype=np.float32)
    np.testing.assert_array_equal(imgaug.Albumentations(FakeAlbumentation()).augment(img),
                                  img + 3)
    with pytest.raises(NotImplementedError):
        imgaug.Albumentations(FakeAlbumentation()).get_transform(img).apply_coords(
            np.zeros((1, 2)))
    np.testing.assert_array_equal(imgaug.IAAugmentor(FakeIAA()).augment(img), img[::-1])


def test_gaussian_map_weights():
    from dataflow.imgaug.deform import GaussianMap
    w = GaussianMap((10, 12), sigma=10.0).get_gaussian_weight((3, 4))
    y, x = np.mgrid[0:10, 0:12]
    np.testing.assert_allclose(w, np.exp(-((y / 10 - 3) ** 2 + (x / 12 - 4) ** 2) / 10.0),
                               rtol=1e-5)
    assert w.shape == (10, 12) and abs(w[0, 0] - np.exp(-2.5)) < 1e-6


def test_deform_module_is_an_attribute_of_imgaug_as_in_tensorpack():
    # tensorpack scripts reach the unexported GaussianDeform as imgaug.deform.GaussianDeform
    # without importing the module; a fresh interpreter, where no test imported it first
    code = ("from dataflow import imgaug; "
            "assert 'GaussianDeform' not in imgaug.__all__; "
            "print(imgaug.deform.GaussianDeform.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "GaussianDeform"


def test_gaussian_deform():
    img = image(32, 32, dtype=np.float32)
    aug = GaussianDeform([(0.2, 0.2), (0.2, 0.8), (0.8, 0.8), (0.8, 0.2)], (32, 32), 0.5, 3)
    out = aug.augment(img)
    assert out.shape == img.shape and out.dtype == img.dtype
    with pytest.raises(ValueError):
        aug.augment(image(20, 32))


@pytest.mark.parametrize("shape", [(30, 40, 3), (31, 41, 3), (5, 7)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mean_variance_normalize_float_layouts(shape, dtype):
    img = (np.random.RandomState(2).rand(*shape) * 255).astype(dtype)
    f = img.astype(np.float64)
    out = imgaug.MeanVarianceNormalize().augment(img)
    np.testing.assert_allclose(out, (f - f.mean()) / f.std(), rtol=1e-4, atol=1e-4)


def test_contrast_with_rgb_takes_one_mean_of_a_2d_image():
    # as 0.11: ``rgb`` names the channel order of a colour image; a grey one has one mean
    grey = image(c=None)
    for rgb in (True, False, None):
        aug = imgaug.Contrast((0.5, 0.5), rgb=rgb)
        out = aug.augment(grey)
        expected = np.clip(np.rint(grey * 0.5 + grey.mean() * 0.5), 0, 255)
        assert out.shape == grey.shape and out.dtype == np.uint8
        np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="needs a colour image of 3 channels"):
        imgaug.Contrast((0.5, 0.5), rgb=True).augment(image(c=1))


def test_sizes_given_as_floats_are_whole_pixels_as_in_tensorpack():
    img = image(30, 40)
    assert imgaug.ResizeShortestEdge(20.0).augment(img).shape == (20, 27, 3)
    assert imgaug.RandomCrop((10.0, 12.0)).augment(img).shape == (10, 12, 3)
    assert imgaug.RandomCrop((10, 12)).crop_shape == (10, 12)


def test_random_choose_aug_keeps_tensorpacks_attributes_and_refuses_bad_probabilities():
    flip, bright = imgaug.Flip(horiz=True), imgaug.Brightness(3)
    aug = imgaug.RandomChooseAug([(bright, 0.25), (flip, 0.75)])
    assert aug.aug_lists == [bright, flip] and aug.prob == [0.25, 0.75]
    assert repr(aug) == ("imgaug.RandomChooseAug(aug_lists=[imgaug.Brightness(delta=3), "
                         "imgaug.Flip(horiz=True)])")
    assert imgaug.RandomChooseAug([bright, flip]).prob == [0.5, 0.5]
    with pytest.raises(ValueError, match="sum to 1"):
        imgaug.RandomChooseAug([(bright, 1), (flip, 1)])


@pytest.mark.parametrize("make, match", [
    (lambda: imgaug.RandomCrop(0), "RandomCrop: crop_shape must be positive, got 0"),
    (lambda: imgaug.RandomCrop((-1, 8)), r"RandomCrop: crop_shape must be positive, got \(-1, 8\)"),
    (lambda: imgaug.CenterCrop(-1), "CenterCrop: crop_shape must be positive"),
    (lambda: imgaug.Resize(0), "Resize: shape must be positive"),
    (lambda: imgaug.ResizeShortestEdge(0), "ResizeShortestEdge: size must be positive"),
    (lambda: imgaug.GoogleNetRandomCropAndResize(target_shape=-1),
     "GoogleNetRandomCropAndResize: target_shape must be positive, got -1"),
])
def test_sizes_of_zero_or_less_are_refused(make, match):
    # a crop of 0 made an empty image, silently; a resize to 0 failed later inside OpenCV
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("make, match", [
    (lambda: imgaug.Flip(horiz=True, prob=2), r"Flip: prob must be a number in \[0, 1\], got 2"),
    (lambda: imgaug.RandomApplyAug(imgaug.Flip(horiz=True), -0.5), "RandomApplyAug: prob must"),
    (lambda: imgaug.Transpose(prob=-1), r"Transpose: prob must be a number in \[0, 1\], got -1"),
    (lambda: imgaug.SaltPepperNoise(white_prob=-1), "SaltPepperNoise: white_prob must be"),
    (lambda: imgaug.SaltPepperNoise(black_prob="x"), "SaltPepperNoise: black_prob must be"),
    (lambda: imgaug.BrightnessScale(5), r"BrightnessScale: range must be a pair \(low, high\)"),
    (lambda: imgaug.Contrast(1.4), r"Contrast: factor_range must be a pair \(low, high\)"),
])
def test_probabilities_and_ranges_are_checked_when_built(make, match):
    # Flip(prob=2) always flipped; a scalar range failed at the first image
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("make, match", [
    (lambda: imgaug.RandomCropRandomShape(8, 5, 4, 10), "RandomCropRandomShape: wmin must be <= "
     "wmax, got wmin=8, wmax=4"),
    (lambda: imgaug.RandomCropRandomShape(4, 9, 10, 5), "hmin must be <= hmax, got hmin=9, hmax=5"),
    (lambda: imgaug.RandomCutout((8, 4), 3), r"RandomCutout: h_range\[0\] must be < h_range\[1\], "
     r"got h_range\[0\]=8, h_range\[1\]=4"),
    (lambda: imgaug.RandomCutout(3, (4, 4)), r"w_range\[0\]=4, w_range\[1\]=4 \(a size is drawn"),
])
def test_empty_size_ranges_are_refused_when_built(make, match):
    # they failed at the first image inside numpy's randint ("low >= high")
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("make, match", [
    (lambda: imgaug.Grayscale(keepdims="False"), "Grayscale: keepdims must be True or False, "
     "got 'False'"),
    (lambda: imgaug.Contrast((0.6, 1.4), clip="no"), "Contrast: clip must be True or False"),
    (lambda: imgaug.Flip(horiz="True"), "Flip: horiz must be True or False"),
    (lambda: imgaug.GaussianNoise(sigma="3"), "GaussianNoise: sigma must be a number"),
    (lambda: imgaug.Hue(range=("0", 180)), r"Hue: range must be a number \(or a tuple of numbers"),
    (lambda: imgaug.JpegNoise(quality_range="3"), "JpegNoise: quality_range must be a number"),
    (lambda: imgaug.Rotation(max_deg=None), "Rotation: max_deg must be a number, got None"),
    (lambda: imgaug.MapImage(func=5), "MapImage: func must be callable, got 5"),
    (lambda: imgaug.MapImage(lambda x: x, coord_func="f"), "MapImage: coord_func must be callable"),
    (lambda: imgaug.RandomApplyAug(5, 0.5), "RandomApplyAug: aug must be an augmentor, got 5"),
    (lambda: imgaug.RandomOrderAug([imgaug.Flip(horiz=True), "flip"]),
     "RandomOrderAug: aug_lists must be a list of augmentors, got 'flip'"),
])
def test_arguments_of_the_wrong_kind_are_refused_when_built(make, match):
    # taken as Python takes them before: "False" is true, GaussianNoise(sigma="3") added noise
    # of std 3, Rotation(max_deg=None) and MapImage(func=5) failed at the first image
    with pytest.raises(TypeError, match=match):
        make()


def test_optional_arguments_still_take_none_and_flags_take_ints():
    # None for any argument with a default (OpenCV takes interp=None as its default; Clip
    # clips one side), rgb=None (per-channel Contrast), 0/1 for flags as tensorpack code
    # passes them
    img = image(20, 30).astype(np.float32)
    assert imgaug.Contrast((0.6, 1.4), rgb=None, clip=1).augment(img).shape == img.shape
    assert imgaug.RandomCropRandomShape(4, 4, wmax=None, hmax=None).augment(img).ndim == 3
    assert imgaug.Rotation(10, step_deg=None).augment(img).shape == img.shape
    assert imgaug.Rotation(10, interp=None, border=None, border_value=None).augment(
        img).shape == img.shape
    assert imgaug.Resize((8, 8), interp=None).augment(img).shape == (8, 8, 3)
    np.testing.assert_array_equal(imgaug.Clip(min=0, max=None).augment(img - 10),
                                  np.clip(img - 10, 0, None))
    assert imgaug.RandomCutout(4, 4, fill=None).augment(img.copy()).shape == img.shape


def test_equal_size_bounds_still_mean_a_fixed_size():
    # RandomCropRandomShape includes both ends (tensorpack: randint(min, max + 1)); a max of
    # None (or 0, tensorpack's ``max or size``) is the image's size, not checked when built
    img = image(20, 30)
    assert imgaug.RandomCropRandomShape(7, 6, 7, 6).augment(img).shape[:2] == (6, 7)
    assert imgaug.RandomCropRandomShape(25, 15, 0, None).augment(img).shape[1] >= 25
    out = imgaug.RandomCutout((3, 4), 5, fill=1).augment(np.zeros((20, 30), np.float32))
    assert out.sum() == 15
