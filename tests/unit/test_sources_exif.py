"""hvdcls.data.sources.open_image_bytes turns an image upright as its EXIF orientation says."""
import io

import numpy as np
import pytest
from PIL import Image

from hvdcls.data.sources import open_image_bytes

ORIENTATION = 0x0112


def top_white_left_black(width=40, height=20) -> np.ndarray:
    """A landscape image whose top half is white: where the top went tells the turn."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[: height // 2] = 255
    return pixels


def jpeg(pixels: np.ndarray, orientation=None) -> bytes:
    exif = Image.Exif()
    if orientation is not None:
        exif[ORIENTATION] = orientation
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95, exif=exif)
    return out.getvalue()


def white_side(image: Image.Image) -> str:
    """Which side of the image is the white half: top, bottom, left or right."""
    pixels = np.asarray(image, np.float32).mean(axis=2)
    h, w = pixels.shape
    sides = {"top": pixels[: h // 4].mean(), "bottom": pixels[-h // 4:].mean(),
             "left": pixels[:, : w // 4].mean(), "right": pixels[:, -w // 4:].mean()}
    return max(sides, key=lambda side: sides[side])


# EXIF orientation -> (the size once upright, where the stored top half ends up)
TURNS = {1: ((40, 20), "top"), 3: ((40, 20), "bottom"), 6: ((20, 40), "right"), 8: ((20, 40), "left")}


@pytest.mark.parametrize("orientation", sorted(TURNS))
def test_a_jpeg_is_turned_as_its_orientation_tag_says(orientation):
    image = open_image_bytes(jpeg(top_white_left_black(), orientation), "photo.jpg")
    size, side = TURNS[orientation]
    assert image.mode == "RGB" and image.size == size and white_side(image) == side


def test_an_image_without_exif_is_read_as_stored():
    pixels = top_white_left_black()
    image = open_image_bytes(jpeg(pixels), "plain.jpg")
    assert image.size == (40, 20) and np.abs(np.asarray(image, np.int16) - pixels).max() <= 8
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, "PNG")
    assert np.array_equal(np.asarray(open_image_bytes(png.getvalue(), "plain.png")), pixels)
