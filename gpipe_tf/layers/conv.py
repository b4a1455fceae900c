"""Convolutions (plain, depthwise, separable) and pooling on NHWC images.

Every layer here takes one image batch ``[batch, height, width, channels]``
and returns one. Output spatial sizes follow TensorFlow's rules::

  SAME : out = ceil(in / stride)
  VALID: out = ceil((in - ((window - 1) * dilation + 1) + 1) / stride)

These layers deliberately do NOT carry sequence paddings or any other extra
tensor: an image model is a plain chain of one-input, one-output layers.
"""

from __future__ import annotations

import math
from typing import Sequence

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import initializers

__all__ = ['Conv2DLayer', 'DepthwiseConv2DLayer', 'GlobalPoolingLayer',
           'PoolingLayer', 'SeparableConv2DLayer']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape

_PADDINGS = ('SAME', 'VALID')


def _OutSize(size: int | None, window: int, stride: int, dilation: int,
             padding: str) -> int | None:
  """One output spatial size (None stays None)."""
  if size is None:
    return None
  if padding == 'SAME':
    return -(-int(size) // stride)
  effective = (window - 1) * dilation + 1
  return max(0, -(-(int(size) - effective + 1) // stride))


def _ActivationFlops(activation: str, num_elements: int) -> int:
  p = core.ActivationLayer.Params().Set(activation=activation)
  return core.ActivationLayer.FPropMeta(p, (num_elements,)).flops


def _CheckInts(owner: str, what: str, values: Sequence[int], n: int,
               minimum: int = 1) -> None:
  if (not isinstance(values, (tuple, list)) or len(values) != n or
      any(not isinstance(v, int) or v < minimum for v in values)):
    raise base_layer.LayerConfigError(
        f'{owner}: {what} must be {n} integers >= {minimum}, got '
        f'{values!r}.')


def _CheckPadding(owner: str, padding: str) -> None:
  if padding not in _PADDINGS:
    raise base_layer.LayerConfigError(
        f'{owner}: padding must be one of {_PADDINGS}, got '
        f'{padding!r}.')


def _CheckImage(name: str, cls_name: str, shape: Sequence[int | None] | None
                ) -> None:
  """Raises LayerInputError unless `shape` is rank 4 (NHWC)."""
  if shape is None or len(shape) != 4:
    raise base_layer.LayerInputError(
        f"layer '{name}' ({cls_name}) expects an NHWC image batch of rank 4 "
        f'but got shape {None if shape is None else list(shape)}')


def _ShapeList(x: tf.Tensor) -> list | None:
  return x.shape.as_list() if x.shape.rank is not None else None


class _ConvBase(base_layer.BaseLayer):
  """Shared Params, validation and shape arithmetic of the convolutions.

  Subclasses define ``_FILTER_DOC``, create variables in ``__init__`` and
  implement ``_Convolve``, ``_OutChannels`` and ``_MacsPerPosition``.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  _FILTER_DOC = ''

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('filter_shape', (0, 0, 0, 0), cls._FILTER_DOC)
    p.Define('filter_stride', (1, 1), 'Stride (height, width).')
    p.Define('padding', 'SAME', "'SAME' or 'VALID'.")
    p.Define('dilation_rate', (1, 1),
             'Dilation (height, width); > 1 needs filter_stride (1, 1).')
    p.Define('activation', 'NONE', 'Activation applied to the output.')
    p.Define('has_bias', False, 'Whether to add a bias per output channel.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    self._Validate(self.p, f"{type(self).__name__} '{self.path}'")
    self._fn = core.Activation(self.p.activation)

  @classmethod
  def _Validate(cls, p: hyperparams.Params, owner: str) -> None:
    _CheckInts(owner, 'filter_shape', p.filter_shape, 4)
    _CheckInts(owner, 'filter_stride', p.filter_stride, 2)
    _CheckInts(owner, 'dilation_rate', p.dilation_rate, 2)
    _CheckPadding(owner, p.padding)
    core.Activation(p.activation)
    if max(p.dilation_rate) > 1 and max(p.filter_stride) > 1:
      raise base_layer.LayerConfigError(
          f'{owner}: dilation_rate {p.dilation_rate} > 1 needs '
          f'filter_stride (1, 1), got {p.filter_stride}.')

  @classmethod
  def _OutChannels(cls, p: hyperparams.Params) -> int:
    raise NotImplementedError

  @classmethod
  def _MacsPerPosition(cls, p: hyperparams.Params) -> int:
    """Multiply-adds per output spatial position (all output channels).

    One filter tensor applied once per position (Conv2D, depthwise): every
    weight is one multiply-add.
    """
    return math.prod(p.filter_shape)

  def _Convolve(self, x: tf.Tensor) -> tf.Tensor:
    raise NotImplementedError

  def FProp(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
    """[B, H, W, filter_shape[2]] -> [B, H', W', out channels]."""
    _CheckImage(self.path, type(self).__name__, _ShapeList(x))
    self.CheckLastDim(x, self.p.filter_shape[2], 'input channels')
    y = self._Convolve(x)
    if self.p.has_bias:
      y += self.b
    return self._fn(y)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape) -> LayerMeta:
    cls._Validate(p, f"{cls.__name__} '{p.name}'")
    _CheckImage(p.name, cls.__name__, shape)
    base_layer.CheckMetaLastDim(p, shape, p.filter_shape[2])
    batch, height, width, _ = shape
    out_h, out_w = (
        _OutSize(s, k, st, d, p.padding) for s, k, st, d in zip(
            (height, width), p.filter_shape[:2], p.filter_stride,
            p.dilation_rate))
    channels = cls._OutChannels(p)
    out = (batch, out_h, out_w, channels)
    positions = base_layer.NumElements(out[:3])
    flops = 2 * positions * cls._MacsPerPosition(p)
    flops += positions * channels * int(p.has_bias)
    flops += _ActivationFlops(p.activation, positions * channels)
    num_params = cls._NumWeights(p) + channels * int(p.has_bias)
    return LayerMeta(flops, (out,), num_params)

  @classmethod
  def _NumWeights(cls, p: hyperparams.Params) -> int:
    """Weights besides the bias: one filter tensor of filter_shape."""
    return math.prod(p.filter_shape)

  def _CreateBias(self) -> None:
    if self.p.has_bias:
      self.CreateVariable('b', [self._OutChannels(self.p)],
                          init=initializers.Constant(0.0))

  def _Strides(self) -> list[int]:
    return [1, *self.p.filter_stride, 1]


class Conv2DLayer(_ConvBase):
  """2-D convolution: activation(conv2d(x, w) + b), NHWC.

  Variables: ``w`` [h, w, in, out] and, with has_bias, ``b`` [out].
  """

  _FILTER_DOC = '(height, width, in_channels, out_channels).'

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    self.CreateVariable('w', list(self.p.filter_shape))
    self._CreateBias()

  @classmethod
  def _OutChannels(cls, p):
    return p.filter_shape[3]

  def _Convolve(self, x):
    return tf.nn.conv2d(x, self.w, strides=self._Strides(),
                        padding=self.p.padding,
                        dilations=[1, *self.p.dilation_rate, 1])


class DepthwiseConv2DLayer(_ConvBase):
  """Depthwise 2-D convolution: each input channel has its own filters.

  Output channels are in_channels * channel_multiplier. Variables: ``w``
  [h, w, in, multiplier] and, with has_bias, ``b`` [in * multiplier].
  TensorFlow needs equal height and width strides here.
  """

  _FILTER_DOC = '(height, width, in_channels, channel_multiplier).'

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    self.CreateVariable('w', list(self.p.filter_shape))
    self._CreateBias()

  @classmethod
  def _Validate(cls, p, owner):
    super()._Validate(p, owner)
    if p.filter_stride[0] != p.filter_stride[1]:
      raise base_layer.LayerConfigError(
          f'{owner}: depthwise convolutions need equal strides, '
          f'got filter_stride {p.filter_stride}.')

  @classmethod
  def _OutChannels(cls, p):
    return p.filter_shape[2] * p.filter_shape[3]

  def _Convolve(self, x):
    return tf.nn.depthwise_conv2d(x, self.w, strides=self._Strides(),
                                  padding=self.p.padding,
                                  dilations=list(self.p.dilation_rate))


class SeparableConv2DLayer(_ConvBase):
  """Depthwise convolution followed by a 1x1 pointwise convolution, one layer.

  Variables: ``depthwise_w`` [h, w, in, channel_multiplier], ``pointwise_w``
  [1, 1, in * channel_multiplier, out] and, with has_bias, ``b`` [out]. No
  activation or bias sits between the two convolutions.
  """

  _FILTER_DOC = ('(height, width, in_channels, out_channels); the depthwise '
                 'filter is (height, width, in_channels, channel_multiplier).')

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('channel_multiplier', 1,
             'Depthwise outputs per input channel, before the pointwise conv.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    h, w, cin, cout = self.p.filter_shape
    mult = self.p.channel_multiplier
    self.CreateVariable('depthwise_w', [h, w, cin, mult])
    self.CreateVariable('pointwise_w', [1, 1, cin * mult, cout])
    self._CreateBias()

  @classmethod
  def _Validate(cls, p, owner):
    super()._Validate(p, owner)
    _CheckInts(owner, 'channel_multiplier', (p.channel_multiplier,), 1)
    if p.filter_stride[0] != p.filter_stride[1]:
      raise base_layer.LayerConfigError(
          f'{owner}: separable convolutions need equal strides, '
          f'got filter_stride {p.filter_stride}.')

  @classmethod
  def _OutChannels(cls, p):
    return p.filter_shape[3]

  @classmethod
  def _MacsPerPosition(cls, p):
    h, w, cin, cout = p.filter_shape
    mult = p.channel_multiplier
    return h * w * cin * mult + cin * mult * cout

  @classmethod
  def _NumWeights(cls, p):
    return cls._MacsPerPosition(p)

  def _Convolve(self, x):
    return tf.nn.separable_conv2d(x, self.depthwise_w, self.pointwise_w,
                                  strides=self._Strides(),
                                  padding=self.p.padding,
                                  dilations=list(self.p.dilation_rate))


_POOLING_TYPES = ('MAX', 'AVG')


def _CheckPoolingType(owner: str, pooling_type: str) -> None:
  if pooling_type not in _POOLING_TYPES:
    raise base_layer.LayerConfigError(
        f'{owner}: pooling_type must be one of {_POOLING_TYPES}, '
        f'got {pooling_type!r}.')


class PoolingLayer(base_layer.BaseLayer):
  """Max or average pooling over height and width, NHWC.

  With SAME padding, average pooling divides by the number of positions
  inside the image (padding is not counted). No variables.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('pooling_type', 'MAX', "'MAX' or 'AVG'.")
    p.Define('window_shape', (2, 2), 'Window (height, width).')
    p.Define('window_stride', (2, 2), 'Stride (height, width).')
    p.Define('padding', 'SAME', "'SAME' or 'VALID'.")
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    self._Validate(self.p, f"PoolingLayer '{self.path}'")

  @classmethod
  def _Validate(cls, p: hyperparams.Params, owner: str) -> None:
    _CheckPoolingType(owner, p.pooling_type)
    _CheckInts(owner, 'window_shape', p.window_shape, 2)
    _CheckInts(owner, 'window_stride', p.window_stride, 2)
    _CheckPadding(owner, p.padding)

  def FProp(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
    """[B, H, W, C] -> [B, H', W', C]."""
    _CheckImage(self.path, type(self).__name__, _ShapeList(x))
    p = self.p
    return tf.nn.pool(x, window_shape=list(p.window_shape),
                      pooling_type=p.pooling_type,
                      strides=list(p.window_stride), padding=p.padding)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape) -> LayerMeta:
    cls._Validate(p, f"PoolingLayer '{p.name}'")
    _CheckImage(p.name, cls.__name__, shape)
    batch, height, width, channels = shape
    out_h, out_w = (_OutSize(s, k, st, 1, p.padding) for s, k, st in zip(
        (height, width), p.window_shape, p.window_stride))
    out = (batch, out_h, out_w, channels)
    flops = base_layer.NumElements(out) * math.prod(p.window_shape)
    return LayerMeta(flops, (out,), 0)


class GlobalPoolingLayer(base_layer.BaseLayer):
  """Average or max over height and width: [B, H, W, C] -> [B, C].

  No variables.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('pooling_type', 'AVG', "'AVG' or 'MAX'.")
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    _CheckPoolingType(f"GlobalPoolingLayer '{self.path}'",
                      self.p.pooling_type)

  def FProp(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
    """[B, H, W, C] -> [B, C]."""
    _CheckImage(self.path, type(self).__name__, _ShapeList(x))
    if self.p.pooling_type == 'AVG':
      return tf.reduce_mean(x, axis=[1, 2])
    return tf.reduce_max(x, axis=[1, 2])

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape) -> LayerMeta:
    _CheckPoolingType(f"GlobalPoolingLayer '{p.name}'", p.pooling_type)
    _CheckImage(p.name, cls.__name__, shape)
    return LayerMeta(base_layer.NumElements(shape),
                     ((shape[0], shape[3]),), 0)
