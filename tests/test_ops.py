import io
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import numpy as np
import pytest

import dataflow
from dataflow import DataFromList, MapData, set_seed
from dataflow import rng as drng
from dataflow.ops import (CenterCrop, Compose, Decode, HWC2CHW, Lambda, Normalize, OneHot,
                          RandomCrop, RandomHorizontalFlip, Resize, TypeCast, fuse, is_native,
                          native)


@pytest.fixture(autouse=True)
def _clean_rng():
    set_seed(None)
    drng.set_datapoint_key(None)
    yield
    set_seed(None)
    drng.set_datapoint_key(None)


def image(h=6, w=8, c=3, dtype=np.uint8):
    """An image whose pixels are all distinct (for c * h * w <= 256 with uint8)."""
    return (np.arange(h * w * c) % 256).astype(dtype).reshape(h, w, c)


def py_fn(x):
    return x


# -- index=None vs index=k ------------------------------------------------------------------------

def test_index_none_transforms_the_value():
    x = image()
    np.testing.assert_array_equal(HWC2CHW()(x), x.transpose(2, 0, 1))


def test_index_on_list_tuple_dict_returns_a_copy():
    x = image()
    dp = [x, 7]
    out = HWC2CHW(index=0)(dp)
    assert isinstance(out, list) and out is not dp
    assert dp[0] is x                                    # caller's list untouched
    np.testing.assert_array_equal(out[0], x.transpose(2, 0, 1))
    assert out[1] == 7

    out = OneHot(10, index=-1)((x, 3))
    assert isinstance(out, list) and out[0] is x
    np.testing.assert_array_equal(out[1], np.eye(10, dtype=np.float32)[3])

    d = {"img": x, "label": 2}
    out = OneHot(4, index="label")(d)
    assert out is not d and d["label"] == 2 and out["img"] is x
    np.testing.assert_array_equal(out["label"], [0, 0, 1, 0])


def test_index_errors_are_clear():
    with pytest.raises(IndexError, match=r"HWC2CHW\(index=2\).*2 components"):
        HWC2CHW(index=2)([image(), 1])
    with pytest.raises(KeyError, match="no key 'img'"):
        HWC2CHW(index="img")({"image": image()})
    with pytest.raises(TypeError, match="needs an int index"):
        HWC2CHW(index="img")([image()])
    with pytest.raises(TypeError, match="expects a datapoint"):
        HWC2CHW(index=0)(image())
    with pytest.raises(TypeError, match="index must be"):
        HWC2CHW(index=True)


def test_none_from_component_drops_the_datapoint():
    assert Lambda(lambda v: None, index=0)([1, 2]) is None
    assert Lambda(lambda v: v + 1, index=0)([1, 2]) == [2, 2]


# -- image ops against references -----------------------------------------------------------------

def test_center_crop_is_slicing():
    x = image(7, 10)
    np.testing.assert_array_equal(CenterCrop((4, 5))(x), x[1:5, 2:7])
    np.testing.assert_array_equal(CenterCrop(3)(x[..., 0]), x[2:5, 3:6, 0])
    out = CenterCrop((7, 10))(x)
    np.testing.assert_array_equal(out, x)
    assert out is not x and out.flags.c_contiguous


def _offset(img, crop):
    """Where ``crop`` (of an image with distinct pixel values) sits in ``img``."""
    (top,), (left,) = np.nonzero(img[..., 0] == crop[0, 0, 0])
    return int(top), int(left)


def test_random_crop_is_slicing_at_every_position():
    set_seed(3)
    x = image(6, 8)
    op = RandomCrop((4, 7))
    seen = set()
    for i in range(60):
        drng.set_datapoint_key((0, i))
        out = op(x)
        top, left = _offset(x, out)
        np.testing.assert_array_equal(out, x[top:top + 4, left:left + 7])
        assert out.flags.c_contiguous
        seen.add((top, left))
    assert seen == {(t, l) for t in range(3) for l in range(2)}


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64, np.int64, bool])
@pytest.mark.parametrize("shape", [(6, 9), (6, 9, 1), (6, 9, 3), (6, 9, 5)])
def test_flip_gives_a_new_contiguous_array_of_every_dtype(dtype, shape):
    # cv2.flip where OpenCV takes the image (up to 4 channels of its dtypes), numpy otherwise
    base = (np.random.RandomState(2).rand(*shape) * 200).astype(dtype)
    for x in (base, base[1:5, ::-1]):
        out = RandomHorizontalFlip(1.0)(x)
        assert out.dtype == x.dtype and out.flags.c_contiguous
        assert not np.shares_memory(out, base)
        np.testing.assert_array_equal(out, x[:, ::-1])


