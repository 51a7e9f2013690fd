"""hvdcls.files.fileio: outputs written whole."""


def test_savez_one_at_a_time_writes_what_np_load_reads_making_one_array_at_a_time(tmp_path):
    """A checkpoint's arrays given as functions are made one at a time: when the next is made,
    the previous is already written and dropped (ViT-H/14's variables, 2.5 GB, held at once
    killed a run); np.load reads the file as one np.savez wrote."""
    import weakref

    import numpy as np

    from hvdcls.files import fileio

    made: list = []

    def maker(value):
        def make():
            assert all(ref() is None for ref in made), "an earlier array is still alive"
            array = np.full((3, 2), value, np.float32)
            made.append(weakref.ref(array))
            return array
        return make

    arrays = {"model/0": maker(1.5), "model/1": maker(-2.0), "size": np.array(2),
              "half": np.arange(5, dtype=np.float16), "numels": np.array([7, 9], np.int64)}
    with fileio.large_output(tmp_path / "c.npz") as handle:
        fileio.savez_one_at_a_time(handle, arrays)
    with np.load(tmp_path / "c.npz") as stored:
        assert sorted(stored.files) == sorted(arrays)
        assert np.array_equal(stored["model/1"], np.full((3, 2), -2.0, np.float32))
        assert stored["size"].shape == () and int(stored["size"]) == 2
        assert stored["half"].dtype == np.float16 and stored["numels"].tolist() == [7, 9]
    assert len(made) == 2


def test_large_output_syncs_and_drops_the_cache_every_so_many_bytes_and_at_the_end(tmp_path, monkeypatch):
    """A checkpoint-sized file is fsynced and dropped from the page cache as it grows (a memory
    cgroup is charged for its dirty pages) and is on disk when the block ends; the bytes are
    the ones written, whatever the sizes of the writes."""
    import os

    from hvdcls.files import fileio

    calls: list = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", os.fstat(fd).st_size)), real_fsync(fd)))
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: calls.append(
        ("drop", advice == os.POSIX_FADV_DONTNEED and (offset, length) == (0, 0))), raising=False)
    chunks = [bytes([i]) * n for i, n in enumerate([3000, 1 << 20, 5, 2 << 20, 700])]
    with fileio.large_output(tmp_path / "big.bin", every=1 << 20) as handle:
        for chunk in chunks:
            handle.write(chunk)
    assert (tmp_path / "big.bin").read_bytes() == b"".join(chunks)
    syncs = [size for kind, size in calls if kind == "fsync"]
    assert syncs[-1] == sum(map(len, chunks))  # the last: everything
    assert len(syncs) >= 3 and all(a < b for a, b in zip(syncs, syncs[1:]))
    assert all(b - a <= (1 << 20) + (2 << 20) for a, b in zip([0, *syncs], syncs))
    assert [kind for kind, _ in calls] == ["fsync", "drop"] * len(syncs)
    assert all(ok for kind, ok in calls if kind == "drop")
