"""gpipe_tf: GPipe pipeline-parallel training for TensorFlow 2, in Lingvo's style.

Importing the package does not import TensorFlow; import the submodules you
need (``gpipe_tf.layers``, ``gpipe_tf.pipeline``, ``gpipe_tf.trainer``).
``gpipe_tf.Error`` is the base of every named error the library raises.
"""

from gpipe_tf.errors import Error

__all__ = ['Error']

__version__ = '0.2.0'