def test_flip():
    x = image()
    np.testing.assert_array_equal(RandomHorizontalFlip(1.0)(x), x[:, ::-1])
    assert RandomHorizontalFlip(0.0)(x) is x
    np.testing.assert_array_equal(RandomHorizontalFlip(1)(x[..., 0]), x[:, ::-1, 0])
    set_seed(0)
    flipped = 0
    for i in range(100):
        drng.set_datapoint_key((0, i))
        out = RandomHorizontalFlip(0.5)(x)
        if out is x:
            continue
        np.testing.assert_array_equal(out, x[:, ::-1])
        flipped += 1
    assert 25 < flipped < 75
    with pytest.raises(ValueError, match="prob"):
        RandomHorizontalFlip(1.5)


def test_normalize_matches_formula():
    x = image(5, 4, 3)
    mean, std = [10.0, 20.0, 30.0], [2.0, 4.0, 0.5]
    out = Normalize(mean, std)(x)
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_allclose(out, (x - np.array(mean)) / np.array(std), rtol=1e-6)
    assert x.dtype == np.uint8                            # input untouched
    np.testing.assert_allclose(Normalize(3, 2)(x), (x.astype(float) - 3) / 2, rtol=1e-6)
    g = x[..., 0].astype(np.float64)
    np.testing.assert_allclose(Normalize([3], [2])(g), (g - 3) / 2, rtol=1e-6)


def test_normalize_errors():
    with pytest.raises(ValueError, match=r"Normalize: mean has 3 values but the image has 1 "
                                         r"channel \(shape \(5, 4, 1\)\)"):
        Normalize([1, 2, 3], [1, 1, 1])(image(5, 4, 1))
    with pytest.raises(ValueError, match="std must not contain 0"):
        Normalize(0, [1, 0])
    with pytest.raises(TypeError, match=r"Normalize: unsupported dtype bool"):
        Normalize(0, 1)(np.zeros((2, 2), bool))
    with pytest.raises(TypeError, match="Normalize: expected a numpy array.*list"):
        Normalize(0, 1)([[1, 2]])
    with pytest.raises(ValueError, match=r"Normalize: expected an HW or HWC image.*\(2,\)"):
        Normalize(0, 1)(np.zeros(2))
    # text was read as a number: Normalize(mean="3", std="2") subtracted 3
    with pytest.raises(TypeError, match="Normalize: mean must be a number or a sequence of "
                                        "numbers, got '3'"):
        Normalize("3", "2")
    with pytest.raises(TypeError, match=r"Normalize: std must be.*\[1, '2'\]"):
        Normalize(0, [1, "2"])
    assert Normalize(np.array([1.0, 2.0], dtype=object), 1).mean == [1.0, 2.0]   # numbers


def test_hwc2chw():
    x = image(3, 5, 2)
    out = HWC2CHW()(x)
    np.testing.assert_array_equal(out, x.transpose(2, 0, 1))
    assert out.flags.c_contiguous
    with pytest.raises(ValueError, match=r"HWC2CHW: expected an HWC image.*\(3, 5\)"):
        HWC2CHW()(x[..., 0])


