"""tools/docker_image.py's pure parts: which pins the image installs, and what invalidates it."""
import time
import zipfile

import docker_image


def write_wheel(path, files, date_time):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=date_time), data)


def test_pins_drop_comments_and_blank_lines(tmp_path):
    (tmp_path / "a.txt").write_text("# header\nnumpy>=1.26,<2.1   # why\n\ntorch==2.14.1\n")
    (tmp_path / "b.txt").write_text("pillow>=10\n")
    assert docker_image.pins([tmp_path / "a.txt", tmp_path / "b.txt"]) == \
        ["numpy>=1.26,<2.1", "torch==2.14.1", "pillow>=10"]


def test_gpu_images_take_the_gpu_tensorflow():
    assert [f.name for f in docker_image.requirement_files(True)] == \
        ["core.txt", "torch.txt", "tensorflow-gpu.txt"]
    assert [f.name for f in docker_image.requirement_files(False)][-1] == "tensorflow.txt"


def test_a_rebuilt_wheel_with_the_same_contents_keeps_the_image(tmp_path):
    files = {"hvdcls/__init__.py": b"x = 1\n"}
    write_wheel(tmp_path / "old.whl", files, (2026, 1, 1, 0, 0, 0))
    write_wheel(tmp_path / "new.whl", files, time.localtime()[:6])
    assert (tmp_path / "old.whl").read_bytes() != (tmp_path / "new.whl").read_bytes()
    assert docker_image.wheel_contents_digest(tmp_path / "old.whl") == \
        docker_image.wheel_contents_digest(tmp_path / "new.whl")


def test_changed_code_changes_the_image(tmp_path):
    write_wheel(tmp_path / "a.whl", {"hvdcls/__init__.py": b"x = 1\n"}, (2026, 1, 1, 0, 0, 0))
    write_wheel(tmp_path / "b.whl", {"hvdcls/__init__.py": b"x = 2\n"}, (2026, 1, 1, 0, 0, 0))
    assert docker_image.wheel_contents_digest(tmp_path / "a.whl") != \
        docker_image.wheel_contents_digest(tmp_path / "b.whl")


def test_the_wheelhouse_stamp_follows_the_requirements(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("torch==2.14.1\n")
    before = docker_image.stamp_of([req], ["horovod.whl"])
    assert docker_image.stamp_of([req], ["horovod.whl"]) == before
    assert docker_image.stamp_of([req], ["other-horovod.whl"]) != before
    req.write_text("torch==2.14.2\n")
    assert docker_image.stamp_of([req], ["horovod.whl"]) != before
