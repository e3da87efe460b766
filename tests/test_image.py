"""dataflow.image (ImageFromFile, AugmentImageComponent(s), AugmentImageCoordinates) and the
Augment op: tensorpack's semantics, the run-in-thread table for augmentors, and reproducible
augmentation across executors.

The augmentors defined here are small stand-ins with fixed, hand-checkable behaviour (they
build on dataflow.imgaug's base classes and transforms); the built-in ones appear in the
reproducibility and example tests.
"""
import logging

import cv2
import numpy as np
import pytest

import dataflow                                                        # noqa: E402
from dataflow import (AugmentImageComponent, AugmentImageComponents,  # noqa: E402
                      AugmentImageCoordinates, DataFromList, ImageFromFile, MapData, imgaug, ops,
                      set_seed)
from dataflow import rng as drng                                       # noqa: E402
from dataflow.imgaug import (AugmentorList, CropTransform, FlipTransform,  # noqa: E402
                             ImageAugmentor, PhotometricAugmentor, ResizeTransform)
from dataflow.imgaug.transform import NoOpTransform                    # noqa: E402


@pytest.fixture(autouse=True)
def _clean_rng():
    set_seed(None)
    drng.set_datapoint_key(None)
    yield
    set_seed(None)
    drng.set_datapoint_key(None)


# -- stand-in augmentors ---------------------------------------------------------------------

@dataflow.native
class HFlip(ImageAugmentor):
    """Always flips left-right."""

    def get_transform(self, img):
        return FlipTransform(img.shape[0], img.shape[1], horiz=True)


@dataflow.native
class ResizeTo(ImageAugmentor):
    def __init__(self, h, w):
        super().__init__()
        self.h, self.w = h, w

    def get_transform(self, img):
        return ResizeTransform(img.shape[0], img.shape[1], self.h, self.w, cv2.INTER_LINEAR)


@dataflow.native
class RandCrop(ImageAugmentor):
    """A random (h, w) crop drawn from self.rng."""

    def __init__(self, h, w):
        super().__init__()
        self.h, self.w = h, w

    def get_transform(self, img):
        y0 = self.rng.randint(img.shape[0] - self.h + 1)
        x0 = self.rng.randint(img.shape[1] - self.w + 1)
        return CropTransform(y0, x0, self.h, self.w)


@dataflow.native
class AddUniform(PhotometricAugmentor):
    """Adds one random float to the whole (float32) image."""

    def _get_augment_params(self, img):
        return self.rng.uniform(-20, 20)

    def _augment(self, img, v):
        return img.astype(np.float32) + np.float32(v)


@dataflow.native
class ZeroInPlace(PhotometricAugmentor):
    """Writes zeros into its input (as RandomCutout and SaltPepperNoise may)."""

    def _augment(self, img, _):
        img[...] = 0
        return img


@dataflow.native
class FailOnSeven(PhotometricAugmentor):
    def _augment(self, img, _):
        if img.flat[0] == 7:
            raise ValueError("seven")
        return img


class PythonAug(ImageAugmentor):
    """A user augmentor, not marked: Python code for the table."""

    def get_transform(self, img):
        return NoOpTransform()


@dataflow.native
class MarkedPythonAug(PythonAug):
    pass


def image(h=4, w=6, c=3, start=0):
    return (np.arange(h * w * c) + start).astype(np.uint8).reshape(h, w, c)


def collect(df):
    df.reset_state()
    try:
        return list(df)
    finally:
        df.close()


# -- AugmentImageComponent ------------------------------------------------------------------------

def test_component_augments_one_component_and_leaves_the_source():
    src = [[image(), 5], (image(start=1), 6)]
    out = collect(AugmentImageComponent(DataFromList(src, shuffle=False), [HFlip()]))
    assert [type(dp) for dp in out] == [list, list]        # a tuple datapoint becomes a list
    for dp, s in zip(out, src):
        np.testing.assert_array_equal(dp[0], s[0][:, ::-1])
        assert dp[1] == s[1]
    np.testing.assert_array_equal(src[0][0], image())      # the source is not modified
    assert isinstance(src[1], tuple)


