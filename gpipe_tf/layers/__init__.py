"""Layers: tf.Modules built from Params, each with a forward pass and a cost estimate."""

from gpipe_tf.layers.base_layer import BaseLayer
from gpipe_tf.layers.base_layer import LayerInputError
from gpipe_tf.layers.base_layer import LayerMeta
from gpipe_tf.layers.base_layer import ShapeMismatchError
from gpipe_tf.layers.conv import Conv2DLayer
from gpipe_tf.layers.conv import DepthwiseConv2DLayer
from gpipe_tf.layers.conv import GlobalPoolingLayer
from gpipe_tf.layers.conv import PoolingLayer
from gpipe_tf.layers.conv import SeparableConv2DLayer
from gpipe_tf.layers.core import Activation
from gpipe_tf.layers.core import ActivationLayer
from gpipe_tf.layers.core import BranchLayer
from gpipe_tf.layers.core import DropoutLayer
from gpipe_tf.layers.core import FCLayer
from gpipe_tf.layers.core import MergeLayer
from gpipe_tf.layers.core import SequentialLayer
from gpipe_tf.layers.embedding import EmbeddingLayer
from gpipe_tf.layers.keras_layer import KerasLayer
from gpipe_tf.layers.keras_ops import KerasInputs
from gpipe_tf.layers.keras_ops import KerasOpLayer
from gpipe_tf.layers.keras_ops import KerasOutputs
from gpipe_tf.layers.attention import MultiHeadAttention
from gpipe_tf.layers.normalization import BatchNormLayer
from gpipe_tf.layers.normalization import LayerNorm
from gpipe_tf.layers.transformer import TransformerDecoderLayer
from gpipe_tf.layers.transformer import TransformerEncoderLayer
from gpipe_tf.layers.transformer import TransformerFeedForwardLayer
from gpipe_tf.layers.losses import SoftmaxLayer
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import initializers
from gpipe_tf.layers import losses
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import skips

__all__ = ['Activation', 'ActivationLayer', 'BaseLayer', 'BatchNormLayer',
           'BranchLayer', 'Conv2DLayer', 'DepthwiseConv2DLayer',
           'DropoutLayer', 'EmbeddingLayer', 'FCLayer', 'GlobalPoolingLayer',
           'KerasLayer', 'LayerInputError', 'LayerMeta', 'LayerNorm',
           'MergeLayer', 'MultiHeadAttention', 'PoolingLayer',
           'SeparableConv2DLayer', 'SequentialLayer', 'ShapeMismatchError',
           'SoftmaxLayer', 'TransformerDecoderLayer', 'TransformerEncoderLayer',
           'TransformerFeedForwardLayer', 'aux_losses', 'initializers',
           'losses', 'random_seeds', 'skips']
