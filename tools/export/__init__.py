"""Tools that take a trained model out of training: a SavedModel for serving, and Keras's model.fit over a pipeline.

* ``python -m tools.export`` (``main``): a trained experiment's newest
  checkpoint as a TensorFlow SavedModel (``main.ExportLayer`` for a layer
  trained elsewhere, docs/keras.md);
* ``python -m tools.export.fit_digits``: AmoebaNet on the bundled digits
  trained with Keras's ``model.fit`` over a pipeline.
"""

__all__ = []