def test_component_index_may_be_a_numpy_integer():
    # tensorpack indexes the datapoint with it as it is (index=np.int64(1) from an array of
    # indices); the op refused it for a list datapoint ("needs an int index")
    src = [[5, image()], (6, image(start=1))]
    for make in (lambda idx: AugmentImageComponent(DataFromList(src, shuffle=False), [HFlip()],
                                                   index=idx),
                 lambda idx: MapData(DataFromList(src, shuffle=False),
                                     ops.Augment([HFlip()], index=idx))):
        out = collect(make(np.int64(1)))
        for dp, s in zip(out, src):
            assert dp[0] == s[0]
            np.testing.assert_array_equal(dp[1], s[1][:, ::-1])


def test_component_accepts_an_augmentor_list_and_a_dict_key():
    augs = AugmentorList([HFlip(), ResizeTo(8, 12)])
    df = AugmentImageComponent(DataFromList([{"img": image(), "y": 1}], shuffle=False), augs,
                               index="img")
    assert df.augs is augs
    (dp,) = collect(df)
    assert dp["img"].shape == (8, 12, 3) and dp["y"] == 1


def test_component_copy_protects_the_source_from_in_place_augmentors():
    src = [[image(start=1)]]
    collect(AugmentImageComponent(DataFromList(src, shuffle=False), [ZeroInPlace()]))
    assert src[0][0].min() == 1
    collect(AugmentImageComponent(DataFromList(src, shuffle=False), [ZeroInPlace()],
                                  copy=False))
    assert src[0][0].max() == 0                  # copy=False hands over the source's array


def test_component_catch_exceptions_drops_the_datapoint_and_logs(caplog):
    src = [[image(start=k)] for k in range(10)]
    df = AugmentImageComponent(DataFromList(src, shuffle=False), [FailOnSeven()],
                               catch_exceptions=True)
    with caplog.at_level(logging.ERROR, logger="dataflow"):
        out = collect(df)
    assert [int(dp[0].flat[0]) for dp in out] == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert len(df) == 10
    assert "AugmentImageComponent" in caplog.text and "seven" in caplog.text
    with pytest.raises(ValueError, match="seven"):
        collect(AugmentImageComponent(DataFromList(src, shuffle=False), [FailOnSeven()]))


def test_catch_exceptions_logs_the_first_nine_failures_then_every_hundredth(caplog):
    # tensorpack 0.11 logs failure n when n < 10 or n % 100 == 0
    def fail(img):
        raise RuntimeError("always")
    df = AugmentImageComponent(DataFromList([[image()]] * 205, shuffle=False),
                               [imgaug.MapImage(fail)], catch_exceptions=True)
    with caplog.at_level(logging.ERROR, logger="dataflow"):
        assert collect(df) == []
    logged = [r for r in caplog.records if "always" in (r.exc_text or "")]
    assert len(logged) == 11                    # failures 1-9, 100 and 200


def test_a_last_augmentor_may_turn_the_image_into_another_type():
    # as tensorpack: only None (a MapImage function without return) is an error
    df = AugmentImageComponent(DataFromList([[image(), 3]], shuffle=False),
                               [HFlip(), imgaug.MapImage(lambda x: x.tolist())])
    (dp,) = collect(df)
    assert isinstance(dp[0], list) and np.array_equal(np.asarray(dp[0]), image()[:, ::-1])
    assert dp[1] == 3


def test_component_rejects_a_non_image_even_when_catching():
    for bad in ([[1, 2]], [[np.zeros((2, 2), np.int32)]]):
        df = AugmentImageComponent(DataFromList([bad[0]], shuffle=False), [HFlip()],
                                   catch_exceptions=True)
        with pytest.raises(TypeError, match="AugmentImageComponent"):
            collect(df)


