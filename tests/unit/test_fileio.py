"""hvdcls.fileio: outputs written whole."""


def test_savez_one_at_a_time_writes_what_np_load_reads_making_one_array_at_a_time(tmp_path):
    """A checkpoint's arrays given as functions are made one at a time: when the next is made,
    the previous is already written and dropped (ViT-H/14's variables, 2.5 GB, held at once
    killed a run); np.load reads the file as one np.savez wrote."""
    import weakref

    import numpy as np

    from hvdcls import fileio

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
    with open(tmp_path / "c.npz", "wb") as handle:
        fileio.savez_one_at_a_time(handle, arrays)
    with np.load(tmp_path / "c.npz") as stored:
        assert sorted(stored.files) == sorted(arrays)
        assert np.array_equal(stored["model/1"], np.full((3, 2), -2.0, np.float32))
        assert stored["size"].shape == () and int(stored["size"]) == 2
        assert stored["half"].dtype == np.float16 and stored["numels"].tolist() == [7, 9]
    assert len(made) == 2
