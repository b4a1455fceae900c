"""Transformer blocks: pre-layer-norm residual feed-forward, encoder, decoder.

Sequence layers carry their paddings ([B, T] float, 1.0 = padded) along as
extra outputs, so a pipeline of them passes tuples from layer to layer::

  TransformerEncoderLayer:  (x, paddings, *rest)  -> (x, paddings, *rest)
  TransformerDecoderLayer:  (y, y_paddings, enc_out, enc_paddings)
                              -> (y, y_paddings, enc_out, enc_paddings)
                            or, with has_cross_attention=False,
                            (y, y_paddings) -> (y, y_paddings)

Outputs at padded positions are computed but meaningless; padded positions
never influence the outputs at unpadded ones. A pre-layer-norm stack needs a
final LayerNorm after its last block.

Deep stacks: ``ffn_init_scale_by_num_layers = L`` (0 = off) divides the
initialisation scale of each feed-forward output projection by sqrt(L). Each
block adds its feed-forward output to the residual stream; with the scale
divided by sqrt(L) each addition has 1/L of the variance, so the stream's
variance after L blocks stays O(1) instead of growing with L. The GPipe paper
stabilised its deep (up to 128-layer) Transformers by scaling down the
feed-forward initialisation with the number of layers, together with logit
clipping (losses.SoftmaxCrossEntropy's logits_clip).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import attention
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import initializers
from gpipe_tf.layers import normalization

__all__ = ['TransformerDecoderLayer', 'TransformerEncoderLayer',
           'TransformerFeedForwardLayer']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape


def _Inherit(parent: hyperparams.Params, child: hyperparams.InstantiableParams
             ) -> hyperparams.InstantiableParams:
  """Gives `child` the parent's dtype, params_init and random_seed."""
  return child.Set(dtype=parent.dtype, params_init=parent.params_init.Copy(),
                   random_seed=parent.random_seed)


def _Named(children: dict) -> dict:
  """Names each child Params by its key, as CreateChild will (for messages)."""
  for name, child in children.items():
    child.name = name
  return children


def _Meta(p: hyperparams.Params, *shapes: Shape) -> LayerMeta:
  """A child's FPropMeta; dropout that keeps everything costs nothing."""
  if p.cls is core.DropoutLayer and p.keep_prob >= 1.0:
    return LayerMeta(0, (tuple(shapes[0]),), 0)
  return p.cls.FPropMeta(p, *shapes)


def _CheckProb(owner: str, name: str, value: float) -> None:
  if not 0.0 <= value < 1.0:
    raise base_layer.LayerConfigError(
        f'{owner}: {name} must be in [0, 1), got {value}.')


def _CheckSequenceAndPaddings(layer: base_layer.BaseLayer, x: tf.Tensor,
                              paddings: Any, dim: int, what: str) -> None:
  """Raises LayerInputError unless x is [B, T, dim] and paddings [B, T]."""
  if (x.shape.rank != 3 or paddings is None or
      tf.convert_to_tensor(paddings).shape.rank != 2):
    raise base_layer.LayerInputError(
        f"layer '{layer.path}' ({type(layer).__name__}) expects {what} of "
        f'shape [batch, time, {dim}] and its paddings [batch, time], got '
        f'{x.shape} and {None if paddings is None else paddings.shape}')
  layer.CheckLastDim(x, dim, what)