def test_bad_augmentors_raise_at_construction():
    ds = DataFromList([[image()]], shuffle=False)
    with pytest.raises(TypeError, match="augmentor #1"):
        AugmentImageComponent(ds, [HFlip(), lambda x: x])
    with pytest.raises(TypeError, match="AugmentImageComponents: index"):
        AugmentImageComponents(ds, [HFlip()], index=0)


# -- AugmentImageCoordinates ----------------------------------------------------------------------

def test_coordinates_follow_the_image():
    # tensorpack's example: flip then resize a 4x6 image to 8x12 maps (0,0) to (12,0) and
    # (5,3) to (2,6)
    for dtype in (np.float64, np.float32):
        coords = np.array([[0, 0], [5, 3]], dtype)
        src = [[image(), coords]]
        (dp,) = collect(AugmentImageCoordinates(DataFromList(src, shuffle=False),
                                                [HFlip(), ResizeTo(8, 12)]))
        assert dp[0].shape == (8, 12, 3)
        np.testing.assert_allclose(dp[1], [[12, 0], [2, 6]])
        np.testing.assert_array_equal(src[0][1], [[0, 0], [5, 3]])   # copy=True


def test_coordinates_must_be_floating_n_by_2():
    for bad, exc in ((np.array([[0, 0]]), TypeError), (np.zeros((2, 3)), ValueError),
                     ([[0.0, 0.0]], TypeError)):
        df = AugmentImageCoordinates(DataFromList([[image(), bad]], shuffle=False), [HFlip()])
        with pytest.raises(exc, match="coordinates"):
            collect(df)
        df = AugmentImageCoordinates(DataFromList([[image(), bad]], shuffle=False), [HFlip()],
                                     catch_exceptions=True)
        assert collect(df) == []                       # caught and dropped, as tensorpack


# -- AugmentImageComponents -----------------------------------------------------------------------

def test_components_share_one_transform():
    img = image(8, 10, 3)
    mask = img[..., 0].astype(np.float32)
    # the pixel at column 4, row 3 lies inside every (5, 6) crop of the 8 x 10 image
    coords = np.array([[4.0, 3.0]], np.float32)
    src = [[img, mask, coords, "keep"] for _ in range(8)]
    set_seed(3)
    out = collect(AugmentImageComponents(DataFromList(src, shuffle=False),
                                         [RandCrop(5, 6), HFlip()], index=(0, 1),
                                         coords_index=(2,)))
    corners = set()
    for dp in out:
        assert dp[0].shape == (5, 6, 3) and dp[1].shape == (5, 6) and dp[3] == "keep"
        np.testing.assert_array_equal(dp[1], dp[0][..., 0].astype(np.float32))
        # where the point lands, the image holds the pixel that was at (x=4, y=3)
        x, y = dp[2][0]
        v = img[3, 4, 0]
        col = int(round(x)) - 1                          # flipped: w - x is the pixel's right edge
        assert dp[0][int(y), col, 0] == v
        corners.add(int(dp[0][0, -1, 0]))
    assert len(corners) > 1                              # the crops differ
    np.testing.assert_array_equal(src[0][2], [[4.0, 3.0]])


