"""dataflow.imgaug transforms and coordinates: images equal to what OpenCV/numpy give directly,
coordinates under flip, resize, crop, transpose, rotation and affine warps checked against
hand-computed points, coordinates of every floating dtype."""
import math

import cv2
import numpy as np
import pytest

from dataflow import imgaug
from dataflow.imgaug.geometry import rotation_matrix
from dataflow.imgaug.transform import (NoOpTransform, PhotometricTransform, TransposeTransform,
                                       WarpAffineTransform)


class FixedRNG:
    """Stands in for an augmentor's rng: ``uniform`` returns the given values in order."""

    def __init__(self, *values):
        self.values = list(values)

    def uniform(self, low=0.0, high=1.0, size=None):
        v = self.values.pop(0)
        return np.full(size, v, dtype=np.float64) if size is not None else float(v)


def image(h=20, w=30, c=3, dtype=np.uint8, seed=0):
    shape = (h, w, c) if c else (h, w)
    return (np.random.RandomState(seed).rand(*shape) * 255).astype(dtype)


# -- images ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("interp", [cv2.INTER_LINEAR, cv2.INTER_CUBIC, cv2.INTER_NEAREST])
def test_resize_transform_equals_cv2(dtype, interp):
    img = image(dtype=dtype)
    out = imgaug.ResizeTransform(20, 30, 11, 17, interp).apply_image(img)
    np.testing.assert_array_equal(out, cv2.resize(img, (17, 11), interpolation=interp))
    assert out.dtype == dtype


def test_resize_transform_keeps_a_single_channel_axis_and_checks_the_size():
    out = imgaug.ResizeTransform(20, 30, 10, 15, cv2.INTER_LINEAR).apply_image(image(c=1))
    assert out.shape == (10, 15, 1)
    with pytest.raises(ValueError, match="20, 30"):
        imgaug.ResizeTransform(20, 30, 10, 15, cv2.INTER_LINEAR).apply_image(image(21, 30))


def test_resize_transform_accepts_a_flipped_view():
    img = image()
    view = img[:, ::-1]
    out = imgaug.ResizeTransform(20, 30, 10, 15, 1).apply_image(view)
    np.testing.assert_array_equal(out, cv2.resize(np.ascontiguousarray(view), (15, 10)))


def test_crop_flip_transpose_images():
    img = image()
    np.testing.assert_array_equal(imgaug.CropTransform(2, 3, 5, 7).apply_image(img),
                                  img[2:7, 3:10])
    np.testing.assert_array_equal(imgaug.FlipTransform(20, 30).apply_image(img), img[:, ::-1])
    np.testing.assert_array_equal(imgaug.FlipTransform(20, 30, horiz=False).apply_image(img),
                                  img[::-1])
    np.testing.assert_array_equal(TransposeTransform().apply_image(img), cv2.transpose(img))
    np.testing.assert_array_equal(NoOpTransform().apply_image(img), img)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64, np.int64, bool])
@pytest.mark.parametrize("shape", [(6, 9), (6, 9, 1), (6, 9, 3), (6, 9, 4), (6, 9, 5)])
@pytest.mark.parametrize("layout", ["contiguous", "crop", "reversed"])
def test_flip_and_transpose_give_new_contiguous_arrays(dtype, shape, layout):
    # OpenCV's path (up to 4 channels of its dtypes) and numpy's (the rest) agree with numpy's
    # reference, for contiguous inputs and views, and never return a view of the input
    base = (np.random.RandomState(1).rand(*shape) * 200).astype(dtype)
    img = {"contiguous": base, "crop": base[1:5, 2:8],
           "reversed": base[::-1, ::-1]}[layout]
    h, w = img.shape[:2]
    cases = [(imgaug.FlipTransform(h, w, horiz=True), img[:, ::-1]),
             (imgaug.FlipTransform(h, w, horiz=False), img[::-1]),
             (TransposeTransform(), img.swapaxes(0, 1))]
    for t, expected in cases:
        out = t.apply_image(img)
        assert out.shape == expected.shape and out.dtype == img.dtype
        assert out.flags.c_contiguous and not np.shares_memory(out, base)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_warp_affine_equals_cv2(dtype):
    img = image(dtype=dtype)
    mat = np.array([[0.9, 0.1, 2.0], [-0.1, 1.1, -3.0]], dtype=np.float32)
    out = WarpAffineTransform(mat, (25, 18), cv2.INTER_LINEAR, cv2.BORDER_REPLICATE,
                              0).apply_image(img)
    expected = cv2.warpAffine(img, mat, (25, 18), flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_REPLICATE, borderValue=0)
    np.testing.assert_array_equal(out, expected)
    one = WarpAffineTransform(mat, (25, 18)).apply_image(image(c=1, dtype=dtype))
    assert one.shape == (18, 25, 1)