class TransformerFeedForwardLayer(base_layer.BaseLayer):
  """Position-wise feed-forward block with a residual connection.

  pre_layer_norm=True:  y = x + drop(fc2(drop(act(fc1(ln(x))))))
  pre_layer_norm=False: y = ln(x + drop(fc2(drop(act(fc1(x))))))

  Children ``ln`` (LayerNorm), ``fc1`` (input_dim -> hidden_dim, activation),
  ``relu_dropout``, ``fc2`` (hidden_dim -> input_dim) and
  ``residual_dropout``. FProp(x, *passthrough) returns any further inputs
  unchanged after y.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the input and output features.')
    p.Define('hidden_dim', 0, 'Size of the hidden layer.')
    p.Define('activation', 'RELU', 'Activation of the hidden layer.')
    p.Define('residual_dropout_prob', 0.0,
             'Dropout probability on the block output, before the residual.')
    p.Define('relu_dropout_prob', 0.0,
             'Dropout probability on the hidden activations.')
    p.Define('pre_layer_norm', True,
             'Normalise the block input (True) or the residual sum (False).')
    p.Define('ffn_init_scale_by_num_layers', 0,
             'If > 0, fc2 init scale is divided by sqrt of this (the number '
             'of layers of the stack); 0 = off.')
    return p

  @classmethod
  def _ChildrenParams(cls, p: hyperparams.Params, owner: str) -> dict:
    if p.input_dim <= 0 or p.hidden_dim <= 0:
      raise base_layer.LayerConfigError(
          f'{owner} needs positive input_dim and hidden_dim, got '
          f'{p.input_dim} and {p.hidden_dim}.')
    _CheckProb(owner, 'residual_dropout_prob', p.residual_dropout_prob)
    _CheckProb(owner, 'relu_dropout_prob', p.relu_dropout_prob)
    if p.ffn_init_scale_by_num_layers < 0:
      raise base_layer.LayerConfigError(
          f'{owner}: ffn_init_scale_by_num_layers must be >= 0, '
          f'got {p.ffn_init_scale_by_num_layers}.')
    fc2 = _Inherit(p, core.FCLayer.Params().Set(
        input_dim=p.hidden_dim, output_dim=p.input_dim, activation='NONE'))
    if p.ffn_init_scale_by_num_layers > 0:
      fc2.params_init = initializers.WeightInit(
          p.params_init.method, p.params_init.scale /
          math.sqrt(p.ffn_init_scale_by_num_layers))
    return _Named({
        'ln': _Inherit(p, normalization.LayerNorm.Params().Set(
            input_dim=p.input_dim)),
        'fc1': _Inherit(p, core.FCLayer.Params().Set(
            input_dim=p.input_dim, output_dim=p.hidden_dim,
            activation=p.activation)),
        'relu_dropout': _Inherit(p, core.DropoutLayer.Params().Set(
            keep_prob=1.0 - p.relu_dropout_prob)),
        'fc2': fc2,
        'residual_dropout': _Inherit(p, core.DropoutLayer.Params().Set(
            keep_prob=1.0 - p.residual_dropout_prob)),
    })

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    owner = f"TransformerFeedForwardLayer '{self.path}'"
    for name, child in self._ChildrenParams(self.p, owner).items():
      self.CreateChild(name, child)

  def FProp(self, x: tf.Tensor, *passthrough: Any,
            training: bool = False) -> Any:
    """[..., input_dim] -> [..., input_dim] (then `passthrough`, if any)."""
    self.CheckLastDim(x, self.p.input_dim)
    h = self.ln.FProp(x) if self.p.pre_layer_norm else x
    h = self.relu_dropout.FProp(self.fc1.FProp(h), training=training)
    h = self.residual_dropout.FProp(self.fc2.FProp(h), training=training)
    y = x + h
    if not self.p.pre_layer_norm:
      y = self.ln.FProp(y)
    return (y, *passthrough) if passthrough else y

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape,
                *passthrough_shapes: Shape) -> LayerMeta:
    base_layer.CheckMetaLastDim(p, shape, p.input_dim)
    children = cls._ChildrenParams(p, f"TransformerFeedForwardLayer '{p.name}'")
    hidden_shape = tuple(shape[:-1]) + (p.hidden_dim,)
    metas = [_Meta(children['ln'], shape), _Meta(children['fc1'], shape),
             _Meta(children['relu_dropout'], hidden_shape),
             _Meta(children['fc2'], hidden_shape),
             _Meta(children['residual_dropout'], shape)]
    flops = sum(m.flops for m in metas) + base_layer.NumElements(shape)
    outs = (tuple(shape),) + tuple(tuple(s) for s in passthrough_shapes)
    return LayerMeta(flops, outs, sum(m.num_params for m in metas))


class _TransformerBlock(base_layer.BaseLayer):
  """Shared Params and sub-blocks of the encoder and decoder layers."""

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('model_dim', 0, 'Size D of the features.')
    p.Define('hidden_dim', 0, 'Hidden size of the feed-forward block.')
    p.Define('num_heads', 1, 'Attention heads; must divide model_dim.')
    p.Define('atten_dropout_prob', 0.0,
             'Dropout probability on attention probabilities.')
    p.Define('residual_dropout_prob', 0.0,
             'Dropout probability on each sub-block output, before its '
             'residual addition.')
    p.Define('relu_dropout_prob', 0.0,
             'Dropout probability on the feed-forward hidden activations.')
    p.Define('activation', 'RELU', 'Activation of the feed-forward block.')
    p.Define('ffn_init_scale_by_num_layers', 0,
             'If > 0, the feed-forward output projection init scale is '
             'divided by sqrt of this (the number of layers); 0 = off.')
    return p

  @classmethod
  def _Blocks(cls, p: hyperparams.Params) -> tuple[str, ...]:
    """Names of the attention sub-blocks, in order.

    Sub-block `prefix` has children '{prefix}_ln' (LayerNorm), '{prefix}'
    (MultiHeadAttention) and '{prefix}_dropout' (residual dropout).
    """
    return ('self_atten',)

  @classmethod
  def _ChildrenParams(cls, p: hyperparams.Params, owner: str) -> dict:
    if p.model_dim <= 0:
      raise base_layer.LayerConfigError(
          f'{owner} needs a positive model_dim, got '
          f'{p.model_dim}.')
    _CheckProb(owner, 'residual_dropout_prob', p.residual_dropout_prob)
    children = {}
    for prefix in cls._Blocks(p):
      children[f'{prefix}_ln'] = _Inherit(
          p, normalization.LayerNorm.Params().Set(input_dim=p.model_dim))
      children[prefix] = _Inherit(p, attention.MultiHeadAttention.Params().Set(
          input_dim=p.model_dim, num_heads=p.num_heads,
          atten_dropout_prob=p.atten_dropout_prob))
      children[f'{prefix}_dropout'] = _Inherit(
          p, core.DropoutLayer.Params().Set(
              keep_prob=1.0 - p.residual_dropout_prob))
    children['ffn'] = _Inherit(p, TransformerFeedForwardLayer.Params().Set(
        input_dim=p.model_dim, hidden_dim=p.hidden_dim,
        activation=p.activation, residual_dropout_prob=p.residual_dropout_prob,
        relu_dropout_prob=p.relu_dropout_prob, pre_layer_norm=True,
        ffn_init_scale_by_num_layers=p.ffn_init_scale_by_num_layers))
    return _Named(children)

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    owner = f"{type(self).__name__} '{self.path}'"
    for name, child in self._ChildrenParams(self.p, owner).items():
      self.CreateChild(name, child)

  def _Attend(self, prefix: str, x: tf.Tensor, key_value: tf.Tensor | None,
              paddings: tf.Tensor, causal: bool, training: bool) -> tf.Tensor:
    """x + dropout(attention(ln(x), key_value)): one pre-LN residual block."""
    h = getattr(self, f'{prefix}_ln').FProp(x)
    h = getattr(self, prefix).FProp(h, key_value, paddings, causal=causal,
                                    training=training)
    return x + getattr(self, f'{prefix}_dropout').FProp(h, training=training)

  @classmethod
  def _BlocksMeta(cls, p: hyperparams.Params, x_shape: Shape,
                  key_shapes: dict) -> tuple[int, int]:
    """(flops, num_params) of all children; key_shapes[prefix] or None."""
    children = cls._ChildrenParams(p, f"{cls.__name__} '{p.name}'")
    metas = []
    for prefix in cls._Blocks(p):
      metas += [_Meta(children[f'{prefix}_ln'], x_shape),
                _Meta(children[prefix], x_shape, key_shapes.get(prefix)),
                _Meta(children[f'{prefix}_dropout'], x_shape)]
    metas.append(_Meta(children['ffn'], x_shape))
    residual_adds = len(cls._Blocks(p)) * base_layer.NumElements(x_shape)
    return (sum(m.flops for m in metas) + residual_adds,
            sum(m.num_params for m in metas))


class TransformerEncoderLayer(_TransformerBlock):
  """Pre-LN encoder block: self-attention then feed-forward, each residual.

  FProp(x [B,T,D], paddings [B,T], *rest) -> (x, paddings, *rest): inputs
  after the paddings are passed through unchanged (e.g. the target side of
  an encoder-decoder pipeline).
  """

  def FProp(self, x: tf.Tensor, paddings: tf.Tensor, *rest: Any,
            training: bool = False) -> tuple:
    """(x [B,T,D], paddings [B,T], *rest) -> (x', paddings, *rest)."""
    _CheckSequenceAndPaddings(self, x, paddings, self.p.model_dim, 'x')
    x = self._Attend('self_atten', x, None, paddings, False, training)
    x = self.ffn.FProp(x, training=training)
    return (x, paddings, *rest)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, x_shape: Shape,
                paddings_shape: Shape, *rest_shapes: Shape) -> LayerMeta:
    base_layer.CheckMetaLastDim(p, x_shape, p.model_dim)
    flops, num_params = cls._BlocksMeta(p, x_shape, {})
    outs = (tuple(x_shape), tuple(paddings_shape)) + tuple(
        tuple(s) for s in rest_shapes)
    return LayerMeta(flops, outs, num_params)


