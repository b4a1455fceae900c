"""Transformer networks as pipelineable layer lists: the paper's Transformer-L LM and T(L, H, A) NMT.

Both builders return a list of layer Params that a SequentialLayer or a
PipeliningLayer runs in order; the layers hand tuples to each other::

  TransformerLM (decoder only, Table 1's Transformer-L):
    (ids, paddings)
      emb        TransformerEmbeddingLayer   -> (x, paddings)
      dec0..     TransformerDecoderLayer x L -> (x, paddings)   (no cross-attention)
      final_ln   FinalLayerNorm              -> (x, paddings)
      softmax    SoftmaxLayer                -> (logits, paddings)

  TransformerNMT (encoder-decoder T(L, H, A)):
    (src_ids, src_paddings, tgt_ids, tgt_paddings)
      emb        TransformerEmbeddingLayer   -> (src_x, src_pad, tgt_x, tgt_pad)
      enc0..     WideAttentionEncoderLayer x L (tgt_x, tgt_pad passed through)
      enc_to_dec EncoderToDecoderLayer       -> (tgt_x, tgt_pad, enc, enc_pad)
      dec0..     WideAttentionDecoderLayer x L
      final_ln   FinalLayerNorm              -> (y, tgt_pad)   (drops enc, enc_pad)
      softmax    SoftmaxLayer                -> (logits, tgt_pad)

Embedding sharing. A layer owns its variables, and a pipeline puts the first
and the last layer in different cells, so one table cannot serve both the
input embedding and the softmax. This module therefore embeds the source and
the target with ONE shared table in the first layer (as Lingvo's GPipe
Transformer does: the target embeddings ride through the encoder cells as a
passed-through input, one extra [B, T, D] activation per cell boundary) and
keeps the softmax untied. A fully tied model would have
``vocab_size * model_dim`` fewer parameters (the softmax keeps its bias);
report both when comparing with papers that tie.

Positions are sinusoidal by default (no parameters): with them the Transformer-L
counts equal Table 1 (32000-token vocabulary, untied embedding and softmax with
bias, biases in every projection, a final LayerNorm). T(L, H, A) gives its
attention 64 channels per head (``atten_dim_per_head``), so A = 32 heads have
2048 attention channels on a 1024-wide model, as the paper widens both.

Stabilisers of deep stacks (paper section 5): ``ffn_init_scale_by_num_layers``
divides every feed-forward output initialisation by sqrt(L), and
``logits_clip`` soft-clips the softmax logits.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import embedding
from gpipe_tf.layers import initializers
from gpipe_tf.layers import losses
from gpipe_tf.layers import normalization
from gpipe_tf.layers import transformer

__all__ = ['EncoderToDecoderLayer', 'FinalLayerNorm', 'LMInputShapes',
           'NMTInputShapes', 'NumParams', 'POSITION_EMBS', 'ParamsList',
           'SinusoidPositions', 'TransformerEmbeddingLayer', 'TransformerLM',
           'TransformerNMT', 'WideAttentionDecoderLayer',
           'WideAttentionEncoderLayer']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape
ParamsList = list[hyperparams.InstantiableParams]

POSITION_EMBS = ('sinusoid', 'learned', 'none')


def SinusoidPositions(length: int | tf.Tensor, dim: int,
                      dtype: tf.DType = tf.float32) -> tf.Tensor:
  """[length, dim] position signal: sines then cosines of geometric frequencies.

  Frequencies run from 1 down to 1/10000 over the dim // 2 channels of each
  half; an odd dim gets a final zero column.
  """
  half = dim // 2
  steps = max(half - 1, 1)
  inv_freq = tf.exp(tf.range(half, dtype=tf.float32) *
                    (-math.log(1.0e4) / steps))
  angles = tf.cast(tf.range(length), tf.float32)[:, None] * inv_freq[None, :]
  signal = tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)
  if dim % 2:
    signal = tf.pad(signal, [[0, 0], [0, 1]])
  return tf.cast(signal, dtype)


def _Inherit(parent: hyperparams.Params, child: hyperparams.InstantiableParams,
             name: str) -> hyperparams.InstantiableParams:
  return child.Set(name=name, dtype=parent.dtype, random_seed=parent.random_seed)


def _CheckPairs(owner: str, shapes: tuple) -> None:
  if not shapes or len(shapes) % 2:
    raise base_layer.LayerInputError(
        f'{owner} expects (ids, paddings) pairs but got {len(shapes)} inputs')


class TransformerEmbeddingLayer(base_layer.BaseLayer):
  """Embeds every (ids, paddings) pair of its inputs with one shared table.

  FProp(ids_0, paddings_0, ids_1, paddings_1, ...) returns
  (x_0, paddings_0, x_1, paddings_1, ...) with
  ``x = dropout(emb[ids] * sqrt(model_dim) + position)``. An LM passes one
  pair, an encoder-decoder passes (source, target) so both share the table.

  Children: ``token`` (EmbeddingLayer, init Gaussian(1/sqrt(model_dim)) so the
  scaled lookups have unit scale), ``position`` (only for 'learned'
  positions) and ``dropout``. It deliberately does NOT shift the target right:
  the input pipeline provides decoder inputs that start with BOS.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 0, 'Rows of the shared token table.')
    p.Define('model_dim', 0, 'Size of each embedding.')
    p.Define('position_emb', 'sinusoid',
             "Positions: 'sinusoid' (no parameters), 'learned' (a "
             "[max_seq_len, model_dim] table) or 'none'.")
    p.Define('max_seq_len', 0, "Longest sequence; needed by 'learned'.")
    p.Define('dropout_prob', 0.0, 'Dropout on the summed embeddings.')
    return p

  @classmethod
  def _ChildrenParams(cls, p: hyperparams.Params) -> dict:
    owner = f"TransformerEmbeddingLayer '{p.name}'"
    if p.vocab_size <= 0 or p.model_dim <= 0:
      raise base_layer.LayerConfigError(
          f'{owner} needs positive vocab_size and model_dim, got '
          f'{p.vocab_size} and {p.model_dim}.')
    if p.position_emb not in POSITION_EMBS:
      raise base_layer.LayerConfigError(
          f'{owner}: position_emb must be one of {POSITION_EMBS},'
          f' got {p.position_emb!r}.')
    if p.position_emb == 'learned' and p.max_seq_len <= 0:
      raise base_layer.LayerConfigError(
          f"{owner}: position_emb='learned' needs max_seq_len > 0"
          '.')
    if not 0.0 <= p.dropout_prob < 1.0:
      raise base_layer.LayerConfigError(
          f'{owner}: dropout_prob must be in [0, 1), got '
          f'{p.dropout_prob}.')
    scale = 1.0 / math.sqrt(p.model_dim)
    children = {'token': _Inherit(p, embedding.EmbeddingLayer.Params().Set(
        vocab_size=p.vocab_size, embedding_dim=p.model_dim,
        scale_sqrt_depth=True, params_init=initializers.Gaussian(scale)),
                                  'token')}
    if p.position_emb == 'learned':
      children['position'] = _Inherit(p, embedding.EmbeddingLayer.Params().Set(
          vocab_size=p.max_seq_len, embedding_dim=p.model_dim,
          params_init=initializers.Gaussian(scale)), 'position')
    children['dropout'] = _Inherit(p, core.DropoutLayer.Params().Set(
        keep_prob=1.0 - p.dropout_prob), 'dropout')
    return children

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    for name, child in self._ChildrenParams(self.p).items():
      self.CreateChild(name, child)

  def _Embed(self, ids: tf.Tensor, training: bool) -> tf.Tensor:
    x = self.token.FProp(ids)
    length = tf.shape(ids)[1]
    if self.p.position_emb == 'sinusoid':
      x += SinusoidPositions(length, self.p.model_dim, x.dtype)[None]
    elif self.p.position_emb == 'learned':
      x += self.position.FProp(tf.range(length))[None]
    return self.dropout.FProp(x, training=training)

  def FProp(self, *inputs: Any, training: bool = False) -> tuple:
    """(ids [B,T] int, paddings [B,T], ...) -> (x [B,T,D], paddings, ...)."""
    _CheckPairs(f"layer '{self.path}' (TransformerEmbeddingLayer)", inputs)
    outputs = []
    for ids, paddings in zip(inputs[::2], inputs[1::2]):
      ids = tf.convert_to_tensor(ids)
      if ids.shape.rank != 2:
        raise base_layer.LayerInputError(
            f"layer '{self.path}' (TransformerEmbeddingLayer) expects ids of "
            f'shape [batch, time] but got {ids.shape}')
      outputs += [self._Embed(ids, training), paddings]
    return tuple(outputs)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, *shapes: Shape) -> LayerMeta:
    _CheckPairs(f"layer '{p.name}' (TransformerEmbeddingLayer)", shapes)
    children = cls._ChildrenParams(p)
    flops, outs = 0, []
    for ids_shape, paddings_shape in zip(shapes[::2], shapes[1::2]):
      if len(ids_shape) != 2:
        raise base_layer.LayerInputError(
            f"layer '{p.name}' (TransformerEmbeddingLayer) expects ids of "
            f'shape [batch, time] but got {list(ids_shape)}')
      length = ids_shape[1]
      if (p.position_emb == 'learned' and length is not None and
          length > p.max_seq_len):
        raise base_layer.LayerInputError(
            f"layer '{p.name}' has max_seq_len {p.max_seq_len} but got "
            f'sequences of length {length}')
      out = tuple(ids_shape) + (p.model_dim,)
      flops += children['token'].cls.FPropMeta(children['token'],
                                               ids_shape).flops
      if p.position_emb != 'none':
        flops += base_layer.NumElements(out)
      if p.dropout_prob > 0:
        flops += core.DropoutLayer.FPropMeta(children['dropout'], out).flops
      outs += [out, tuple(paddings_shape)]
    num_params = p.vocab_size * p.model_dim
    if p.position_emb == 'learned':
      num_params += p.max_seq_len * p.model_dim
    return LayerMeta(flops, tuple(outs), num_params)