def _bilinear_reference(x, oh, ow):
    """Per-pixel bilinear resize, pixel centres aligned (OpenCV INTER_LINEAR)."""
    h, w = x.shape[:2]
    out = np.zeros((oh, ow) + x.shape[2:], np.float64)
    for i in range(oh):
        sy = min(max((i + 0.5) * h / oh - 0.5, 0), h - 1)
        y0 = int(np.floor(sy))
        y1, fy = min(y0 + 1, h - 1), sy - int(np.floor(sy))
        for j in range(ow):
            sx = min(max((j + 0.5) * w / ow - 0.5, 0), w - 1)
            x0 = int(np.floor(sx))
            x1, fx = min(x0 + 1, w - 1), sx - x0
            out[i, j] = ((1 - fy) * ((1 - fx) * x[y0, x0] + fx * x[y0, x1])
                         + fy * ((1 - fx) * x[y1, x0] + fx * x[y1, x1]))
    return out


@pytest.mark.parametrize("oh,ow", [(3, 4), (9, 13), (5, 7), (1, 1)])
def test_resize_matches_reference(oh, ow):
    rs = np.random.RandomState(0)
    x = rs.rand(5, 7, 2).astype(np.float32)
    np.testing.assert_allclose(Resize((oh, ow))(x), _bilinear_reference(x, oh, ow), atol=1e-5)
    u = (rs.rand(5, 7, 3) * 255).astype(np.uint8)
    ref = np.clip(np.rint(_bilinear_reference(u.astype(np.float64), oh, ow)), 0, 255)
    out = Resize((oh, ow))(u)
    assert out.dtype == np.uint8
    assert np.abs(out.astype(int) - ref).max() <= 1        # float32 vs float64 rounding


def test_resize_known_values_and_sizes():
    x = np.array([[0.0, 10.0]], np.float32)
    np.testing.assert_allclose(Resize((1, 4))(x), [[0, 2.5, 7.5, 10]])
    assert Resize(10)(np.zeros((20, 40, 3), np.uint8)).shape == (10, 20, 3)
    assert Resize(10)(np.zeros((45, 20), np.int16)).shape == (22, 10)
    assert Resize((4, 6))(np.zeros((8, 8, 5), np.float64)).shape == (4, 6, 5)
    c = np.full((7, 9, 3), 200, np.uint8)
    np.testing.assert_array_equal(Resize((20, 3))(c), np.full((20, 3, 3), 200, np.uint8))
    x = image()
    assert Resize((6, 8))(x) is x


def test_resize_saturates_8_byte_integers_without_wrapping():
    # float(2**63 - 1) is 2**63: clipped to it, the cast back wrapped to the minimum
    for dtype in (np.int64, np.uint64):
        info = np.iinfo(dtype)
        out = Resize((2, 4))(np.full((2, 2), info.max, dtype))
        assert out.dtype == dtype and (out > info.max // 2).all()
        out = Resize((2, 4))(np.full((2, 2), info.min, dtype))
        assert (out == info.min).all()


def test_resize_errors():
    with pytest.raises(TypeError, match="Resize: unsupported dtype bool"):
        Resize(4)(np.zeros((4, 4), bool))
    with pytest.raises(ValueError, match=r"Resize: expected an HW or HWC image.*\(1, 4, 4, 3\)"):
        Resize(4)(np.zeros((1, 4, 4, 3)))
    with pytest.raises(ValueError, match=r"Resize: empty image of shape \(0, 4\)"):
        Resize(4)(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="positive"):
        Resize((0, 3))
    with pytest.raises(TypeError, match="size must be an int or a pair"):
        Resize("big")


def test_crop_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"RandomCrop: crop size \(5, 5\) is larger than the "
                                         r"image \(shape \(4, 8, 3\)\)"):
        RandomCrop(5)(image(4, 8))
    with pytest.raises(ValueError, match=r"CenterCrop: crop size \(2, 9\)"):
        CenterCrop((2, 9))(image(4, 8))
    with pytest.raises(TypeError, match="CenterCrop: expected a numpy array"):
        CenterCrop(2)([[1, 2], [3, 4]])


# -- array ops ------------------------------------------------------------------------------------

