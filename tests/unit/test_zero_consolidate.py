"""training.zero=3's checkpoint read whole without a framework (hvdcls.maths.zero_consolidate) and
the .safetensors file written a tensor at a time (hvdcls.files.safetensors_file)."""
import numpy as np
import pytest

from hvdcls.errors import UserError
from hvdcls.files import safetensors_file
from hvdcls.maths.zero import blocks
from hvdcls.maths.zero_consolidate import assemble, read_index

# uneven sizes: blocks whose element counts no world divides, a parameter of one element,
# one larger than a rank's slice (it spans ranks), an empty one
NAMES = ["stem.weight", "stem.bias", "layer1.0.weight", "layer1.0.scale", "layer1.1.weight", "layer1.1.empty",
         "head.weight", "head.bias"]
SHAPES = [(3, 5), (5,), (7, 3), (1,), (2, 2, 3), (0,), (4, 3), (3,)]
SEGMENTS = ["stem", "layer1", "head"]


def saved(world: int, seed: int = 0):
    """The index and every rank's slices (padding 0) of a model's parameters, as a zero=3 run saves them."""
    rng = np.random.default_rng(seed)
    values = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(NAMES, SHAPES)}
    cut = blocks(NAMES, SHAPES, world, SEGMENTS)
    slices = {r: [] for r in range(world)}
    for block in cut:
        flat = np.zeros(block.bucket.padded, np.float32)
        for name, offset, size in zip(block.names, block.bucket.offsets, block.bucket.sizes):
            flat[offset:offset + size] = values[name].reshape(-1)
        for r in range(world):
            lo, hi = block.bucket.slice(r)
            slices[r].append(flat[lo:hi].copy())
    return {"world": world, "blocks": [b.index() for b in cut]}, slices, values


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_parameter_is_assembled_from_the_slices_of_any_world_size(world):
    index, slices, values = saved(world)
    sharded = read_index(index, "torch.pt")
    assert sharded.world == world and [p.name for p in sharded.params] == NAMES
    reads = []

    def read(rank, block, start, end):
        reads.append((rank, block, start, end))
        return slices[rank][block][start:end]

    for param in sharded.params:
        whole = assemble(param, np.full(param.size, np.nan, np.float32), read).reshape(param.shape)
        np.testing.assert_array_equal(whole, values[param.name])
    # only the parts that hold parameters are read, never padding, each element once
    assert sum(end - start for _, _, start, end in reads) == sum(v.size for v in values.values())
    for rank, block, start, end in reads:
        assert 0 <= start < end <= len(slices[rank][block])


def test_a_parameter_spans_the_ranks_that_hold_it():
    index, _, _ = saved(3)
    layer = next(p for p in read_index(index, "x").params if p.name == "layer1.0.weight")
    # layer1's block: 21 + 1 + 12 + 0 = 34 elements, 12 a rank (2 of padding at the end)
    assert [(p.rank, p.start, p.end, p.at) for p in layer.pieces()] == [(0, 0, 12, 0), (1, 0, 9, 12)]


@pytest.mark.parametrize("broken", [
    {"world": 2},
    {"world": 0, "blocks": []},
    {"world": 2, "blocks": [{"names": ["a", "b"], "shapes": [[2], [3]], "offsets": [0, 3]}]},
    {"world": 2, "blocks": [{"names": ["a"], "shapes": [[2]], "offsets": [1]}]},
    "not an index",
])
def test_an_unreadable_index_is_one_line(broken):
    with pytest.raises(UserError, match=r"^torch.pt: its training.zero=3 index is unreadable") as err:
        read_index(broken, "torch.pt")
    assert "\n" not in str(err.value)


def test_safetensors_written_a_tensor_at_a_time_read_by_safetensors(tmp_path):
    from safetensors.numpy import load_file

    arrays = {"b.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "a.count": np.array(7, np.int64),
              "c.mask": np.array([True, False, True]), "d.empty": np.zeros((0, 2), np.float32)}
    entries = [safetensors_file.Entry(n, str(a.dtype), a.shape) for n, a in arrays.items()]
    made = []

    def data(entry):
        made.append(entry.name)  # asked for in order, one at a time
        return [np.ascontiguousarray(arrays[entry.name]).tobytes()]

    path = tmp_path / "m.safetensors"
    safetensors_file.write(path, entries, data, {"format": "pt"})
    assert made == list(arrays)
    loaded = load_file(str(path))
    assert set(loaded) == set(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value)
    assert (int.from_bytes(path.read_bytes()[:8], "little")) % 8 == 0


def test_safetensors_short_data_leaves_nothing(tmp_path):
    path = tmp_path / "m.safetensors"
    entry = safetensors_file.Entry("w", "float32", (4,))
    with pytest.raises(ValueError, match="12 bytes written, 16 expected"):
        safetensors_file.write(path, [entry], lambda e: [bytes(12)])
    assert list(tmp_path.iterdir()) == []
