"""Using a trained model: `hvdcls evaluate`, `hvdcls export` and `hvdcls predict` (docs/models.md).

    run.py        a run directory or checkpoint as a model card, a config and the weights to use
    contract.py   InferenceModel: what a backend's `inference.py` gives the commands here
    evaluate.py   `hvdcls evaluate RUN_DIR [--data PATH]`
    export.py     `hvdcls export RUN_DIR --format F -o PATH`
    predict.py    `hvdcls predict MODEL IMAGES...` (a run, a checkpoint or an ONNX file)
    images.py     the card's preprocessing, image files found and read in worker processes
    onnx_model.py an ONNX export as an InferenceModel, from its metadata alone

The metrics and their files are hvdcls.observe.classification's (training writes them too).
Single-process commands: nothing here starts Horovod.
"""