def test_photometric_transform_leaves_coords():
    t = PhotometricTransform(lambda x: x + 1, name="plus one")
    coords = np.array([[1.0, 2.0]])
    assert t.apply_image(1) == 2
    assert t.apply_coords(coords) is coords
    assert repr(t) == "imgaug.PhotometricTransform(plus one)"


# -- coordinates ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_coords_of_any_float_dtype(dtype):
    pts = np.array([[1, 2], [6, 4]], dtype=dtype)
    out = imgaug.ResizeTransform(10, 20, 20, 10, 1).apply_coords(pts.copy())
    np.testing.assert_allclose(out, [[0.5, 4], [3, 8]])
    assert out.dtype == dtype
    out = imgaug.CropTransform(1, 2, 5, 5).apply_coords(pts.copy())
    np.testing.assert_allclose(out, [[-1, 1], [4, 3]])
    assert out.dtype == dtype
    out = imgaug.FlipTransform(10, 20).apply_coords(pts.copy())
    np.testing.assert_allclose(out, [[19, 2], [14, 4]])
    out = imgaug.FlipTransform(10, 20, horiz=False).apply_coords(pts.copy())
    np.testing.assert_allclose(out, [[1, 8], [6, 6]])
    out = TransposeTransform().apply_coords(pts.copy())
    np.testing.assert_allclose(out, [[2, 1], [4, 6]])
    out = WarpAffineTransform(np.array([[0, 1, 1], [2, 0, 0]], np.float32), (5, 5)) \
        .apply_coords(pts.copy())
    np.testing.assert_allclose(out, [[3, 2], [5, 12]])
    assert out.dtype == dtype


def test_float_coords_are_updated_in_place_and_int_coords_converted():
    pts = np.array([[1.0, 2.0]], dtype=np.float32)
    out = imgaug.CropTransform(1, 1, 3, 3).apply_coords(pts)
    assert out is pts
    ints = np.array([[1, 2]])
    out = imgaug.CropTransform(1, 1, 3, 3).apply_coords(ints)
    assert out.dtype == np.float64 and ints.tolist() == [[1, 2]]
    np.testing.assert_allclose(out, [[0, 1]])


def test_rotation_matrix_equals_cv2():
    for center, deg, scale in [((3.5, 7.25), 30.0, 1.0), ((0, 0), -112.5, 0.7),
                               ((10, 2), 90, 2)]:
        np.testing.assert_allclose(rotation_matrix(center, deg, scale),
                                   cv2.getRotationMatrix2D(center, deg, scale), atol=1e-12)


def test_rotation_coords_by_hand():
    # 90 degrees about the image centre: (x, y) -> (cx + (y - cy), cy - (x - cx))
    aug = imgaug.Rotation(180, center_range=(0, 1), step_deg=90)
    aug.rng = FixedRNG(0.5, 100.0)          # centre at (w, h) * 0.5; 100 // 90 * 90 = 90
    img = image(21, 31)
    t = aug.get_transform(img)
    cx, cy = 31 * 0.5 - 0.5, 21 * 0.5 - 0.5
    pts = t.apply_coords(np.array([[20.0, 10.0], [0.0, 0.0]]))
    np.testing.assert_allclose(pts, [[cx + (10 - cy), cy - (20 - cx)],
                                     [cx + (0 - cy), cy - (0 - cx)]], atol=1e-4)
    assert t.apply_image(img).shape == img.shape