class EncoderToDecoderLayer(base_layer.BaseLayer):
  """Normalises the encoder output and hands the decoder its inputs first.

  FProp(enc [B,S,D], enc_paddings, tgt_x [B,T,D], tgt_paddings)
    -> (tgt_x, tgt_paddings, ln(enc), enc_paddings).

  The LayerNorm (child ``enc_ln``) is the final norm of the pre-LN encoder.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('model_dim', 0, 'Size D of the encoder and decoder features.')
    return p

  @classmethod
  def _LnParams(cls, p: hyperparams.Params) -> hyperparams.InstantiableParams:
    return _Inherit(p, normalization.LayerNorm.Params().Set(
        input_dim=p.model_dim), 'enc_ln')

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    self.CreateChild('enc_ln', self._LnParams(self.p))

  def FProp(self, enc: tf.Tensor, enc_paddings: tf.Tensor, tgt_x: tf.Tensor,
            tgt_paddings: tf.Tensor, training: bool = False) -> tuple:
    return (tgt_x, tgt_paddings, self.enc_ln.FProp(enc), enc_paddings)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, enc: Shape, enc_paddings: Shape,
                tgt_x: Shape, tgt_paddings: Shape) -> LayerMeta:
    meta = normalization.LayerNorm.FPropMeta(cls._LnParams(p), enc)
    outs = tuple(tuple(s) for s in (tgt_x, tgt_paddings, enc, enc_paddings))
    return LayerMeta(meta.flops, outs, meta.num_params)


class FinalLayerNorm(normalization.LayerNorm):
  """The last LayerNorm of a pre-LN stack; drops inputs after the paddings.

  FProp(x, paddings, *dropped) -> (ln(x), paddings): the decoder's encoder
  inputs end here so the pipeline does not carry them out. FProp(x) -> ln(x).
  """

  def FProp(self, x: tf.Tensor, *rest: Any, training: bool = False) -> Any:
    y = super().FProp(x, training=training)
    return (y, rest[0]) if rest else y

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape,
                *rest: Shape) -> LayerMeta:
    meta = super().FPropMeta(p, shape)
    return LayerMeta(meta.flops, meta.out_shapes + tuple(rest[:1]),
                     meta.num_params)


class _WideAttention:
  """Mixin: attention projections with atten_hidden_dim channels (0: model_dim)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()  # type: ignore[misc]
    p.Define('atten_hidden_dim', 0,
             'Channels of the attention projections (divisible by num_heads);'
             ' 0 means model_dim.')
    return p

  @classmethod
  def _ChildrenParams(cls, p: hyperparams.Params, owner: str) -> dict:
    children = super()._ChildrenParams(p, owner)  # type: ignore[misc]
    for prefix in cls._Blocks(p):  # type: ignore[attr-defined]
      children[prefix].hidden_dim = p.atten_hidden_dim
    return children


