"""hvdcls.data.turbo_jpeg: simplejpeg, where installed, decodes JPEGs to the same pixels as
Pillow (whole, at each draft scale, turned by any EXIF orientation), and leaves to Pillow what
it does not take, so bad files are reported as before."""
import io

import numpy as np
import pytest
from PIL import Image

from hvdcls.data import turbo_jpeg
from hvdcls.data.bad_files import UnreadableImage
from hvdcls.data.sources import open_image_bytes, reduce_jpeg, upright
from tests.unit.test_scaled_decode import photo_like
from tests.unit.test_sources_exif import jpeg

pytestmark = pytest.mark.skipif(not turbo_jpeg.available(), reason="simplejpeg is not installed")


def pillow(data: bytes, draft=None) -> np.ndarray:
    """Pillow's decode, as open_image_bytes made it before simplejpeg."""
    with Image.open(io.BytesIO(data)) as image:
        if draft is not None:
            reduce_jpeg(image, draft)
        return np.asarray(upright(image).convert("RGB"))


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("wanted", [None, (900, 700), (300, 200), (100, 80), (10, 10)])
def test_the_same_pixels_as_pillow_at_every_scale_and_orientation(orientation, wanted):
    data = jpeg(photo_like(1000, 750, seed=orientation), orientation)
    draft = None if wanted is None else (lambda size: wanted)
    with Image.open(io.BytesIO(data)) as image:
        fast = turbo_jpeg.decode(image, data, draft)
    assert fast is not None and fast.mode == "RGB"
    assert np.array_equal(np.asarray(fast), pillow(data, draft))


def test_grey_jpegs_come_out_rgb_as_before():
    out = io.BytesIO()
    Image.fromarray(photo_like(64, 48)[..., 0]).save(out, "JPEG")
    data = out.getvalue()
    assert np.array_equal(np.asarray(open_image_bytes(data, "grey.jpg")), pillow(data))


def test_what_simplejpeg_refuses_goes_to_pillow():
    cmyk, truncated = io.BytesIO(), jpeg(photo_like(64, 48))[:-200]
    Image.fromarray(photo_like(64, 48)).convert("CMYK").save(cmyk, "JPEG")
    with Image.open(cmyk) as image:
        assert turbo_jpeg.decode(image, cmyk.getvalue()) is None  # Pillow converts CMYK, as before
    assert open_image_bytes(cmyk.getvalue(), "cmyk.jpg").mode == "RGB"
    with Image.open(io.BytesIO(truncated)) as image:
        assert turbo_jpeg.decode(image, truncated) is None
    with pytest.raises(UnreadableImage, match="truncated"):  # Pillow's words, as before
        open_image_bytes(truncated, "cut.jpg")
