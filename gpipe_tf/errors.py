"""The root of gpipe_tf's named errors: catch ``gpipe_tf.Error`` to catch any of them.

Every error the library raises on purpose (bad Params, a partition that does
not fit, a missing dataset, a checkpoint of another model, ...) derives from
``Error`` and from the built-in exception it is a kind of (``ValueError``,
``FileNotFoundError``, ...), so existing ``except ValueError`` code keeps
working. Its message says what is wrong and what to change; the trainer prints
it as one line and exits non-zero.

This module deliberately imports nothing: pure-Python modules (hyperparams,
partition, schedule) derive their errors from it without importing TensorFlow.
"""

__all__ = ['Error']


class Error(Exception):
  """Base class of every named gpipe_tf error."""