class WideAttentionEncoderLayer(_WideAttention,
                                transformer.TransformerEncoderLayer):
  """TransformerEncoderLayer whose attention has atten_hidden_dim channels."""


class WideAttentionDecoderLayer(_WideAttention,
                                transformer.TransformerDecoderLayer):
  """TransformerDecoderLayer whose attentions have atten_hidden_dim channels."""


def _Softmax(model_dim: int, vocab_size: int, logits_clip: float | None,
             dtype: str) -> hyperparams.InstantiableParams:
  return losses.SoftmaxLayer.Params().Set(
      name='softmax', input_dim=model_dim, num_classes=vocab_size,
      logits_clip=logits_clip, dtype=dtype)


def TransformerLM(num_layers: int, model_dim: int = 2048,
                  hidden_dim: int = 8192, num_heads: int = 32,
                  vocab_size: int = 32000, *,
                  position_emb: str = 'sinusoid', max_seq_len: int = 1024,
                  dropout_prob: float = 0.0, atten_dropout_prob: float = 0.0,
                  relu_dropout_prob: float = 0.0, activation: str = 'RELU',
                  ffn_init_scale_by_num_layers: bool = True,
                  logits_clip: float | None = None,
                  dtype: str = 'float32') -> ParamsList:
  """Layer Params of the decoder-only Transformer-L of the paper's Table 1.

  Args:
    num_layers: L, the number of decoder blocks.
    model_dim, hidden_dim, num_heads, vocab_size: the paper's 2048, 8192, 32
      and 32k (32000 reproduces its counts).
    position_emb: 'sinusoid' (as counted in Table 1), 'learned' or 'none'.
    max_seq_len: length of a learned position table.
    dropout_prob: dropout on embeddings and on every residual branch.
    atten_dropout_prob, relu_dropout_prob: attention and feed-forward dropout.
    activation: feed-forward activation.
    ffn_init_scale_by_num_layers: divide feed-forward output init by sqrt(L).
    logits_clip: soft-clip the logits to +-this (None: off).
    dtype: of variables and activations.

  Returns:
    [emb, dec0 .. dec{L-1}, final_ln, softmax]; FProp(ids, paddings) of the
    sequence returns (logits [B, T, vocab_size], paddings).
  """
  if num_layers < 1:
    raise base_layer.LayerConfigError(
        f'TransformerLM needs num_layers >= 1, got {num_layers}.')
  layers = [TransformerEmbeddingLayer.Params().Set(
      name='emb', vocab_size=vocab_size, model_dim=model_dim,
      position_emb=position_emb, max_seq_len=max_seq_len,
      dropout_prob=dropout_prob, dtype=dtype)]
  for i in range(num_layers):
    layers.append(transformer.TransformerDecoderLayer.Params().Set(
        name=f'dec{i}', model_dim=model_dim, hidden_dim=hidden_dim,
        num_heads=num_heads, has_cross_attention=False,
        atten_dropout_prob=atten_dropout_prob,
        residual_dropout_prob=dropout_prob,
        relu_dropout_prob=relu_dropout_prob, activation=activation,
        ffn_init_scale_by_num_layers=(
            num_layers if ffn_init_scale_by_num_layers else 0), dtype=dtype))
  layers.append(FinalLayerNorm.Params().Set(name='final_ln',
                                            input_dim=model_dim, dtype=dtype))
  layers.append(_Softmax(model_dim, vocab_size, logits_clip, dtype))
  return layers


