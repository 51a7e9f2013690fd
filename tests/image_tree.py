"""Real image files on disk for tests: scikit-learn's digits written as PNG files in the
ImageFolder layout (ROOT/train/<digit>/*.png, ROOT/val/<digit>/*.png)."""
from pathlib import Path

import numpy as np
from PIL import Image


def write_digits_imagefolder(root: Path, val_every: int = 5, scale: int = 2) -> Path:
    """Every `val_every`-th digit goes to val/; images upscaled `scale`x, RGB PNG files."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    for index, (image, label) in enumerate(zip(pixels, bunch.target)):
        split = "val" if index % val_every == 0 else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(image).convert("RGB").resize((8 * scale, 8 * scale), Image.Resampling.NEAREST)
        picture.save(folder / f"{index:04d}.png")
    return root


FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


def write_letters_imagefolder(root: Path, size: int = 32, variants: int = 2, val_fonts: int = 9,
                              seed: int = 0) -> Path:
    """A small set that overfits: the 26 capital letters rendered in the DejaVu fonts on disk,
    `variants` draws per letter and font (glyph size 55-80% of the side, rotation +-10 degrees,
    offset +-1/8 of the side), white on black. Validation holds whole fonts that training never
    sees (every `len(fonts) // val_fonts`-th), so the test is generalising to new typefaces."""
    from PIL import ImageDraw, ImageFont

    fonts = sorted(p for p in FONT_DIR.glob("DejaVu*.ttf") if "Math" not in p.name)
    held_out = set(fonts[::max(1, len(fonts) // val_fonts)][:val_fonts])
    rng = np.random.default_rng(seed)
    for font_path in fonts:
        split = "val" if font_path in held_out else "train"
        for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
            folder = root / split / letter
            folder.mkdir(parents=True, exist_ok=True)
            for variant in range(variants):
                font = ImageFont.truetype(str(font_path), int(size * 3 * rng.uniform(0.55, 0.8)))
                canvas = Image.new("L", (size * 3, size * 3))  # drawn 3x larger, then reduced
                ImageDraw.Draw(canvas).text((size * 1.5, size * 1.5), letter, fill=255, font=font,
                                            anchor="mm")
                shift = rng.uniform(-size * 3 / 8, size * 3 / 8, 2)
                canvas = canvas.rotate(rng.uniform(-10, 10), Image.Resampling.BILINEAR, translate=tuple(shift))
                canvas.resize((size, size), Image.Resampling.LANCZOS).convert("RGB").save(
                    folder / f"{font_path.stem}-{variant}.png")
    return root
