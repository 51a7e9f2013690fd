"""parallel.tensor for the TensorFlow backend: not built. Mirror: torch_backend/tensor_parallel.py.

hvdcls.config.checks refuses `parallel.tensor>1` with `--backend tensorflow` in one line, before
any rank trains (docs/parallelism.md). What it would take here: tf_backend/vit.py's encoder block
split as torch's (the attention's heads and the MLP's units over the tensor group), Megatron's f
and g as tf.custom_gradient functions over a Horovod process set, and the plain strategy's
gradients averaged over the data-parallel set (horovod.tensorflow takes process_set= too).
"""