def test_components_index_may_be_a_range_or_a_numpy_array():
    # tensorpack takes any sequence (index[0] draws, index[1:] follow); only lists and
    # tuples were accepted here
    coords = np.array([[1.0, 2.0]])
    src = [[7, image(), image(start=1), coords]]
    for index, coords_index in ((np.array([1, 2]), np.array([3])), (range(1, 3), range(3, 4))):
        dp, = collect(AugmentImageComponents(DataFromList(src, shuffle=False), [HFlip()],
                                             index=index, coords_index=coords_index))
        assert dp[0] == 7
        np.testing.assert_array_equal(dp[1], image()[:, ::-1])
        np.testing.assert_array_equal(dp[2], image(start=1)[:, ::-1])
        np.testing.assert_array_equal(dp[3], [[6.0 - 1.0, 2.0]])
    for bad in ("ab", 0, (), np.array([])):
        with pytest.raises(TypeError, match="index must be a non-empty sequence"):
            AugmentImageComponents(DataFromList(src, shuffle=False), [HFlip()], index=bad)
    for bad in ("ab", 3):
        with pytest.raises(TypeError, match=f"coords_index must be a sequence .* got {bad!r}"):
            AugmentImageComponents(DataFromList(src, shuffle=False), [HFlip()], index=(1, 2),
                                   coords_index=bad)


def test_components_copy_false_and_tuple_datapoints():
    src = [(image(start=1), image(start=2))]
    (dp,) = collect(AugmentImageComponents(DataFromList(src, shuffle=False), [ZeroInPlace()],
                                           copy=False))
    assert dp[0].max() == 0 and dp[1].max() == 0
    assert isinstance(src[0], tuple)


# -- ImageFromFile ------------------------------------------------------------------------------

def _write(path, bgr):
    assert cv2.imwrite(str(path), bgr)
    return str(path)


def test_an_augmentor_that_returns_nothing_is_an_error_not_a_dropped_datapoint():
    def forgets_to_return(img):
        img[0, 0] = 0

    df = AugmentImageComponent(DataFromList([[image()]] * 4), [imgaug.MapImage(forgets_to_return)])
    with pytest.raises(TypeError, match="AugmentImageComponent: the augmentors returned "
                                        "None, not an image"):
        collect(df)          # every datapoint was dropped, silently (tensorpack's too)


def test_components_of_another_size_are_refused():
    # one transform for all: a crop made the 10 x 10 mask (0, 0), a rotation warped it to 32 x 40
    dp = [np.zeros((32, 40, 3), np.uint8), np.zeros((10, 10), np.uint8)]
    df = AugmentImageComponents(DataFromList([dp]), [imgaug.RandomCrop((8, 8))], index=(0, 1))
    with pytest.raises(ValueError, match=r"component 1 is \(10, 10\), component 0 \(32, 40\)"):
        collect(df)


@pytest.mark.parametrize("make", [
    lambda ds: AugmentImageComponents(ds, [imgaug.Flip(horiz=True)], index=(0, 5)),
    lambda ds: AugmentImageCoordinates(ds, [imgaug.Flip(horiz=True)], coords_index=5),
    lambda ds: dataflow.MapDataComponent(ds, lambda x: x, 5),
    lambda ds: dataflow.SelectComponent(ds, [0, 5]),
], ids=["components", "coordinates", "MapDataComponent", "SelectComponent"])
def test_a_component_index_out_of_range_is_named(make):
    with pytest.raises(IndexError, match="the datapoint has 1 component, no component 5"):
        collect(make(DataFromList([[image()]])))


def test_image_from_file_gives_rgb_and_resizes(tmp_path):
    bgr = np.zeros((4, 5, 3), np.uint8)
    bgr[..., 0] = 255                                     # blue, in OpenCV's order
    f = _write(tmp_path / "blue.png", bgr)
    (dp,) = collect(ImageFromFile([f]))
    assert dp[0].shape == (4, 5, 3) and dp[0].dtype == np.uint8
    assert dp[0][0, 0].tolist() == [0, 0, 255]
    (dp,) = collect(ImageFromFile([f], channel=1, resize=(6, 8)))
    assert dp[0].shape == (6, 8, 1)
    (dp,) = collect(ImageFromFile([f], resize=3))
    assert dp[0].shape == (3, 3, 3)