def test_typecast():
    x = np.array([[1.7, -1.2], [300.0, 2.0]])
    out = TypeCast(np.float32)(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float32))
    assert TypeCast("float64")(x) is x
    s = TypeCast("int64")(5)
    assert type(s) is np.int64 and s == 5
    np.testing.assert_array_equal(TypeCast(np.uint8)([1, 2]), np.array([1, 2], np.uint8))
    with pytest.raises(TypeError, match="TypeCast: not a numpy dtype"):
        TypeCast("no-such-dtype")
    # numpy reads None as float64 and [] as an empty record dtype: both are mistakes here
    for bad in (None, []):
        with pytest.raises(TypeError, match="TypeCast: dtype must name a numeric dtype"):
            TypeCast(bad)
    assert TypeCast([("x", "f4"), ("y", "f4")]).dtype.names == ("x", "y")    # a record dtype
    with pytest.raises(ValueError, match="TypeCast: cannot cast"):
        TypeCast(np.float32)(np.array(["abc"]))
    with pytest.raises(ValueError, match="TypeCast: cannot cast list to float32"):
        TypeCast(np.float32)([[1], [1, 2]])          # ragged: no shape to report


def test_onehot_matches_eye():
    eye = np.eye(5, dtype=np.float32)
    out = OneHot(5)(3)
    assert out.dtype == np.float32 and out.shape == (5,)
    np.testing.assert_array_equal(out, eye[3])
    np.testing.assert_array_equal(OneHot(5)(np.int64(0)), eye[0])
    labels = np.array([[0, 4], [2, 2]], np.uint8)
    np.testing.assert_array_equal(OneHot(5)(labels), eye[labels])
    assert OneHot(5)(np.zeros(0, int)).shape == (0, 5)


def test_onehot_errors():
    with pytest.raises(ValueError, match=r"OneHot: label 5 is out of range for num_classes=5"):
        OneHot(5)(5)
    with pytest.raises(ValueError, match=r"label -1 is out of range"):
        OneHot(5)(np.array([1, -1]))
    with pytest.raises(TypeError, match="OneHot: labels must be integers, got dtype float64"):
        OneHot(5)(2.0)
    with pytest.raises(TypeError, match="dtype bool"):
        OneHot(5)(True)
    with pytest.raises(ValueError, match="num_classes"):
        OneHot(0)


# -- Decode ---------------------------------------------------------------------------------------

def _encode(arr, fmt, **kw):
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_decode_png_exact():
    rgb = image(5, 7, 3)
    png = _encode(rgb, "PNG")
    out = Decode()(png)
    assert out.dtype == np.uint8 and out.flags.writeable
    np.testing.assert_array_equal(out, rgb)
    np.testing.assert_array_equal(Decode()(np.frombuffer(png, np.uint8)), rgb)
    np.testing.assert_array_equal(Decode()(bytearray(png)), rgb)
    np.testing.assert_array_equal(Decode(index=0)([memoryview(png), 1])[0], rgb)
    # Decode(index=None) as the other ops: the index is its first argument, mode a keyword
    np.testing.assert_array_equal(Decode(1)([0, png])[1], rgb)
    np.testing.assert_array_equal(Decode("img")({"img": png})["img"], rgb)

    rgba = image(4, 4, 4)
    np.testing.assert_array_equal(Decode()(_encode(rgba, "PNG")), rgba[..., :3])
    np.testing.assert_array_equal(Decode(mode="RGBA")(_encode(rgba, "PNG")), rgba)


def test_decode_grayscale():
    gray = image(5, 6, 1)[..., 0]
    png = _encode(gray, "PNG")
    out = Decode()(png)
    assert out.shape == (5, 6, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], gray)
    np.testing.assert_array_equal(Decode(mode="L")(png), gray[..., None])


def test_decode_jpeg():
    from PIL import Image
    yy, xx = np.mgrid[0:32, 0:48]
    smooth = np.stack([yy * 4, xx * 4, (yy + xx) * 2], -1).astype(np.uint8)
    jpg = _encode(smooth, "JPEG", quality=95)
    out = Decode()(jpg)
    assert out.shape == (32, 48, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, np.array(Image.open(io.BytesIO(jpg)).convert("RGB")))
    assert np.abs(out.astype(int) - smooth).mean() < 3