class TransformerDecoderLayer(_TransformerBlock):
  """Pre-LN decoder block: causal self-attention, cross-attention, feed-forward.

  With has_cross_attention=True (encoder-decoder):
    FProp(y [B,T,D], y_paddings [B,T], enc_out [B,S,D], enc_paddings [B,S])
      -> (y, y_paddings, enc_out, enc_paddings).
  With has_cross_attention=False (decoder-only language model):
    FProp(y, y_paddings) -> (y, y_paddings).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('has_cross_attention', True,
             'Attend to encoder outputs after the causal self-attention.')
    return p

  @classmethod
  def _Blocks(cls, p: hyperparams.Params) -> tuple[str, ...]:
    return ('self_atten', 'cross_atten') if p.has_cross_attention else (
        'self_atten',)

  def FProp(self, y: tf.Tensor, y_paddings: tf.Tensor,
            enc_out: tf.Tensor | None = None,
            enc_paddings: tf.Tensor | None = None, *,
            training: bool = False) -> tuple:
    """See the class docstring; raises LayerInputError on a wrong arity."""
    dim = self.p.model_dim
    _CheckSequenceAndPaddings(self, y, y_paddings, dim, 'y')
    if not self.p.has_cross_attention:
      if enc_out is not None or enc_paddings is not None:
        raise base_layer.LayerInputError(
            f"layer '{self.path}' (TransformerDecoderLayer) has "
            'has_cross_attention=False and takes only (y, y_paddings), but '
            'got encoder inputs too')
      y = self._Attend('self_atten', y, None, y_paddings, True, training)
      return (self.ffn.FProp(y, training=training), y_paddings)
    if enc_out is None or enc_paddings is None:
      raise base_layer.LayerInputError(
          f"layer '{self.path}' (TransformerDecoderLayer) has "
          'has_cross_attention=True and takes (y, y_paddings, enc_out, '
          'enc_paddings), but got no encoder inputs')
    _CheckSequenceAndPaddings(self, enc_out, enc_paddings, dim, 'enc_out')
    y = self._Attend('self_atten', y, None, y_paddings, True, training)
    y = self._Attend('cross_atten', y, enc_out, enc_paddings, False, training)
    y = self.ffn.FProp(y, training=training)
    return (y, y_paddings, enc_out, enc_paddings)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, y_shape: Shape,
                y_paddings_shape: Shape, enc_shape: Shape | None = None,
                enc_paddings_shape: Shape | None = None) -> LayerMeta:
    base_layer.CheckMetaLastDim(p, y_shape, p.model_dim)
    if p.has_cross_attention != (enc_shape is not None):
      raise base_layer.LayerInputError(
          f"layer '{p.name}' (TransformerDecoderLayer) with "
          f'has_cross_attention={p.has_cross_attention} got '
          f'{"no " if enc_shape is None else ""}encoder input shapes')
    key_shapes = {'cross_atten': enc_shape} if enc_shape is not None else {}
    flops, num_params = cls._BlocksMeta(p, y_shape, key_shapes)
    outs = (tuple(y_shape), tuple(y_paddings_shape))
    if enc_shape is not None:
      outs += (tuple(enc_shape), tuple(enc_paddings_shape))
    return LayerMeta(flops, outs, num_params)