def test_image_from_file_shuffles_its_own_copy(tmp_path):
    files = [_write(tmp_path / f"{k}.png", np.full((2, 2, 3), k, np.uint8)) for k in range(12)]
    given = list(files)
    df = ImageFromFile(files, shuffle=True)
    assert len(df) == 12
    df.reset_state()
    order = [int(dp[0][0, 0, 0]) for dp in df]
    assert sorted(order) == list(range(12)) and order != list(range(12))
    assert files == given


def test_image_from_file_refuses_a_single_path():
    with pytest.raises(TypeError, match=r"files must be a list of paths, got the single path "
                                        r"'a.png' \(pass \['a.png'\]\)"):
        ImageFromFile("a.png")                 # split into letters: '/' was the first file


def test_image_from_file_errors(tmp_path):
    with pytest.raises(ValueError, match="No image files"):
        ImageFromFile([])
    with pytest.raises(ValueError, match="channel"):
        ImageFromFile(["x.png"], channel=2)
    missing = str(tmp_path / "missing.png")
    with pytest.raises(FileNotFoundError, match="missing.png"):
        collect(ImageFromFile([missing]))
    with pytest.raises(IsADirectoryError, match="is a directory, not an image file"):
        collect(ImageFromFile([str(tmp_path)]))
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="junk.png"):
        collect(ImageFromFile([str(junk)]))
    with pytest.raises(RuntimeError, match="reset_state"):
        list(ImageFromFile([missing], shuffle=True))


@pytest.mark.parametrize("progressive", [0, 1])
def test_image_from_file_refuses_a_truncated_jpeg(tmp_path, progressive):
    # OpenCV decoded it with a grey (or blurred) bottom, printing only "Premature end of JPEG
    # file" on stderr: a damaged image, silently
    img = (np.random.RandomState(0).rand(64, 80, 3) * 255).astype(np.uint8)
    data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, progressive])[1].tobytes()
    good, trailer = tmp_path / "good.jpg", tmp_path / "trailer.jpg"
    good.write_bytes(data)
    trailer.write_bytes(data + b"\0" * 64 + data[:200])   # bytes after the end marker: a camera's
    for f in (good, trailer):
        (dp,) = collect(ImageFromFile([str(f)]))
        assert dp[0].shape == (64, 80, 3)
    for cut in (len(data) // 2, len(data) - 40):
        bad = tmp_path / f"cut{cut}.jpg"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"ImageFromFile: '.*cut{cut}.jpg' is a truncated "
                                             "JPEG file"):
            collect(ImageFromFile([str(bad)]))


# -- the Augment op and the run-in-thread table ---------------------------------------------------

def test_augment_op():
    x = image()
    np.testing.assert_array_equal(ops.Augment([HFlip()], index=None)(x), x[:, ::-1])
    dp = [x, 1]
    out = ops.Augment(HFlip())(dp)
    np.testing.assert_array_equal(out[0], x[:, ::-1])
    assert out is not dp and dp[0] is x
    src = image(start=1)
    ops.Augment([ZeroInPlace()], index=None)(src)
    assert src.min() == 1                            # copy=True: the input is not written
    ops.Augment([ZeroInPlace()], index=None, copy=False)(src)
    assert src.max() == 0
    with pytest.raises(TypeError, match="Augment"):
        ops.Augment(["not an augmentor"])


def test_native_marks_a_class():
    class Mine(ImageAugmentor):
        def get_transform(self, img):
            return NoOpTransform()

    assert dataflow.native(Mine) is Mine
    assert ops.is_native(Mine()) and ops.is_native(ops.Augment([Mine()]))


def test_table_places_augmentors():
    ds = DataFromList([[image()]], shuffle=False)

    def executor(augs, mp=True):
        df = MapData(ds, [ops.Augment(augs)], num_parallel_workers=2, python_multiprocessing=mp)
        df.close()
        return df.executor

    assert executor([HFlip(), RandCrop(2, 2)]) == "thread"
    assert executor([HFlip(), PythonAug()]) == "process"
    assert executor([HFlip(), PythonAug()], mp=False) == "thread"
    assert executor([MarkedPythonAug()]) == "thread"
    assert executor(AugmentorList([HFlip(), AugmentorList([PythonAug()])])) == "process"
    # the AugmentImage* dataflows' map functions follow the same rule
    assert ops.is_native(AugmentImageComponent(ds, [HFlip()]).func)
    assert not ops.is_native(AugmentImageComponents(ds, [PythonAug()]).func)
    assert not ops.is_native(AugmentImageCoordinates(ds, [PythonAug()]).func)


