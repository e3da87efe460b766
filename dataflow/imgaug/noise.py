"""Noise: :class:`JpegNoise`, :class:`GaussianNoise`, :class:`SaltPepperNoise`.

The noise of ``GaussianNoise`` and ``SaltPepperNoise`` is generated from a seed drawn from
the augmentor's ``rng`` in ``get_transform`` (so the transform is deterministic and re-applying
it gives the same noise), with numpy's fast ``Generator`` in float32 rather than the legacy
float64 ``randn``/``uniform`` of tensorpack.
"""
import numpy as np

from ._cv import cv2
from .transform import cv_input
from .base import PhotometricAugmentor, check_probability
from .imgproc import clip_inplace, with_alpha

__all__ = ["JpegNoise", "GaussianNoise", "SaltPepperNoise"]


def _generator(seed):
    return np.random.Generator(np.random.PCG64(seed))


class JpegNoise(PhotometricAugmentor):
    """Encode as JPEG with a random quality in ``[low, high)`` of ``quality_range`` and decode.
    The output has the input's shape and dtype (0.11 always returned 3 channels); the alpha of a
    4-channel image (last) is kept as it is, the colour channels go through the codec. Another dtype
    than uint8 is converted for the codec as OpenCV's encoder converts it: rounded to the
    nearest integer (halves to even) and saturated to [0, 255]."""

    native = True

    def __init__(self, quality_range=(40, 100)):
        super().__init__()
        self._init(locals())

    def _get_augment_params(self, _):
        return int(self.rng.randint(*self.quality_range))

    def _augment(self, img, q):
        if img.ndim == 3 and img.shape[2] not in (1, 3, 4):
            raise ValueError(f"JpegNoise needs a grey image or one of 3 channels, or 4 with "
                             f"alpha last; got shape {img.shape}")
        alpha_of = img
        if img.ndim == 3 and img.shape[2] == 4:
            img = img[:, :, :3]
        c = cv2()
        dtype = img.dtype
        if dtype == np.uint8:
            src = img
        elif dtype == np.float32 or dtype == np.float64:
            # two OpenCV passes, half the time of numpy's three: negatives (and NaN) to 0, then
            # |x| rounded and saturated, which for x >= 0 is the encoder's own conversion
            src = c.convertScaleAbs(c.threshold(cv_input(img), 0, 0, c.THRESH_TOZERO)[1])
        else:
            src = np.rint(np.clip(img, 0, 255)).astype(np.uint8)
        ok, enc = c.imencode(".jpg", cv_input(src), [c.IMWRITE_JPEG_QUALITY, q])
        if not ok:
            raise ValueError(f"JpegNoise: cannot encode an image of shape {img.shape}")
        flag = c.IMREAD_COLOR if img.ndim == 3 and img.shape[2] == 3 else c.IMREAD_GRAYSCALE
        out = c.imdecode(enc, flag).reshape(img.shape).astype(dtype, copy=False)
        return with_alpha(out, alpha_of) if alpha_of is not img else out


class GaussianNoise(PhotometricAugmentor):
    """Add ``N(0, sigma**2)`` noise to every value; clip to [0, 255] when ``clip`` (uint8
    always saturates). dtype kept."""

    native = True

    def __init__(self, sigma=1, clip=True):
        super().__init__()
        self._init(locals())

    def _get_augment_params(self, _):
        return int(self.rng.randint(2**31))

    def _augment(self, img, seed):
        noise = _generator(seed).standard_normal(img.shape, dtype=np.float32)
        noise *= np.float32(self.sigma)
        noise += img
        if self.clip or img.dtype == np.uint8:
            clip_inplace(noise)
        if img.dtype == np.uint8:
            np.rint(noise, out=noise)
        return noise.astype(img.dtype, copy=False)


class SaltPepperNoise(PhotometricAugmentor):
    """Set each value to 255 with probability ``white_prob`` and to 0 with probability
    ``black_prob``, **in place** (as tensorpack)."""

    native = True

    def __init__(self, white_prob=0.05, black_prob=0.05):
        super().__init__()
        check_probability("SaltPepperNoise", white_prob, "white_prob")
        check_probability("SaltPepperNoise", black_prob, "black_prob")
        if white_prob + black_prob > 1:
            raise ValueError("SaltPepperNoise: white_prob + black_prob must be <= 1")
        self._init(locals())

    def _get_augment_params(self, _):
        return int(self.rng.randint(2**31))

    def _augment(self, img, seed):
        u = _generator(seed).random(img.shape, dtype=np.float32)
        np.copyto(img, 255, where=u > 1 - self.white_prob, casting="unsafe")
        np.copyto(img, 0, where=u < self.black_prob, casting="unsafe")
        return img
