"""ops.Decode's JPEG decoders: every choice gives the same layout, dtype and colour order."""
import io

import numpy as np
import pytest
from PIL import Image

from dataflow.ops import Decode, jpeg_decoder
from dataflow.ops import image as image_ops

DECODERS = ("simplejpeg", "cv2", "pillow")


def _jpeg(arr, **kw):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95, **kw)
    return buf.getvalue()


def _picture(h=40, w=56):
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([yy * 5, xx * 4, 255 - (yy + xx) * 2], -1).clip(0, 255).astype(np.uint8)


def test_auto_is_the_fastest_installed():
    # benchmarks/decoders.py: simplejpeg, then cv2, then Pillow
    assert jpeg_decoder() == "simplejpeg"
    assert Decode().decoder == "auto"


@pytest.mark.parametrize("mode,shape", [("RGB", (40, 56, 3)), ("L", (40, 56, 1)),
                                        ("RGBA", (40, 56, 4))])
def test_every_decoder_gives_the_same_layout(mode, shape):
    pic = _picture()
    jpg = _jpeg(pic)
    ref = np.array(Image.open(io.BytesIO(jpg)).convert(mode))
    if ref.ndim == 2:
        ref = ref[:, :, None]
    for name in DECODERS:
        out = Decode(mode=mode, decoder=name)(jpg)
        assert out.shape == shape and out.dtype == np.uint8, name
        assert out.flags.writeable and out.flags.c_contiguous, name
        # RGB order (red first), not OpenCV's BGR; the same libjpeg-turbo settings give the
        # same pixels, so allow only rounding differences between builds
        assert np.abs(out.astype(int) - ref).max() <= 2, name
    if mode == "RGB":
        red = _jpeg(np.full((16, 16, 3), (250, 0, 0), np.uint8))
        for name in DECODERS:
            px = Decode(decoder=name)(red)[8, 8]
            assert px[0] > 200 and px[2] < 50, (name, px)


def test_grayscale_jpeg_to_rgb():
    gray = _picture()[..., 0]
    jpg = _jpeg(gray)
    outs = [Decode(decoder=name)(jpg) for name in DECODERS]
    for out in outs:
        assert out.shape == (40, 56, 3)
        np.testing.assert_array_equal(out[..., 0], out[..., 2])
        assert np.abs(out.astype(int) - outs[-1]).max() <= 2


def test_grey_decoding_of_a_colour_jpeg_is_libjpegs_luma_with_every_decoder():
    # Pillow converted its RGB to grey, up to ~30 levels off the luma simplejpeg and cv2 give
    rgb = np.random.RandomState(1).randint(0, 256, (64, 80, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=90)
    outs = [Decode(mode="L", decoder=name)(buf.getvalue()) for name in DECODERS]
    for out in outs:
        assert out.shape == (64, 80, 1) and out.dtype == np.uint8
        np.testing.assert_array_equal(out, outs[0])


def test_cmyk_jpegs_decode_to_rgb_with_every_decoder():
    cmyk = Image.fromarray(_picture()).convert("CMYK")
    buf = io.BytesIO()
    cmyk.save(buf, format="JPEG", quality=95)
    jpg = buf.getvalue()
    ref = np.array(Image.open(io.BytesIO(jpg)).convert("RGB"))
    for name in DECODERS:
        out = Decode(decoder=name)(jpg)
        assert out.shape == (40, 56, 3) and out.dtype == np.uint8
        assert np.abs(out.astype(int) - ref).max() <= 2, name


def test_every_decoder_reports_bad_jpeg_bytes():
    broken = b"\xff\xd8\xff" + b"\x00" * 40
    for name in DECODERS:
        with pytest.raises(ValueError, match=r"Decode: cannot decode 43 bytes"):
            Decode(decoder=name)(broken)
    with pytest.raises(ValueError, match="decoder must be"):
        Decode(decoder="libjpeg")


def test_auto_falls_back_when_simplejpeg_is_missing(monkeypatch):
    monkeypatch.setattr(image_ops, "_auto_jpeg", None)
    monkeypatch.setitem(__import__("sys").modules, "simplejpeg", None)
    try:
        assert jpeg_decoder() == "cv2"
        out = Decode()(_jpeg(_picture()))
        assert out.shape == (40, 56, 3)
    finally:
        image_ops._auto_jpeg = None


@pytest.mark.parametrize("decoder", ["pillow", "cv2", "simplejpeg"])
def test_an_image_of_more_than_8_bits_is_refused_not_clipped(decoder):
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000).save(buf, "PNG")
    with pytest.raises(ValueError, match=r"I;16 image .*uint8.*IMREAD_UNCHANGED"):
        Decode(decoder=decoder)(buf.getvalue())