def test_decode_errors():
    with pytest.raises(ValueError, match=r"Decode: cannot decode 9 bytes \(starting "
                                         r"b'notanima'\) as an image"):
        Decode()(b"notanimag")
    with pytest.raises(ValueError, match="0 bytes"):
        Decode()(b"")
    with pytest.raises(TypeError, match="Decode: expected encoded image bytes, got str"):
        Decode()("file.png")
    with pytest.raises(TypeError, match=r"1-D uint8 array.*float64"):
        Decode()(np.zeros(4))
    with pytest.raises(ValueError, match="mode"):
        Decode(mode="CMYK")


def test_decode_without_pillow(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r'pip install "dataflow-rt\[images\]"'):
        Decode()(b"\x89PNG....")


# -- randomness -----------------------------------------------------------------------------------

RANDOM = Compose([RandomCrop((4, 5)), RandomHorizontalFlip(0.5)])


def _run(keys, op, x):
    out = {}
    for k in keys:
        drng.set_datapoint_key(k)
        out[k] = op(x)
    drng.set_datapoint_key(None)
    return out


def test_random_ops_reproducible_per_datapoint():
    x = image(8, 9)
    keys = [(0, i) for i in range(40)]
    set_seed(11)
    a = _run(keys, RANDOM, x)
    set_seed(11)
    b = _run(reversed(keys), RANDOM, x)                 # order does not matter
    for k in keys:
        np.testing.assert_array_equal(a[k], b[k])
    distinct = {a[k].tobytes() for k in keys}
    assert len(distinct) > 10                           # different keys, different draws
    set_seed(12)
    c = _run(keys, RANDOM, x)
    assert any(not np.array_equal(a[k], c[k]) for k in keys)


def test_random_ops_same_in_threads_and_ignore_global_numpy_state():
    x = image(8, 9)
    keys = [(1, i) for i in range(64)]
    set_seed(5)
    serial = _run(keys, RANDOM, x)

    def work(chunk):
        return _run(chunk, RANDOM, x)

    np.random.seed(999)
    state = np.random.get_state()[1].copy()
    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(work, [keys[i::4] for i in range(4)]))
    assert np.array_equal(np.random.get_state()[1], state)   # global state not drawn from
    threaded = {k: v for p in parts for k, v in p.items()}
    for k in keys:
        np.testing.assert_array_equal(serial[k], threaded[k])


# -- Compose and fuse -----------------------------------------------------------------------------

def test_compose_applies_in_order_and_drops_on_none():
    calls = []
    c = Compose([Lambda(lambda v: calls.append("a") or v + 1, index=0),
                 Lambda(lambda v: calls.append("b") or v * 10, index=0)])
    assert c([1, "x"]) == [20, "x"] and calls == ["a", "b"]
    calls.clear()
    d = Compose([lambda dp: None, Lambda(lambda v: calls.append("c"), index=0)])
    assert d([1]) is None and calls == []
    assert Compose([])([3]) == [3]
    with pytest.raises(TypeError, match="Compose: op #1 is not callable"):
        Compose([py_fn, 5])


def test_compose_native_and_flattening():
    nat = Compose([Resize(4), Normalize(0, 1)])
    assert is_native(nat) and not is_native(Compose([Resize(4), py_fn]))
    nested = Compose([nat, Compose([HWC2CHW()])])
    assert len(nested) == 3 and is_native(nested)


def test_builtin_ops_are_native_and_lambda_follows_its_function():
    for op in (Decode(), Resize(4), RandomCrop(2), CenterCrop(2), RandomHorizontalFlip(),
               Normalize(0, 1), HWC2CHW(), TypeCast("f4"), OneHot(3)):
        assert op.native is True and is_native(op)
    assert not is_native(Lambda(py_fn)) and is_native(Lambda(native(lambda v: v)))


def test_fuse_merges_runs_of_native_ops():
    a, b, c, d = Resize(4, index=0), Normalize(0, 1, index=0), HWC2CHW(index=0), OneHot(3, 1)
    fused = fuse([a, b, py_fn, c, Compose([d, py_fn]), a])
    assert len(fused) == 5
    assert isinstance(fused[0], Compose) and fused[0].ops == [a, b] and is_native(fused[0])
    assert fused[1] is py_fn
    assert isinstance(fused[2], Compose) and fused[2].ops == [c, d]
    assert fused[3] is py_fn and fused[4] is a            # a run of one stays as it is
    assert fuse([py_fn, py_fn]) == [py_fn, py_fn]
    assert fuse(a) == [a] and fuse([]) == []


