"""Layers: tf.Modules built from Params, each with a forward pass and a cost estimate."""

from gpipe_tf.layers.base_layer import BaseLayer
from gpipe_tf.layers.base_layer import InRecompute
from gpipe_tf.layers.base_layer import LayerInputError
from gpipe_tf.layers.base_layer import LayerMeta
from gpipe_tf.layers.base_layer import RecomputeScope
from gpipe_tf.layers.base_layer import ShapeMismatchError
from gpipe_tf.layers.core import Activation
from gpipe_tf.layers.core import ActivationLayer
from gpipe_tf.layers.core import DropoutLayer
from gpipe_tf.layers.core import FCLayer
from gpipe_tf.layers.core import SequentialLayer
from gpipe_tf.layers import initializers
from gpipe_tf.layers import random_seeds