# -- reproducible augmentation ------------------------------------------------------------------

def _augmentors(python=False):
    augs = [RandCrop(6, 7), AddUniform(), HFlip()]
    return augs + [PythonAug()] if python else augs


def _source(n=40):
    rs = np.random.RandomState(0)
    return DataFromList([[rs.randint(0, 256, (9, 11, 3)).astype(np.uint8), k]
                         for k in range(n)], shuffle=False)


def _run(df, passes=2):
    df.reset_state()
    try:
        return [[dp for dp in df] for _ in range(passes)]
    finally:
        df.close()


def _same(a, b):
    assert len(a) == len(b)
    for pa, pb in zip(a, b):
        assert len(pa) == len(pb)
        for x, y in zip(pa, pb):
            np.testing.assert_array_equal(x[0], y[0])
            assert x[1] == y[1]


@pytest.mark.usefixtures("no_leaks")
def test_same_images_serial_threads_processes():
    set_seed(11)
    serial = _run(MapData(_source(), [ops.Augment(_augmentors())]))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(serial[0], serial[1]))
    component = _run(AugmentImageComponent(_source(), _augmentors()))
    _same(serial, component)
    threads = MapData(_source(), [ops.Augment(_augmentors())], num_parallel_workers=2,
                      python_multiprocessing=True)
    assert threads.executor == "thread"
    _same(serial, _run(threads))
    # one Python augmentor (a no-op) sends the map to processes; the images are the same
    procs = MapData(_source(), [ops.Augment(_augmentors(python=True))], num_parallel_workers=2,
                    python_multiprocessing=True)
    assert procs.executor == "process"
    _same(serial, _run(procs))
    # tensorpack's thread mapper does not keep the order: compare datapoint by datapoint
    tp = dataflow.MultiThreadMapData(_source(), 3, ops.Augment(_augmentors()), strict=True)
    _same(serial[:1], [sorted(p, key=lambda dp: dp[1]) for p in _run(tp, passes=1)])
    # the next run, from the same seed, gives the same again
    set_seed(11)
    _same(serial, _run(MapData(_source(), [ops.Augment(_augmentors())])))
    set_seed(12)
    other = _run(MapData(_source(), [ops.Augment(_augmentors())]), passes=1)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(serial[0], other[0]))


@pytest.mark.usefixtures("no_leaks")
def test_stacked_maps_draw_independently_and_alike_on_every_executor():
    # a parallel map below a serial AugmentImageComponent, or two parallel maps: each map has
    # its own stream (its stage: the maps below it), whatever executor runs the maps below
    def pipeline(inner_workers, outer_workers, python=False):
        augs = [imgaug.Flip(horiz=True)] + ([PythonAug()] if python else [])
        ds = MapData(_source(), [ops.Augment(augs)],
                     num_parallel_workers=inner_workers, python_multiprocessing=True)
        return MapData(ds, [ops.Augment([imgaug.Flip(horiz=True)])],
                       num_parallel_workers=outer_workers)

    set_seed(3)
    serial = _run(pipeline(None, None))
    src = _run(_source(), passes=1)[0]
    unflipped = [np.array_equal(dp[0], s[0]) for dp, s in zip(serial[0], src)]
    # two independent flips: about half the images end up flipped (never all undone)
    assert 8 <= unflipped.count(True) <= 32
    for inner, outer, python in ((2, None, False), (2, 2, False), (2, None, True)):
        set_seed(3)
        df = pipeline(inner, outer, python)
        _same(serial, _run(df))
    set_seed(3)
    component = AugmentImageComponent(pipeline(2, None).ds, [imgaug.Flip(horiz=True)])
    _same(serial, _run(component))


