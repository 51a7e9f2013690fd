"""JPEG decoding through simplejpeg (libjpeg-turbo's TurboJPEG API) where it is installed.

Pillow's JPEG decoder is libjpeg-turbo too, with the same settings (the accurate integer DCT,
smooth chroma upsampling) and the same power-of-two scales for its draft, so the pixels are
the same (tests/unit/test_turbo_jpeg.py; identical on the loader bench's photos); simplejpeg
decodes straight into a numpy array, without Pillow's incremental decoder and its copy for
the RGB conversion: a 500x375 photo's decode alone took 0.64 ms against Pillow's 1.6 on the
bench's 2-core VM (within the loader's per-image path, with caches shared with the resize,
about 1.3 against 1.5).

Optional (`pip install hvdcls[fast-jpeg]`): without it, or for what it does not take (CMYK,
16-bit, anything it refuses, a truncated file included since it treats libjpeg's warnings
as errors), `decode` returns None and Pillow decodes as before, so a bad file is reported by
Pillow's error, as it always was.
"""
from __future__ import annotations

from typing import Callable, Optional

from PIL import ExifTags, Image

try:
    import simplejpeg
except ImportError:  # the optional extra is not installed: Pillow decodes
    simplejpeg = None

TURNED = (5, 6, 7, 8)  # EXIF orientations that turn the image by 90 degrees: width and height swap
# EXIF orientation -> the transpose that makes the stored image upright (as ImageOps.exif_transpose)
UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
           5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
           8: Image.Transpose.ROTATE_90}
# An image's upright size -> the smallest decoded size wanted (hvdcls.data.transforms.Plan.draft)
Draft = Callable[[tuple[int, int]], tuple[int, int]]


def available() -> bool:
    return simplejpeg is not None


def orientation(image: Image.Image) -> int:
    return image.getexif().get(ExifTags.Base.Orientation, 1)


def pillow_scale(size: tuple[int, int], wanted: tuple[int, int]) -> int:
    """The reduction Pillow's JpegImageFile.draft picks for `wanted`: the largest of 8, 4, 2, 1
    that keeps both sides at least as large (both round the reduced sides up)."""
    most = min(size[0] // max(1, wanted[0]), size[1] // max(1, wanted[1]))
    return next(scale for scale in (8, 4, 2, 1) if scale <= max(1, most))


def decode(image: Image.Image, data: bytes, draft: Optional[Draft] = None) -> Optional[Image.Image]:
    """The JPEG `image` (opened by Pillow, its header read, not decoded) as an upright RGB
    image, reduced as `draft` asks (hvdcls.data.sources.reduce_jpeg's rule); None where
    simplejpeg is absent or does not apply."""
    if simplejpeg is None or image.format != "JPEG" or image.mode not in ("RGB", "L"):
        return None
    turn, (width, height) = orientation(image), image.size
    scale = 1
    if draft is not None:
        turned = turn in TURNED  # the draft speaks of the upright image: a turned one's sides swap
        want_width, want_height = draft((height, width) if turned else (width, height))
        scale = pillow_scale((width, height), (want_height, want_width) if turned else (want_width, want_height))
    expected = (-(-height // scale), -(-width // scale))
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=expected[0], min_width=expected[1],
                                        min_factor=float(scale))
    except ValueError:  # what it refuses, Pillow decodes or reports as it always did
        return None
    if pixels.shape[:2] != expected:  # a scale other than Pillow's would change the pixels
        return None
    decoded = Image.fromarray(pixels)
    return decoded.transpose(UPRIGHT[turn]) if turn in UPRIGHT else decoded
