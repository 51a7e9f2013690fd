"""hvdcls: one training interface over Horovod, with PyTorch and TensorFlow backends.

This package is framework-free: it never imports torch, tensorflow or a Horovod binding at
module level. Backends live in the sibling packages `torch_backend` and `tf_backend` and are
loaded by name through `hvdcls.registry`.
"""

__version__ = "0.1.0"