@pytest.mark.usefixtures("no_leaks")
def test_maps_side_by_side_augment_differently_and_alike_on_every_executor():
    """Two views of one image (JoinData of two augmenting maps over the same source): each map
    has its own stream (its branch), so the views differ, whatever executor runs them. Both
    maps' keys were equal: serially the second continued the first's stream (so a resumed run
    drew otherwise), in workers it restarted it (identical views)."""
    def pipeline(workers, python=False):
        augs = [imgaug.Flip(horiz=True)] + ([PythonAug()] if python else [])
        views = [MapData(_source(), [ops.Augment(augs)], num_parallel_workers=workers,
                         python_multiprocessing=True) for _ in range(2)]
        return dataflow.JoinData(views)

    set_seed(4)
    serial = _run(pipeline(None))
    same = [np.array_equal(dp[0], dp[2]) for p in serial for dp in p]
    # two independent flips of one image: about half the pairs differ
    assert 0.25 * len(same) <= same.count(False) <= 0.75 * len(same)
    for workers, python in ((2, False), (2, True)):
        set_seed(4)
        df = pipeline(workers, python)
        assert df.df_lists[0].executor == ("process" if python else "thread")
        got = _run(df)
        for df_list in df.df_lists:
            df_list.close()
        assert len(got) == len(serial)
        for pa, pb in zip(got, serial):
            for x, y in zip(pa, pb):
                np.testing.assert_array_equal(x[0], y[0])
                np.testing.assert_array_equal(x[2], y[2])


def test_outside_a_map_augmentors_use_their_own_rng():
    set_seed(5)
    _run(MapData(_source(4), [ops.Augment(_augmentors())]))
    assert drng._local.key is None        # serial MapData clears the key after each call
    aug = RandCrop(2, 2)
    aug.reset_state()
    a = [aug.get_transform(image()).y0 for _ in range(30)]
    assert len(set(a)) > 1


def _draw(dp):
    return [dp[0], int(drng.datapoint_rng().integers(1 << 40))]


def _counting():
    return MapData(DataFromList([[k] for k in range(8)], shuffle=False), _draw)


@pytest.mark.usefixtures("no_leaks")
def test_runner_copies_draw_their_own_random_numbers():
    # a seeded serial map inside each copy of a runner: with keys (pass, index) alone, every
    # copy's k-th datapoint would get the same draws
    set_seed(2)
    for df in (dataflow.MultiThreadRunner(_counting, 16, 2),
               dataflow.MultiProcessRunner(_counting(), 16, 2)):
        df.reset_state()
        try:
            got = [dp for _, dp in zip(range(64), _endless(df))]
        finally:
            df.close()
        draws = [d for _, d in got]
        assert len(set(draws)) == len(draws)
    # and outside the runner, keys are (pass, index) again: the serial output is unchanged
    a = _run(_counting(), passes=1)
    set_seed(2)
    assert _run(_counting(), passes=1) == a


def _endless(df):
    while True:
        yield from df


def test_image_from_file_resumes_exactly(tmp_path):
    """Checkpoint (issue 18): a shuffled ImageFromFile resumes its pass where it stopped."""
    import json
    import cv2
    files = []
    for k in range(6):
        f = str(tmp_path / f"{k}.png")
        cv2.imwrite(f, np.full((2, 3, 3), k, np.uint8))
        files.append(f)

    def build():
        set_seed(9)
        df = ImageFromFile(files, shuffle=True)
        df.reset_state()
        return df

    df = build()
    ref = [int(dp[0][0, 0, 0]) for _ in range(2) for dp in df]
    df = build()
    it = iter(df)
    got = [int(next(it)[0][0, 0, 0]) for _ in range(4)]
    state = json.loads(json.dumps(df.state_dict()))
    df = build()
    df.load_state_dict(state)
    got += [int(dp[0][0, 0, 0]) for _ in range(2) for dp in df]
    set_seed(None)
    assert got == ref and sorted(ref[:6]) == list(range(6))


