"""dataflow.imgaug.base: the Transform API, the lazy AugmentorList, the legacy API and old-style
subclasses, reprs, the dtype check, the rng (own stream / per-datapoint stream / fork) and the
native flag."""
import multiprocessing as mp
import pickle

import numpy as np
import pytest

import dataflow
from dataflow import DataFromList, MapData, imgaug
from dataflow.imgaug.base import check_dtype, is_native_augmentor, randint, uniform
from dataflow.imgaug.transform import LazyTransform, NoOpTransform, TransformList
from dataflow.rng import set_datapoint_key


@pytest.fixture(autouse=True)
def _no_seed():
    yield
    dataflow.set_seed(None)
    set_datapoint_key(None)


def img_u8(h=20, w=30, c=3, seed=0):
    shape = (h, w, c) if c else (h, w)
    return np.random.RandomState(seed).randint(0, 256, shape).astype(np.uint8)


# -- the lazy AugmentorList -----------------------------------------------------------------------
class Recorder(imgaug.ImageAugmentor):
    """Records the shape of the image its get_transform sees."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def get_transform(self, img):
        self.seen.append(img.shape)
        return NoOpTransform()


def test_later_members_see_the_output_of_earlier_ones():
    rec = Recorder()
    augs = imgaug.AugmentorList([imgaug.Resize((10, 12)), rec])
    tfms = augs.get_transform(img_u8())
    assert rec.seen == []                         # lazy: nothing asked before apply_image
    out = tfms.apply_image(img_u8())
    assert out.shape == (10, 12, 3)
    assert rec.seen == [(10, 12, 3)]


def test_apply_coords_before_apply_image_raises():
    augs = imgaug.AugmentorList([imgaug.Flip(horiz=True), imgaug.Resize((8, 12))])
    tfms = augs.get_transform(img_u8(4, 6))
    with pytest.raises(AssertionError, match="apply_image"):
        tfms.apply_coords(np.zeros((1, 2)))


def test_reapplying_reuses_the_drawn_parameters():
    rec = Recorder()
    augs = imgaug.AugmentorList([imgaug.Identity(), imgaug.RandomCrop(5), rec])
    tfms = augs.get_transform(img_u8())
    a = tfms.apply_image(img_u8(seed=1))
    b = tfms.apply_image(img_u8(seed=1))
    np.testing.assert_array_equal(a, b)
    assert len(rec.seen) == 1                     # instantiated once


def test_coords_follow_flip_then_resize():
    # the documented example: Flip(horiz, prob=1) then Resize((8, 12)) on a 4x6 image
    augs = imgaug.AugmentorList([imgaug.Flip(horiz=True, prob=1.0), imgaug.Resize((8, 12))])
    img = img_u8(4, 6)
    tfms = augs.get_transform(img)
    assert tfms.apply_image(img).shape == (8, 12, 3)
    coords = tfms.apply_coords(np.array([[0, 0], [5, 3]], dtype=np.float32))
    np.testing.assert_allclose(coords, [[12, 0], [2, 6]])
    assert coords.dtype == np.float32


def test_first_member_transform_list_is_flattened():
    augs = imgaug.AugmentorList([imgaug.GoogleNetRandomCropAndResize(target_shape=8),
                                 imgaug.Identity()])
    tfms = augs.get_transform(img_u8(40, 40))
    assert len(tfms.tfms) == 3 and isinstance(tfms.tfms[2], LazyTransform)


def test_augment_equals_the_lazy_transform_applied():
    # augment() applies each member's transform as it is made, without the lazy list: the same
    # draws in the same order, so the same image, inside a map (the datapoint's stream)
    from dataflow import rng
    augs = imgaug.AugmentorList([imgaug.GoogleNetRandomCropAndResize(target_shape=12),
                                 imgaug.ToFloat32(),
                                 imgaug.RandomOrderAug([imgaug.Brightness(30),
                                                        imgaug.Contrast((0.5, 1.5))]),
                                 imgaug.Flip(horiz=True)])
    dataflow.set_seed(4)
    for i in range(20):
        img = img_u8(30, 40, seed=i)
        rng.set_datapoint_key((0, i))
        a = augs.augment(img)
        rng.set_datapoint_key((0, i))              # the same datapoint again: its stream anew
        b = augs.get_transform(img).apply_image(img)
        np.testing.assert_array_equal(a, b)


def test_augment_of_a_list_subclass_uses_its_get_transform():
    class Doubled(imgaug.AugmentorList):
        def get_transform(self, img):
            return super().get_transform(img) + imgaug.TransformFactory(
                apply_image=lambda x: x * 2)

    out = Doubled([imgaug.Identity()]).augment(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(out, np.full((2, 2), 2, np.float32))


def test_augmentor_list_checks_its_arguments():
    with pytest.raises(TypeError):
        imgaug.AugmentorList(imgaug.Identity())
    with pytest.raises(ValueError):
        imgaug.AugmentorList([imgaug.Identity()]).get_transform(np.zeros((2, 2, 2, 2)))


def test_reset_state_reseeds_every_member():
    flip = imgaug.Flip(horiz=True)
    augs = imgaug.AugmentorList([flip])
    before = flip.rng
    augs.reset_state()
    assert flip.rng is not before


# -- TransformList composition ------------------------------------------------------------------
def test_transform_list_composition():
    crop = imgaug.CropTransform(1, 2, 3, 4)
    flip = imgaug.FlipTransform(3, 4)
    tl = TransformList([crop])
    assert [type(t) for t in (tl + flip).tfms] == [imgaug.CropTransform, imgaug.FlipTransform]
    assert [type(t) for t in (flip + tl).tfms] == [imgaug.FlipTransform, imgaug.CropTransform]
    tl2 = TransformList([flip])
    both = tl + tl2
    assert len(both.tfms) == 2 and len(tl.tfms) == 1
    tl += tl2
    assert len(tl.tfms) == 2
    img = np.arange(60).reshape(6, 10)
    np.testing.assert_array_equal(tl.apply_image(img), img[1:4, 2:6][:, ::-1])
    np.testing.assert_allclose(tl.apply_coords(np.array([[2.0, 1.0]])), [[4.0, 0.0]])
    with pytest.raises(TypeError):
        TransformList([crop, "not a transform"])


def test_missing_apply_methods_raise_not_implemented():
    t = imgaug.TransformFactory(name="only-images", apply_image=lambda x: x + 1)
    assert t.apply_image(1) == 2
    with pytest.raises(NotImplementedError, match="apply_coords"):
        t.apply_coords(np.zeros((1, 2)))
    with pytest.raises(KeyError):
        imgaug.TransformFactory(image=lambda x: x)
    with pytest.raises(AttributeError):
        imgaug.CropTransform(0, 0, 1, 1).something


# -- reprs ----------------------------------------------------------------------------------------
def test_reprs():
    assert repr(imgaug.Flip(horiz=True)) == "imgaug.Flip(horiz=True)"
    assert repr(imgaug.Resize((10, 10))) == "imgaug.Resize(shape=(10, 10))"
    assert repr(imgaug.ResizeTransform(1, 2, 3, 4, 1)) == \
        "imgaug.ResizeTransform(h=1, w=2, new_h=3, new_w=4, interp=1)"
    assert repr(imgaug.CropTransform(1, 2, 3, 4)) == "imgaug.CropTransform(y0=1, x0=2, h=3, w=4)"
    assert repr(imgaug.TransformFactory(name="hi")) == "imgaug.TransformFactory(hi)"
    # the transforms of MapImage and RandomCutout print as 0.11's
    img = np.zeros((4, 4), np.float32)
    assert repr(imgaug.MapImage(abs).get_transform(img)) == "imgaug.TransformFactory(MapImage)"
    assert repr(imgaug.RandomCutout(2, 2).get_transform(img)) == \
        "imgaug.PhotometricTransform(cutout)"
    augs = imgaug.AugmentorList([imgaug.Flip(horiz=True), imgaug.Contrast((0.8, 1.2))])
    assert repr(augs) == ("imgaug.AugmentorList([\n  imgaug.Flip(horiz=True),\n"
                          "  imgaug.Contrast(factor_range=(0.8, 1.2))])")
    tfms = augs.get_transform(np.zeros((4, 4), np.float32))
    assert "LazyTransform(get_transform=" in repr(tfms)
    tfms.apply_image(np.zeros((4, 4), np.float32))
    assert "imgaug.PhotometricTransform(from imgaug.Contrast(factor_range=(0.8, 1.2)))" in \
        repr(tfms)
    # each value as pprint.pformat gives it (tensorpack 0.11's output): a long list wraps
    jitter = imgaug.RandomOrderAug([imgaug.BrightnessScale((0.6, 1.4)),
                                    imgaug.Contrast((0.6, 1.4), rgb=False),
                                    imgaug.Saturation(0.4, rgb=False)])
    assert repr(jitter) == ("imgaug.RandomOrderAug(aug_lists=[imgaug.BrightnessScale(range=(0.6, "
                            "1.4)),\n imgaug.Contrast(factor_range=(0.6, 1.4), rgb=False),\n "
                            "imgaug.Saturation(alpha=0.4, rgb=False)])")


# -- the legacy API and old-style subclasses ----------------------------------------------------
class OldShift(imgaug.ImageAugmentor):
    """An old-style augmentor with coordinates."""

    def __init__(self, delta):
        super().__init__()
        self._init(locals())

    def _get_augment_params(self, img):
        return int(self.rng.randint(1, self.delta))

    def _augment(self, img, d):
        return np.roll(img, d, axis=1)

    def _augment_coords(self, coords, d):
        coords[:, 0] += d
        return coords


class OldNoParams(imgaug.ImageAugmentor):
    """Old style with only _augment (params default to None)."""

    def _augment(self, img, p):
        assert p is None
        return img * 2


class OldReturnsTransform(imgaug.ImageAugmentor):
    def _get_augment_params(self, img):
        return imgaug.CropTransform(0, 0, 2, 2)


def test_old_style_subclass_through_get_transform():
    aug = OldShift(5)
    img = img_u8()
    t = aug.get_transform(img)
    assert isinstance(t, imgaug.Transform)      # as 0.11's: code may check for a Transform
    d = t.params
    np.testing.assert_array_equal(t.apply_image(img), np.roll(img, d, axis=1))
    np.testing.assert_allclose(t.apply_coords(np.array([[1.0, 2.0]])), [[1.0 + d, 2.0]])


def test_old_style_subclass_without_params_or_coords():
    aug = OldNoParams()
    img = np.ones((3, 3), np.float32)
    t = aug.get_transform(img)
    np.testing.assert_array_equal(t.apply_image(img), 2 * img)
    coords = np.array([[1.0, 2.0]])
    np.testing.assert_array_equal(t.apply_coords(coords), coords)      # the old default
    assert aug.augment(img).sum() == 18


def test_augmentor_implementing_nothing_says_so():
    class Empty(imgaug.ImageAugmentor):
        pass
    with pytest.raises(NotImplementedError, match="Empty implements neither"):
        Empty().augment(img_u8())


def test_old_style_params_that_are_a_transform_are_returned():
    assert isinstance(OldReturnsTransform().get_transform(img_u8()), imgaug.CropTransform)


def test_legacy_calls():
    aug = imgaug.AugmentorList([OldShift(5), imgaug.Flip(horiz=True, prob=1.0)])
    img = img_u8()
    out, params = aug.augment_return_params(img)
    np.testing.assert_array_equal(aug.augment_with_params(img, params), out)
    coords = aug.augment_coords(np.array([[3.0, 4.0]]), params)
    d = params.tfms[0].params
    np.testing.assert_allclose(coords, [[30 - (3.0 + d), 4.0]])


# -- the dtype check ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64])
def test_check_dtype_accepts_uint8_and_floats(dtype):
    check_dtype(np.zeros((2, 2), dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16, np.int8, bool])
def test_check_dtype_rejects_other_integer_images(dtype):
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        check_dtype(np.zeros((2, 2), dtype))
    with pytest.raises(TypeError):
        imgaug.Flip(horiz=True).augment(np.zeros((2, 2), dtype))
    with pytest.raises(TypeError):
        imgaug.AugmentorList([imgaug.Identity()]).get_transform(np.zeros((2, 2), dtype))


def test_check_dtype_rejects_non_arrays():
    with pytest.raises(TypeError, match="list"):
        check_dtype([[1, 2]])


# -- randomness -----------------------------------------------------------------------------------
def test_rand_range_gives_float32():
    aug = imgaug.Identity()
    v = aug._rand_range(2.0, 3.0)
    assert v.dtype == np.float32 and 2.0 <= v < 3.0
    a = aug._rand_range(5.0, size=(4,))
    assert a.dtype == np.float32 and a.shape == (4,) and (a < 5).all() and (a >= 0).all()


@pytest.mark.parametrize("bitgen", [None, np.random.PCG64])
@pytest.mark.parametrize("args", [(351,), (0, 351), (3, 7), (-5, 5), (10, 11), (0, 2),
                                  (0, 1 << 20), (0, 2**32 - 1), (0, 2**32), (0, 2**32 + 1),
                                  (0, 2**40), (np.int64(3), 9), (2, np.int32(9))])
def test_randint_gives_rng_randints_values_and_leaves_the_stream_where_it_does(args, bitgen):
    def make():
        return np.random.RandomState(7 if bitgen is None else bitgen(7))
    ours, theirs = make(), make()
    got = [randint(ours, *args) for _ in range(500)]
    want = [int(theirs.randint(*args)) for _ in range(500)]
    assert got == want and all(type(v) is int for v in got)
    assert ours.randint(2**31, size=4).tolist() == theirs.randint(2**31, size=4).tolist()


@pytest.mark.parametrize("bitgen", [None, np.random.PCG64])
@pytest.mark.parametrize("bounds", [(0, 1), (0.6, 1.4), (-0.4, 0.4), (np.float32(0.08), 1.0),
                                    (-63, 63), (5.0, 5.0), (2.0, 1.0), (-1e300, 1e300)])
def test_uniform_gives_rng_uniforms_values_and_leaves_the_stream_where_it_does(bounds, bitgen):
    def make():
        return np.random.RandomState(11 if bitgen is None else bitgen(11))
    ours, theirs = make(), make()
    got = [uniform(ours, *bounds) for _ in range(2000)]
    want = [theirs.uniform(*bounds) for _ in range(2000)]
    assert got == want
    assert ours.randint(2**31, size=4).tolist() == theirs.randint(2**31, size=4).tolist()


def test_uniform_raises_what_rng_uniform_raises_and_passes_arrays_through():
    rs = np.random.RandomState(0)
    for bounds in [(0, np.inf), (np.nan, 1.0), (-1.7e308, 1.7e308)]:
        with pytest.raises(OverflowError):
            rs.uniform(*bounds)
        with pytest.raises(OverflowError):
            uniform(rs, *bounds)
    a, b = np.random.RandomState(3), np.random.RandomState(3)
    lo, hi = np.array([0.0, 1.0]), np.array([1.0, 3.0])
    assert np.array_equal(uniform(a, lo, hi), b.uniform(lo, hi))


def test_randint_raises_what_rng_randint_raises():
    rs = np.random.RandomState(0)
    for args in [(5, 5), (5, 3), (0,)]:
        with pytest.raises(ValueError):
            rs.randint(*args)
        with pytest.raises(ValueError):
            randint(rs, *args)


def test_set_seed_reproduces_an_augmentors_own_stream():
    def draws():
        dataflow.set_seed(3)
        aug = imgaug.Identity()
        return [aug.rng.randint(1000) for _ in range(5)]
    assert draws() == draws()


def test_subclass_without_super_init_gets_an_rng():
    class NoInit(imgaug.ImageAugmentor):
        def __init__(self):
            pass

        def get_transform(self, img):
            return imgaug.CropTransform(0, int(self.rng.randint(2)), 1, 1)

    assert isinstance(NoInit().get_transform(img_u8()), imgaug.CropTransform)


def test_random_paste_used_alone():
    out = imgaug.RandomPaste((30, 40)).augment(img_u8(10, 10))
    assert out.shape == (30, 40, 3)


def test_assigned_rng_is_used_outside_a_map():
    aug = imgaug.Identity()
    aug.rng = np.random.RandomState(7)
    assert aug.rng.randint(10**6) == np.random.RandomState(7).randint(10**6)


def test_inside_a_map_the_datapoint_stream_is_used():
    a, b = imgaug.Identity(), imgaug.Identity()
    set_datapoint_key((0, 5))
    ra = a.rng
    assert b.rng is ra                    # one stream per datapoint, shared in call order
    set_datapoint_key((0, 6))
    assert a.rng is not ra
    set_datapoint_key(None)
    assert a.rng is not ra


def test_datapoint_stream_depends_on_seed_and_key_only():
    def draw(seed, key):
        dataflow.set_seed(seed)
        set_datapoint_key(key)
        aug = imgaug.Identity()            # created after the key: its own rng is not used
        return aug.rng.randint(10**9)
    assert draw(1, (0, 3)) == draw(1, (0, 3))
    assert draw(1, (0, 3)) != draw(1, (0, 4))
    assert draw(1, (0, 3)) != draw(1, (1, 3))
    assert draw(1, (0, 3)) != draw(2, (0, 3))


def _pipeline(seed, n=6, **map_kwargs):
    dataflow.set_seed(seed)
    img = img_u8(24, 24)
    augs = [imgaug.RandomCrop(16), imgaug.Flip(horiz=True), imgaug.Brightness(40),
            imgaug.GaussianNoise(3)]
    alist = imgaug.AugmentorList(augs)
    ds = MapData(DataFromList([[img] for _ in range(n)], shuffle=False),
                 _AugmentFirst(alist), **map_kwargs)
    ds.reset_state()
    try:
        out = [dp[0] for dp in ds]
    finally:
        ds.close()
    _pipeline.executor = ds.executor
    return out


class _AugmentFirst:
    def __init__(self, augs):
        self.augs = augs

    def __call__(self, dp):
        return [self.augs.augment(dp[0])]


def test_serial_map_with_seed_is_reproducible_and_keyed_by_datapoint():
    a = _pipeline(11)
    b = _pipeline(11)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # the same input image, different datapoints: different augmentations
    assert any(not np.array_equal(a[0], x) for x in a[1:])
    c = _pipeline(12)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("multiprocessing,workers", [(False, 2), (False, 3), (True, 2)])
def test_parallel_ordered_map_gives_the_serial_output(no_leaks, multiprocessing, workers):
    serial = _pipeline(21, n=8)
    parallel = _pipeline(21, n=8, num_parallel_workers=workers,
                         python_multiprocessing=multiprocessing)
    assert _pipeline.executor == ("process" if multiprocessing else "thread")
    for x, y in zip(serial, parallel):
        np.testing.assert_array_equal(x, y)
    assert len(parallel) == 8


def test_without_a_seed_runs_differ():
    def run():
        dataflow.set_seed(None)
        return _pipeline_unseeded()
    a, b = run(), run()
    assert any(not np.array_equal(x, y) for x, y in zip(a, b))


def _pipeline_unseeded():
    img = img_u8(24, 24)
    alist = imgaug.AugmentorList([imgaug.RandomCrop(16), imgaug.GaussianNoise(3)])
    ds = MapData(DataFromList([[img] for _ in range(4)], shuffle=False), _AugmentFirst(alist))
    ds.reset_state()
    return [dp[0] for dp in ds]


def test_keys_of_other_forms_get_streams_too():
    dataflow.set_seed(4)
    set_datapoint_key((2**40, 3, 5))
    x = imgaug.Identity().rng.randint(10**9)
    set_datapoint_key((2**40, 3, 5))
    assert imgaug.Identity().rng.randint(10**9) == x
    set_datapoint_key((2**40, 3, 6))
    assert imgaug.Identity().rng.randint(10**9) != x


def test_serial_map_output_does_not_depend_on_the_augmentors_own_rng():
    dataflow.set_seed(5)
    alist = imgaug.AugmentorList([imgaug.RandomCrop(8), imgaug.Brightness(30)])
    img = img_u8(16, 16)

    def run():
        ds = MapData(DataFromList([[img]] * 3, shuffle=False), lambda dp: [alist.augment(dp[0])])
        ds.reset_state()
        return [dp[0] for dp in ds]
    first = run()
    alist.rng = np.random.RandomState(123)        # the own rng is unused inside a map
    for m in alist.augmentors:
        m.rng = np.random.RandomState(456)
    dataflow.set_seed(5)
    second = run()
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)


class _NoDictAccess(imgaug.Brightness):
    """An augmentor whose ``__dict__`` must not be read: reading it turns the instance's inline
    attribute values into a real dict (CPython 3.11-3.13), after which every ``self.x`` in
    ``get_transform`` takes the slow lookup."""

    @property
    def __dict__(self):
        raise AssertionError("the augmentor's __dict__ was read")


def test_the_rng_leaves_the_instance_dict_alone():
    aug = _NoDictAccess(30)
    aug.reset_state()
    img = img_u8()
    assert aug.augment(img).shape == img.shape                     # its own rng
    aug.rng = np.random.RandomState(1)
    first = aug.augment(img)
    aug.rng = np.random.RandomState(1)
    np.testing.assert_array_equal(aug.augment(img), first)
    ds = MapData(DataFromList([[img]] * 2, shuffle=False), lambda dp: [aug.augment(dp[0])])
    ds.reset_state()
    assert len(list(ds)) == 2                                      # the datapoint's stream
    copied = pickle.loads(pickle.dumps(aug))                       # a worker's copy
    assert copied.augment(img).shape == img.shape


def _child_draw(aug, conn):
    conn.send(int(aug.rng.randint(2**31)))
    conn.close()


def test_forked_child_reseeds_its_own_rng(no_leaks):
    aug = imgaug.Identity()
    ctx = mp.get_context("fork")
    parent_conn, child_conn = ctx.Pipe()
    state = pickle.dumps(aug.rng.get_state())
    p = ctx.Process(target=_child_draw, args=(aug, child_conn))
    p.start()
    child_value = parent_conn.recv()
    p.join()
    parent_conn.close()
    child_conn.close()
    twin = np.random.RandomState()
    twin.set_state(pickle.loads(state))
    assert child_value != twin.randint(2**31)     # the child did not continue our stream


# -- native ---------------------------------------------------------------------------------------
def test_builtin_augmentors_are_native():
    for name in imgaug.__all__:
        cls = getattr(imgaug, name)
        if isinstance(cls, type) and issubclass(cls, imgaug.ImageAugmentor) and \
                cls not in (imgaug.ImageAugmentor, imgaug.PhotometricAugmentor,
                            imgaug.IAAugmentor, imgaug.Albumentations):
            assert cls.__dict__.get("native") is True, name


def test_user_subclasses_are_not_native_unless_marked():
    class MyFlip(imgaug.Flip):
        def get_transform(self, img):
            return super().get_transform(img)

    assert is_native_augmentor(imgaug.Flip(horiz=True))
    assert not is_native_augmentor(MyFlip(horiz=True))
    assert not is_native_augmentor(OldShift(3))

    @dataflow.native
    class MarkedShift(OldShift):
        pass
    assert is_native_augmentor(MarkedShift(3))

    assert is_native_augmentor(imgaug.AugmentorList([imgaug.Flip(horiz=True)]))
    assert not is_native_augmentor(imgaug.AugmentorList([imgaug.Flip(horiz=True),
                                                         OldShift(3)]))
    assert not is_native_augmentor(imgaug.RandomApplyAug(OldShift(3), 0.5))
    assert is_native_augmentor(imgaug.RandomOrderAug([imgaug.Brightness(3)]))
    assert not is_native_augmentor(imgaug.MapImage(lambda x: x))
    assert is_native_augmentor(imgaug.MapImage(dataflow.native(lambda x: x)))


class Draw(imgaug.ImageAugmentor):
    """Replaces the image by one number drawn from its rng."""

    def get_transform(self, img):
        v = float(self.rng.randint(10**9))
        return imgaug.TransformFactory(apply_image=lambda im: np.full(1, v))


def test_chained_serial_maps_draw_independently_and_reproducibly():
    def run():
        dataflow.set_seed(8)
        a, b = Draw(), Draw()
        ds = DataFromList([[np.zeros(1), np.zeros(1)] for _ in range(4)], shuffle=False)
        ds = MapData(ds, lambda dp: [a.augment(dp[0]), dp[1]])
        ds = MapData(ds, lambda dp: [dp[0], b.augment(dp[1])])
        ds.reset_state()
        return [(float(x[0]), float(y[0])) for x, y in ds]
    first = run()
    assert first == run()
    assert all(x != y for x, y in first)          # b does not repeat a's draws
    assert len({x for x, _ in first}) == 4


def test_augmentors_and_transforms_pickle():
    import copy

    import cloudpickle
    augs = imgaug.AugmentorList([imgaug.Flip(horiz=True), imgaug.Resize((8, 9)),
                                 imgaug.Brightness(10), OldShift(3)])
    img = img_u8()
    for clone in (pickle.loads(pickle.dumps(augs)), cloudpickle.loads(cloudpickle.dumps(augs)),
                  copy.deepcopy(augs)):
        assert [type(a) for a in clone.augmentors] == [type(a) for a in augs.augmentors]
        assert clone.augment(img).shape == (8, 9, 3)
    tfms = augs.get_transform(img)
    out = tfms.apply_image(img)
    again = pickle.loads(pickle.dumps(tfms)).apply_image(img)
    np.testing.assert_array_equal(out, again)


def test_runner_copy_keys_get_their_own_streams():
    from dataflow.rng import _packed_key
    dataflow.set_seed(6)
    keys = [(0, 3), (0, 3, 0), (0, 3, 1), (1, 3), (0, 4), (2**20, 3), (0, 3, 2**20)]
    draws = []
    for key in keys:
        set_datapoint_key(key)
        draws.append(imgaug.Identity().rng.randint(2**62))
    assert len(set(draws)) == len(keys)
    assert _packed_key((0, 3)) != _packed_key((0, 3, 0))
    assert _packed_key((2**20, 3)) is None and _packed_key((0, 3, -1)) is None