def TransformerNMT(num_layers: int, hidden_dim: int, num_heads: int,
                   model_dim: int = 1024, vocab_size: int = 64000, *,
                   atten_dim_per_head: int = 64,
                   position_emb: str = 'sinusoid', max_seq_len: int = 1024,
                   dropout_prob: float = 0.1, atten_dropout_prob: float = 0.1,
                   relu_dropout_prob: float = 0.1, activation: str = 'RELU',
                   ffn_init_scale_by_num_layers: bool = True,
                   logits_clip: float | None = None,
                   dtype: str = 'float32') -> ParamsList:
  """Layer Params of the encoder-decoder T(L, H, A) of the paper's section 5.

  Args: L encoder and L decoder blocks, feed-forward size H, A heads of
  ``atten_dim_per_head`` channels each, the paper's model_dim 1024 and a
  64k vocabulary shared by source and target; the rest as for TransformerLM
  (``ffn_init_scale_by_num_layers`` divides by sqrt(L) in both stacks).

  Returns:
    [emb, enc0.., enc_to_dec, dec0.., final_ln, softmax]; FProp(src_ids,
    src_paddings, tgt_ids, tgt_paddings) returns (logits [B, T, vocab_size],
    tgt_paddings). The softmax is untied (see the module docstring).
  """
  if num_layers < 1:
    raise base_layer.LayerConfigError(
        f'TransformerNMT needs num_layers >= 1, got {num_layers}.')
  common = dict(
      model_dim=model_dim, hidden_dim=hidden_dim, num_heads=num_heads,
      atten_hidden_dim=num_heads * atten_dim_per_head,
      atten_dropout_prob=atten_dropout_prob, residual_dropout_prob=dropout_prob,
      relu_dropout_prob=relu_dropout_prob, activation=activation,
      ffn_init_scale_by_num_layers=(
          num_layers if ffn_init_scale_by_num_layers else 0), dtype=dtype)
  layers = [TransformerEmbeddingLayer.Params().Set(
      name='emb', vocab_size=vocab_size, model_dim=model_dim,
      position_emb=position_emb, max_seq_len=max_seq_len,
      dropout_prob=dropout_prob, dtype=dtype)]
  layers += [WideAttentionEncoderLayer.Params().Set(name=f'enc{i}', **common)
             for i in range(num_layers)]
  layers.append(EncoderToDecoderLayer.Params().Set(
      name='enc_to_dec', model_dim=model_dim, dtype=dtype))
  layers += [WideAttentionDecoderLayer.Params().Set(name=f'dec{i}', **common)
             for i in range(num_layers)]
  layers.append(FinalLayerNorm.Params().Set(name='final_ln',
                                            input_dim=model_dim, dtype=dtype))
  layers.append(_Softmax(model_dim, vocab_size, logits_clip, dtype))
  return layers


def LMInputShapes(seq_len: int) -> list[Shape]:
  """Input shapes of TransformerLM (batch None): ids and paddings."""
  return [(None, seq_len), (None, seq_len)]


def NMTInputShapes(src_len: int, tgt_len: int) -> list[Shape]:
  """Input shapes of TransformerNMT (batch None): source then target pairs."""
  return [(None, src_len), (None, src_len), (None, tgt_len), (None, tgt_len)]


def NumParams(layer_params: ParamsList, input_shapes: list[Shape]) -> int:
  """Parameters of a layer list, from FPropMeta (no variables are created)."""
  return sum(m.num_params for m in core.MetaOfSequence(layer_params,
                                                       tuple(input_shapes)))
