"""The TensorFlow backend (hvdcls.registry imports tf_backend.backend by name).

TensorFlow is imported here, first, without what Keras imports only when it is installed:
scikit-learn (for its scikit-learn wrappers), pandas (DataFrame inputs to `fit`) and
matplotlib's pyplot (its image gallery), none of which hvdcls uses through Keras. They are
a large share of every TensorFlow rank's start (docs/testing.md#measured has the figures).
Keras takes their absence as it takes an installation without them, and a later import of any
of them (the digits' first load, a plot) works as usual. They are hidden process-wide while
TensorFlow loads: the backend is imported from the main thread, before any loader thread.
"""
import sys

KERAS_EXTRAS = ("sklearn", "pandas", "matplotlib")


def _import_tensorflow_without_keras_extras() -> None:
    hidden = [name for name in KERAS_EXTRAS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError, as Keras expects
    try:
        import tensorflow  # noqa: F401
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


_import_tensorflow_without_keras_extras()
