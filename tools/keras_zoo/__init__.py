"""The Keras model zoo: keras.applications and keras_hub models converted with FromKeras, pipelined, and checked against Keras's own gradients.

* ``python -m tools.keras_zoo`` (``main``): builds, converts and checks the
  models, and writes the zoo's tables;
* ``hub``: the keras_hub backbones and task models from tiny configs;
* ``table``: the rows, their verdict against the float64 truth, the CSV
  file and the Markdown tables.
"""

__all__ = []