def _dot_position(t, h, w, x, y):
    # where a single bright pixel at integer (x, y) lands in the warped image
    img = np.zeros((h, w), np.float32)
    img[y, x] = 255
    out = t.apply_image(img)
    yy, xx = np.unravel_index(np.argmax(out), out.shape)
    return xx, yy


def test_rotation_image_agrees_with_its_coords():
    aug = imgaug.Rotation(40, border=cv2.BORDER_CONSTANT)
    for seed in range(5):
        aug.rng = np.random.RandomState(seed)
        t = aug.get_transform(image(40, 50))
        px = t.apply_coords(np.array([[25.0, 20.0]]))[0]
        xx, yy = _dot_position(t, 40, 50, 25, 20)
        assert abs(px[0] - xx) <= 1 and abs(px[1] - yy) <= 1


def test_affine_coords_by_hand():
    # scale 2 and 90 degrees about the centre, then a shift of (+3, -2)
    aug = imgaug.Affine(scale=(1.0, 3.0), translate_frac=(0.5, 0.5), rotate_max_deg=180)
    aug.rng = FixedRNG(2.0, 3.0, -2.0, 90.0)
    t = aug.get_transform(image(21, 31))
    cx, cy = 15.0, 10.0
    x, y = 20.0, 12.0
    expected = [cx + 2 * (y - cy) + 3, cy - 2 * (x - cx) - 2]
    np.testing.assert_allclose(t.apply_coords(np.array([[x, y]]))[0], expected, atol=1e-4)


def test_affine_shear_keeps_the_centre_and_agrees_with_the_image():
    # 0.11's shear: the y axis turns by the shear angle (x gains sin, y keeps cos), the x
    # axis stays; drawn before the rotation, which is drawn (here 0) even when it is off
    aug = imgaug.Affine(shear=30.0, border=cv2.BORDER_CONSTANT)
    aug.rng = FixedRNG(20.0, 0.0)
    t = aug.get_transform(image(41, 41))
    np.testing.assert_allclose(t.apply_coords(np.array([[20.0, 20.0]]))[0], [20, 20],
                               atol=1e-4)
    p = t.apply_coords(np.array([[20.0, 30.0]]))[0]
    s = math.radians(20)
    np.testing.assert_allclose(p, [20 + 10 * math.sin(s), 20 + 10 * math.cos(s)], atol=1e-4)
    np.testing.assert_allclose(t.apply_coords(np.array([[30.0, 20.0]]))[0], [30, 20],
                               atol=1e-4)
    xx, yy = _dot_position(t, 41, 41, 20, 30)
    assert abs(p[0] - xx) <= 1 and abs(p[1] - yy) <= 1


def test_affine_runs_on_current_opencv_with_default_arguments():
    img = image()
    np.testing.assert_array_equal(imgaug.Affine().augment(img), img)
    out = imgaug.Affine(scale=[0.8, 1.2], translate_frac=[0.1, 0.1], rotate_max_deg=10,
                        shear=5).augment(img)
    assert out.shape == img.shape and out.dtype == img.dtype


def test_shift_moves_by_whole_pixels():
    aug = imgaug.Shift(horiz_frac=0.5, vert_frac=0.5, border=cv2.BORDER_CONSTANT)
    aug.rng = FixedRNG(3.4, -2.2)
    img = image(20, 30)
    t = aug.get_transform(img)
    np.testing.assert_allclose(t.apply_coords(np.array([[5.0, 5.0]])), [[8.0, 3.0]])
    out = t.apply_image(img)
    np.testing.assert_array_equal(out[2:17, 3:], img[4:19, :27])


