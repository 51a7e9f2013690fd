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
        picture = Image.fromarray(image).convert("RGB").resize((8 * scale, 8 * scale), Image.NEAREST)
        picture.save(folder / f"{index:04d}.png")
    return root
