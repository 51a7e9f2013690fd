"""The reduction strategies of the PyTorch backend (hvdcls.strategy's interface and registry).

Mirror: tf_backend/strategies/. One module per mode, the same names: plain (adasum beside it),
powersgd, zero.
"""
