"""data.decode=gpu's path (hvdcls.data.device_decode + torch_backend/decode.py), run with
device="cpu": torchvision decodes the JPEGs the workers handed over, the core's crop, resize and
flip are applied to them, and the batch is the CPU path's to a level of 255; what the device
cannot take (a PNG, CMYK, a truncated file) is decoded in the worker, exactly as before."""
import io

import numpy as np
import pytest
import torch
from PIL import Image

from hvdcls.bench.photos import photo_jpeg, sample_photos
from hvdcls.config import load
from hvdcls.data import device_decode
from hvdcls.data.bad_files import BadFileLog, CheckedSource
from hvdcls.data.batches import EpochBatches
from hvdcls.data.sources import FileSource
from hvdcls.data.transforms import Preprocess
from hvdcls.data.turbo_jpeg import UPRIGHT
from hvdcls.errors import UserError
from torch_backend import decode
from torch_backend.backend import TorchBackend

CPU = torch.device("cpu")
SIDE = 64  # the photos are 96x72 (some turned): a 64 px crop never decodes reduced on the CPU path
ORIENTATION = 0x0112


def write(path, image: Image.Image, orientation=None, **options):
    exif = Image.Exif()
    if orientation is not None:
        exif[ORIENTATION] = orientation
    image.save(path, exif=exif, **options)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """16 photos as JPEGs, every EXIF orientation among them, a grey one, and what the device
    path leaves to the workers: a PNG, a CMYK JPEG, a progressive one is still a JPEG."""
    root, rng = tmp_path_factory.mktemp("photos"), np.random.default_rng(0)
    photos = list(sample_photos(("astronaut", "chelsea", "coffee")).values())
    paths = []
    for i in range(16):
        image = photo_jpeg(photos[i % 3], 96, 72, rng)
        turn = i % 8 + 1 if i < 8 else None
        paths.append(write(root / f"{i}.jpg", image, turn, quality=90, progressive=i == 9))
    paths[10] = write(root / "grey.jpg", image.convert("L"), quality=90)
    paths[11] = write(root / "photo.png", image)
    paths[12] = write(root / "cmyk.jpg", image.convert("CMYK"), quality=90)
    return paths


def epoch(paths, train: bool, **augment) -> EpochBatches:
    overrides = [f"data.image_size={SIDE}", "data.augment.preset=imagenet"]
    overrides += [f"data.augment.{key}={value}" for key, value in augment.items()]
    source = CheckedSource(FileSource(list(paths), np.arange(len(paths)) % 4), BadFileLog("fail"))
    return EpochBatches(source, [np.arange(k, k + 8) for k in range(0, len(paths), 8)],
                        Preprocess(load(overrides=overrides).data, seed=3), epoch=1, train=train)


@pytest.mark.parametrize("train", [True, False])
def test_decoded_on_the_device_the_batch_is_the_cpu_paths(files, train):
    batches = epoch(files, train)
    assert device_decode.possible(batches)
    for k in range(len(batches)):
        expected, labels = batches.read(k, uint8=True)
        encoded, encoded_labels = device_decode.encode(batches, k)
        got = decode.decode(encoded, CPU).permute(0, 2, 3, 1).numpy()
        assert np.array_equal(labels, encoded_labels) and got.dtype == np.uint8
        difference = np.abs(got.astype(np.int16) - expected)
        # Pillow and torchvision's libjpeg decode alike; the resize is Pillow's coefficients in
        # float32, a level off where Pillow rounds its first pass along the other axis
        assert difference.max() <= 2 and difference.mean() < 0.3, (k, difference.max(), difference.mean())
        decoded_slots = encoded.decoded_slots
        assert np.array_equal(got[decoded_slots], expected[decoded_slots])  # the workers' own, as before
    names = [name for k in range(len(batches)) for name in device_decode.encode(batches, k)[0].names]
    assert not any(name.endswith(("photo.png", "cmyk.jpg")) for name in names)  # decoded in the workers
    assert any(name.endswith("grey.jpg") for name in names) and any(name.endswith("9.jpg") for name in names)


def test_a_truncated_jpeg_is_left_to_the_workers_and_the_bad_files_policy(files, tmp_path):
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(files[0].read_bytes()[:-200])
    assert device_decode.jpeg_header(cut.read_bytes()) is None
    batches = epoch([cut] + list(files[1:8]), train=True)
    with pytest.raises(UserError, match="cut.jpg"):
        device_decode.encode(batches, 0)


@pytest.mark.parametrize("turn", range(1, 9))
def test_upright_turns_as_pillow_does(turn):
    pixels = np.random.default_rng(turn).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    expected = np.asarray(image.transpose(UPRIGHT[turn]) if turn in UPRIGHT else image)
    got = decode.upright(torch.from_numpy(pixels).permute(2, 0, 1), turn).permute(1, 2, 0).numpy()
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("box, side", [((0, 0, 96, 72), 64), ((10, 5, 40, 30), 64), ((3, 0, 95, 70), 32)])
def test_resize_is_pillows(box, side):
    pixels = np.array(photo_jpeg(sample_photos(("coffee",))["coffee"], 96, 72, np.random.default_rng(1)))
    expected = np.asarray(Image.fromarray(pixels).resize((side, side), Image.Resampling.BILINEAR, box=box))
    got = decode.resize(torch.from_numpy(pixels).permute(2, 0, 1), list(box), side).permute(1, 2, 0).numpy()
    assert np.abs(got.astype(np.int16) - expected).max() <= 1


def test_the_backend_hands_over_encoded_batches_through_its_workers_and_normalises_them(files):
    batches = epoch(files, train=True)
    backend = object.__new__(TorchBackend)
    backend.device, backend.memory_format, backend.decode_on_device = CPU, torch.contiguous_format, True
    for k, (images, labels) in enumerate(backend.loader(batches, workers=2)):
        assert isinstance(images, device_decode.EncodedBatch)
        got = backend.to_device(images).permute(0, 2, 3, 1).numpy()
        expected, expected_labels = batches[k]
        assert np.array_equal(labels.numpy(), expected_labels)
        assert np.abs(got - expected).max() < 0.05  # 2 levels of 255 in normalised units
    assert not isinstance(next(iter(backend.loader(epoch(files, True, policy="randaugment"), 0)))[0],
                          device_decode.EncodedBatch)  # a policy runs on the workers' pixels


def test_decode_gpu_without_a_cuda_device_is_one_line_and_auto_is_the_workers_path():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    # what TorchBackend.setup resolves, with the device pick_device chose
    with pytest.raises(UserError, match=r"data.decode=gpu: torch sees no CUDA device") as raised:
        device_decode.resolve("gpu", "cpu", decode.unsupported())
    assert "\n" not in str(raised.value)
    assert device_decode.resolve("auto", "cpu", decode.unsupported()) is False


def test_an_image_made_in_memory_goes_through_the_workers():
    data = io.BytesIO()
    Image.new("RGB", (8, 8)).save(data, "JPEG")
    assert device_decode.jpeg_header(data.getvalue()) == ((8, 8), 1)
    assert device_decode.file_bytes(object(), 0) is None
