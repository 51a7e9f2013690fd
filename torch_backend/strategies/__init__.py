"""The reduction strategies of the PyTorch backend (hvdcls.strategy's interface and registry).

Mirror: tf_backend/strategies/. One module per mode, the same names: plain (adasum beside it),
powersgd, zero. A strategy is built with its host, the backend, and asks of it only: `device`,
`wait_asleep` (horovod.wait), `scaler` (GradScaler), `waiting_for_allreduce()` (the watchdog's
mark) and `unscale_and_clip()` (once the gradients are exchanged).
"""