def test_rotation_and_crop_valid_coords_follow_the_crop():
    aug = imgaug.RotationAndCropValid(30)
    aug.rng = FixedRNG(0.0)
    img = image(20, 30)
    t = aug.get_transform(img)
    out = t.apply_image(img)
    assert out.shape == img.shape
    np.testing.assert_array_equal(out, img)
    np.testing.assert_allclose(t.apply_coords(np.array([[4.0, 5.0]])), [[4.0, 5.0]],
                               atol=1e-4)


def test_paste_coords_shift_by_the_position():
    img = image(10, 20)
    t = imgaug.CenterPaste((20, 40)).get_transform(img)
    np.testing.assert_allclose(t.apply_coords(np.array([[1.0, 2.0]])), [[11.0, 7.0]])
    out = t.apply_image(img)
    np.testing.assert_array_equal(out[5:15, 10:30], img)
    assert out[:5].sum() == 0


@pytest.mark.parametrize("make_view", [lambda a: a[3:17, 5:25], lambda a: a[:, ::-1],
                                       lambda a: a.swapaxes(0, 1), lambda a: a[::2, 1:]])
def test_opencv_transforms_read_views_correctly(make_view):
    img = image(dtype=np.float32)
    view = make_view(img)
    dense = np.ascontiguousarray(view)
    h, w = view.shape[:2]
    np.testing.assert_array_equal(imgaug.ResizeTransform(h, w, 9, 11, 1).apply_image(view),
                                  cv2.resize(dense, (11, 9)))
    mat = np.array([[1, 0.1, 2], [0, 1, 1]], np.float32)
    np.testing.assert_array_equal(WarpAffineTransform(mat, (w, h)).apply_image(view),
                                  cv2.warpAffine(dense, mat, (w, h)))
    aug = imgaug.Brightness(30)
    aug.rng = FixedRNG(12.0)
    np.testing.assert_allclose(aug.augment(view), np.clip(dense + 12, 0, 255), rtol=1e-6)


def test_rotation_and_crop_valid_crops_the_centred_rectangle():
    aug = imgaug.RotationAndCropValid(30)
    aug.rng = FixedRNG(20.0)
    t = aug.get_transform(image(60, 80))
    neww, newh = imgaug.RotationAndCropValid.largest_rotated_rect(80, 60, 20.0)
    crop = t.tfms[1]
    assert (crop.h, crop.w) == (newh, neww)
    assert (crop.y0, crop.x0) == (int(30 - newh / 2), int(40 - neww / 2))


def test_float16_images_go_through_float32_in_opencv_calls():
    """cv2.resize, warpAffine, remap and GaussianBlur refuse float16 (a raw cv2.error): such an
    image is transformed in float32 and given back as float16, equal to the float32 result."""
    from dataflow import imgaug
    from dataflow.imgaug.deform import GaussianDeform
    from dataflow.imgaug.transform import ResizeTransform, WarpAffineTransform
    rs = np.random.RandomState(3)
    x = rs.rand(40, 50, 3).astype(np.float16)
    mat = np.float32([[0.9, 0.1, 2.0], [-0.1, 0.9, 1.0]])
    for t in (ResizeTransform(40, 50, 20, 25, 1), WarpAffineTransform(mat, (50, 40))):
        for img in (x, x[..., :1], x[..., 0]):
            out = t.apply_image(img)
            assert out.dtype == np.float16 and out.ndim == img.ndim
            np.testing.assert_array_equal(out, t.apply_image(img.astype(np.float32))
                                          .astype(np.float16))
    for aug in (imgaug.GaussianBlur(), GaussianDeform([(0.2, 0.2), (0.7, 0.7)], (40, 50), 0.5, 3),
                imgaug.Rotation(20), imgaug.ResizeShortestEdge(30)):
        for img in (x, x[..., 0]):
            out = aug.augment(img)
            assert out.dtype == np.float16 and out.ndim == img.ndim