def test_fused_list_gives_the_same_result():
    ops = [Resize((4, 4), index=0), Normalize([1, 2, 3], 2, index=0), Lambda(py_fn, index=0),
           HWC2CHW(index=0), OneHot(3, index=1)]
    dp = [image(), 2]
    want = Compose(ops)(dp)
    got = dp
    for op in fuse(ops):
        got = op(got)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].shape == (3, 4, 4)


def test_fused_normalize_and_chw_takes_images_of_many_channels():
    # the fused pair split uint8 images with OpenCV, which takes 128 channels at most
    x = (np.arange(2 * 3 * 129) % 251).astype(np.uint8).reshape(2, 3, 129)
    want = HWC2CHW()(Normalize(3, 2)(x))
    np.testing.assert_array_equal(Compose([Normalize(3, 2), HWC2CHW()])(x), want)
    assert want.shape == (129, 2, 3)


def test_ops_pickle_and_run_in_mapdata():
    png = _encode(image(6, 8), "PNG")
    chain = Compose([Decode(index=0), CenterCrop(4, index=0), Normalize(0, 255, index=0),
                     HWC2CHW(index=0), OneHot(3, index=1)])
    for mod in (pickle, cloudpickle):
        chain2 = mod.loads(mod.dumps(chain))
        assert repr(chain2) == repr(chain)
    ds = MapData(DataFromList([[png, 1], [png, 2]], shuffle=False), chain2)
    ds.reset_state()
    out = list(ds)
    expect = image(6, 8)[1:5, 2:6].transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(out[0][0], expect, rtol=1e-6)
    np.testing.assert_array_equal(out[1][1], [0, 0, 1])
    assert repr(CenterCrop(4, index=0)) == "CenterCrop(size=(4, 4), index=0)"
    assert dataflow.ops.Decode is Decode


def test_serial_mapdata_keys_each_datapoint_by_pass_and_index_also_when_nested():
    # Serial MapData keys datapoint_rng by (pass, index) through a cursor advanced in place;
    # the draws must be those of the explicit tuple key, one stream per datapoint. Of two
    # nested serial MapData, the outer one (one map below it: stage 1) keys by (pass, index,
    # no copy, stage 1): its own stream, not the inner one's draws again.
    def draw(dp):
        return dp + [int(drng.datapoint_rng().integers(1 << 30))]

    def expected(key, calls):
        drng.set_datapoint_key(key)
        return [int(drng.datapoint_rng().integers(1 << 30)) for _ in range(calls)]

    set_seed(7)
    inner = MapData(DataFromList([[k] for k in range(5)], shuffle=False), draw)
    outer = MapData(inner, draw)
    outer.reset_state()
    got = [list(outer), list(outer)]      # two passes
    for p in range(2):
        for i in range(5):
            a, b = expected((p, i), 1)[0], expected((p, i, 0, 1), 1)[0]
            assert a != b and got[p][i] == [i, a, b]

    # repeated calls for one datapoint continue its stream
    def two(dp):
        g = drng.datapoint_rng()
        return [int(g.integers(1 << 30)), int(drng.datapoint_rng().integers(1 << 30))]

    df = MapData(DataFromList([[k] for k in range(3)], shuffle=False), two)
    df.reset_state()
    assert list(df) == [expected((0, i), 2) for i in range(3)]


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("per_channel_mean,per_channel_std", [(True, True), (True, False),
                                                              (False, True), (False, False)])
