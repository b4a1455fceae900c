"""The GPipe engine: partitioning, schedules, micro-batching and the PipeliningLayer.

The pure-Python parts (``partition``, ``schedule``) import without
TensorFlow; the names re-exported here load their modules on first use, so
``import gpipe_tf.pipeline.partition`` stays TensorFlow-free.
"""

import importlib

_LAZY = {
    'FromKeras': 'gpipe_tf.pipeline.keras_import',
    'KerasModelError': 'gpipe_tf.pipeline.keras_import',
    'LoadKerasWeights': 'gpipe_tf.pipeline.keras_import',
    'MicroBatchError': 'gpipe_tf.pipeline.microbatch',
    'PartitionError': 'gpipe_tf.pipeline.partition',
    'PipeliningLayer': 'gpipe_tf.pipeline.pipelining_layer',
    'REMAT_POLICIES': 'gpipe_tf.pipeline.pipelining_layer',
}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