def test_tensorpacks_module_helpers_are_here(caplog):
    # check_dtype, validate_coords and ExceptionHandler of tensorpack's dataflow/image.py
    from dataflow.image import ExceptionHandler, check_dtype, validate_coords
    check_dtype(np.zeros((2, 2), np.uint8))
    with pytest.raises(TypeError, match="Needs an numpy array"):
        check_dtype([[1]])
    validate_coords(np.zeros((3, 2), np.float32))          # any floating dtype (0.11: float64)
    with pytest.raises(ValueError, match=r"N x 2.*\(3, 3\)"):
        validate_coords(np.zeros((3, 3)))
    with pytest.raises(TypeError, match="floating dtype"):
        validate_coords(np.zeros((3, 2), np.int64))
    quiet = ExceptionHandler(catch_exceptions=True)
    with caplog.at_level(logging.ERROR, logger="dataflow"):
        for _ in range(3):
            with quiet.catch():
                raise ValueError("bad image")
    assert quiet._nr_error == 3 and "caught (3 so far)" in caplog.text
    loud = ExceptionHandler()
    with pytest.raises(KeyError):
        with loud.catch():
            raise KeyError("k")
    assert loud._nr_error == 1


@pytest.mark.parametrize("make, error, match", [
    # catch_exceptions="False" caught (and dropped every datapoint of a failing augmentor)
    (lambda ds, a: AugmentImageComponent(ds, a, catch_exceptions="False"), TypeError,
     "AugmentImageComponent: catch_exceptions must be True or False, got 'False'"),
    (lambda ds, a: AugmentImageComponents(ds, a, copy="no"), TypeError,
     "AugmentImageComponents: copy must be True or False"),
    # True was taken as index 1: the coordinates were augmented as an image
    (lambda ds, a: AugmentImageCoordinates(ds, a, img_index=True), TypeError,
     r"AugmentImageCoordinates: img_index must be an int \(or a dict key\), got True"),
    (lambda ds, a: AugmentImageComponent(ds, a, index=1.5), TypeError,
     r"AugmentImageComponent: index must be an int \(or a dict key\), got 1.5"),
    (lambda ds, a: AugmentImageComponents(ds, a, index=(0, None)), TypeError,
     r"AugmentImageComponents: index must be an int \(or a dict key\), got None"),
    # channel=1.5 was read as 1
    (lambda ds, a: dataflow.ImageFromFile(["a.jpg"], channel=1.5), ValueError,
     "ImageFromFile: channel must be 1 or 3, got 1.5"),
    (lambda ds, a: dataflow.ImageFromFile(["a.jpg"], shuffle="False"), TypeError,
     "ImageFromFile: shuffle must be True or False"),
    # None failed in os.stat and 5 inside OpenCV at the first read; a resize of strings or
    # floats inside OpenCV too
    (lambda ds, a: dataflow.ImageFromFile(["a.jpg", None]), TypeError,
     "ImageFromFile: files must be paths, got None among them"),
    (lambda ds, a: dataflow.ImageFromFile(5), TypeError, "files must be a list of paths, got 5"),
    (lambda ds, a: dataflow.ImageFromFile(["a.jpg"], resize=("4", "5")), ValueError,
     r"Illegal shape: \('4', '5'\)"),
])
def test_bad_arguments_are_refused_when_built(make, error, match):
    ds = dataflow.DataFromList([[np.zeros((4, 4, 3), np.uint8), np.zeros((1, 2))]])
    with pytest.raises(error, match=match):
        make(ds, [imgaug.Flip(horiz=True)])
