"""The framework's side of test_finetune.py, run as its own process (the test's process imports
no framework):

    python -m tests.parallel.finetune_weights write BACKEND CLASSES FILE
        compact_cnn's initial weights (16 px, CLASSES classes) as the backend's weights file
        (.pth or .weights.h5, whatever FILE says), for model.weights=FILE
    python -m tests.parallel.finetune_weights compare BACKEND CLASSES FILE CHECKPOINT...
        prints JSON: {"head": [is the head's, per trained parameter in the model's order],
        CHECKPOINT: [equals FILE's, per trained parameter], ...}
"""
import json
import sys

import numpy as np

SIZE = 16


def torch_parameters(classes: int, file: str, checkpoints: list[str]) -> tuple[list, dict]:
    import torch

    from torch_backend import finetune, models

    model = models.build_model("compact_cnn", classes, SIZE)
    names = [name for name, _ in model.named_parameters()]
    start = torch.load(file, weights_only=True)
    equal = {}
    for path in checkpoints:
        stored = torch.load(f"{path}/torch.pt", weights_only=True)["model"]
        equal[path] = [bool(torch.equal(stored[name], start[name])) for name in names]
    return finetune.head_flags(model), equal


def tensorflow_parameters(classes: int, file: str, checkpoints: list[str]) -> tuple[list, dict]:
    from tf_backend import finetune, models

    model = models.build_model("compact_cnn", classes, SIZE)
    model.load_weights(file)
    trained = {v.path for v in model.trainable_variables}
    places = [i for i, v in enumerate(model.variables) if v.path in trained]  # the checkpoint's order
    equal = {}
    for path in checkpoints:
        with np.load(f"{path}/tensorflow.npz") as stored:
            equal[path] = [bool(np.array_equal(stored[f"model/{i}"], model.variables[i].numpy())) for i in places]
    return finetune.head_flags(model), equal


def write(backend: str, classes: int, file: str) -> None:
    if backend == "torch":
        import torch

        from torch_backend import models

        torch.manual_seed(11)
        torch.save(models.build_model("compact_cnn", classes, SIZE).state_dict(), file)
    else:
        import keras

        from tf_backend import models

        keras.utils.set_random_seed(11)
        models.build_model("compact_cnn", classes, SIZE).save_weights(file)


if __name__ == "__main__":
    command, backend, count, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if command == "write":
        write(backend, count, path)
    else:
        read = torch_parameters if backend == "torch" else tensorflow_parameters
        heads, equal = read(count, path, sys.argv[5:])
        print(json.dumps({"head": heads, **equal}))