def test_normalize_uint8_is_bit_for_bit_the_float32_arithmetic(channels, per_channel_mean,
                                                                 per_channel_std):
    x = np.arange(256, dtype=np.uint8).repeat(channels).reshape(16, 16, channels)
    mean = [100.5, 7.25, 250.0, 3.0][:channels] if per_channel_mean else 123.675
    std = [58.395, 0.5, 3.0, 1.0][:channels] if per_channel_std else 57.12
    m32 = np.asarray(mean, np.float32).reshape(-1)
    s32 = np.asarray(std, np.float32).reshape(-1)
    for dp in (x, x[:, ::-1]):                      # contiguous, and a strided view
        got = Normalize(mean, std)(dp)
        assert got.dtype == np.float32 and got.shape == dp.shape
        np.testing.assert_array_equal(got, (dp.astype(np.float32) - m32) / s32)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("mean,std", [((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
                                      (10.0, 3.0)])
def test_compose_runs_normalize_then_hwc2chw_as_one_step_bit_for_bit(dtype, mean, std):
    x = (np.random.RandomState(0).rand(7, 9, 3) * 255).astype(dtype)[:, ::-1]   # a strided view
    pair = [Normalize(mean, std, index=0), HWC2CHW(index=0)]
    composed = Compose(pair)
    assert len(composed._steps) == 1 and len(composed.ops) == 2   # merged, ops unchanged
    want = pair[1](pair[0]([x, 5]))
    got = composed([x, 5])
    assert got[1] == 5 and got[0].dtype == np.float32 and got[0].flags.c_contiguous
    np.testing.assert_array_equal(got[0], want[0])
    # the same through MapData's fused op list
    df = MapData(DataFromList([[x, 5]], shuffle=False), pair)
    df.reset_state()
    np.testing.assert_array_equal(list(df)[0][0], want[0])


def test_normalize_then_hwc2chw_errors_are_those_of_the_pair():
    composed = Compose([Normalize((1.0, 2.0, 3.0), (1.0, 1.0, 1.0)), HWC2CHW()])
    with pytest.raises(ValueError, match="Normalize: mean has 3 values but the image has 4"):
        composed(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="HWC2CHW: expected an HWC image"):
        Compose([Normalize(1.0, 2.0), HWC2CHW()])(np.zeros((4, 4), np.uint8))
    # different indexes: not merged
    assert len(Compose([Normalize(1.0, 2.0, index=0), HWC2CHW(index=1)])._steps) == 2


class _NoDictRead(dataflow.ops.Op):
    """An op whose ``__dict__`` must not be read: pickle's default restore writes a worker's
    copy's attributes into ``__dict__``, turning its inline values into a real dict (CPython
    3.11/3.12), and every ``self.index`` of ``__call__`` then takes the slow lookup."""

    native = True

    @property
    def __dict__(self):
        raise AssertionError("the op's __dict__ was read")

    def apply(self, value):
        return value + 1


def test_a_pickled_op_restores_its_attributes_without_reading_its_dict():
    copied = pickle.loads(pickle.dumps(_NoDictRead(index=1)))
    assert copied.index == 1
    assert copied([0, 1]) == [0, 2]


def test_seed_worker_and_set_seed_refuse_what_is_no_seed():
    # seed_worker took int('3') and int(1.5) as worker ids, and failed with a bare TypeError
    # on None; the state is left as it was
    before = drng.get_seed()
    for wid in ("3", 1.5, -5, None, True):
        with pytest.raises(ValueError, match="worker id must be a non-negative int"):
            drng.seed_worker(wid, None)
    for seed in (-1, "3", 1.5):
        with pytest.raises(ValueError, match="seed must be a non-negative int or None"):
            drng.seed_worker(0, seed)
        with pytest.raises(ValueError, match="seed must be a non-negative int or None"):
            set_seed(seed)
    assert drng.get_seed() == before


def test_set_seed_restarts_the_random_ops_stream_outside_a_map():
    crop, x = RandomCrop(2), np.arange(100).reshape(10, 10)
    set_seed(3)
    first = [crop(x) for _ in range(5)]
    set_seed(3)
    again = [crop(x) for _ in range(5)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert len({a.tobytes() for a in first}) > 1            # still random from call to call


def test_a_datapoints_generator_is_its_keyed_sub_stream():
    """Inside a map, datapoint_rng() is the datapoint's sub-stream of a base PCG64 derived from
    the seed (advanced by the jump of its packed key), a stream apart from
    datapoint_random_state()'s;
    the same key gives the same draws in any thread, and repeated calls continue one stream."""
    def draws(key, calls=2):
        drng.set_datapoint_key(key)
        try:
            return [int(drng.datapoint_rng().integers(2**62)) for _ in range(calls)]
        finally:
            drng.set_datapoint_key(None)

    set_seed(9)
    got = draws((3, 17))
    base = np.random.PCG64(np.random.SeedSequence(9, spawn_key=(1 << 41,)))
    base.advance(drng._jump((3 << 48) | 17))
    want = np.random.Generator(base)
    assert got == [int(want.integers(2**62)) for _ in range(2)]
    assert got[0] != got[1]
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(draws, (3, 17)).result() == got
    assert draws((3, 18)) != got and draws((4, 17)) != got
    drng.set_datapoint_key((3, 17))
    try:
        legacy = int(drng.datapoint_random_state().randint(2**31))
        assert int(drng.datapoint_rng().integers(2**31)) != legacy
    finally:
        drng.set_datapoint_key(None)
    set_seed(10)
    assert draws((3, 17)) != got
    set_seed(None)


def test_the_streams_of_a_datapoint_across_passes_and_of_its_neighbours_are_unrelated():
    # PCG64 states a multiple of 2**k apart agree in their low k bits: with jumps of
    # key << 64, a datapoint's first draw in passes p and p + 4 was within 10 bits for a
    # quarter of the datapoints. Here no pair of related keys (same index in two passes,
    # indices 2**k apart, two stages) has first words within 8 bits of each other (for
    # independent words: about 5e-10 per pair, 2e5 pairs)
    def first_word(key):
        drng.set_datapoint_key(key)
        try:
            return int(drng.datapoint_rng().bit_generator.random_raw())
        finally:
            drng.set_datapoint_key(None)

    set_seed(7022)
    passes, n = 24, 256
    words = {(p, i, s): first_word((p, i, 0, s))
             for p in range(passes) for i in range(n) for s in (0, 1)}
    set_seed(None)
    pairs = [((p, i, 0), (q, i, 0)) for i in range(n) for p in range(passes)
             for q in range(p + 1, passes)]
    pairs += [((p, i, 0), (p, i + (1 << k), 0)) for p in range(passes) for k in range(8)
              for i in range(n - (1 << k))]
    pairs += [((p, i, 0), (p, i, 1)) for p in range(passes) for i in range(n)]
    close = [(a, b) for a, b in pairs if bin(words[a] ^ words[b]).count("1") <= 8]
    assert not close, f"{len(close)} of {len(pairs)} related keys, e.g. {close[:3]}"


@pytest.mark.parametrize("channels,mean,std", [
    (3, (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)), (1, 5.0, 2.0),
    (4, 10.0, (1.0, 2.0, 3.0, 4.0))])
def test_normalize_of_uint8_looks_up_what_the_arithmetic_gives(monkeypatch, channels, mean, std):
    """A uint8 image is normalized by OpenCV table lookups where OpenCV is installed: every one
    of the 256 values of every channel, HWC or fused into CHW, contiguous or a strided view,
    equals the float32 arithmetic bit for bit, and equals the numpy way without OpenCV."""
    from dataflow.ops import image as opimage
    assert opimage._optional_cv2() is not None         # [test] installs OpenCV
    x = np.tile(np.arange(256, dtype=np.uint8), (channels, 3)).T.reshape(16, 48, channels)
    want = (x.astype(np.float32) - np.float32(mean)) / np.float32(std)
    chw = Compose([Normalize(mean, std), HWC2CHW()])

    def run(image):
        return Normalize(mean, std)(image), chw(image)

    for image, expect in ((x, want), (x[:, ::-1], want[:, ::-1])):
        hwc, planes = run(image)
        assert hwc.shape == image.shape and hwc.dtype == np.float32
        np.testing.assert_array_equal(hwc, expect)
        np.testing.assert_array_equal(planes, expect.transpose(2, 0, 1))
    monkeypatch.setattr(opimage, "_cv2", False)         # no OpenCV: numpy
    hwc, planes = run(x)
    np.testing.assert_array_equal(hwc, want)
    np.testing.assert_array_equal(planes, want.transpose(2, 0, 1))
