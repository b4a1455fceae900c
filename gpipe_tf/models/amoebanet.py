"""AmoebaNet-B and -D (Real et al. 2018) as a list of layer Params a PipeliningLayer can split.

After the stem every layer takes the pair (x, x_prev), the two newest feature
maps; a cell returns (its output, its input x), so the next cell sees the two
most recent cell outputs, as in the reference (tensorflow/tpu amoeba_net)::

  image -> stem conv -> [2 stem reduction cells] -> N normal cells -> reduction
        -> N normal cells -> reduction -> N normal cells -> head -> logits
  (N = L / 3; normal cells of stack s have D * 2**s filters, the stem cells
   D / 4 and D / 2; the head is ReLU, global average pool, dropout, FC)

A cell matches x_prev to x (a factorized reduction if x_prev is twice as
large, a 1x1 conv if only its channels differ), maps x to F channels by
ReLU-1x1 conv-BN, then runs B combinations: each applies one operation to each
of two earlier hidden states and sums them into a new one. The hidden states
nobody used are concatenated into the output. Operations are ReLU-conv-BN
('separable_3x3_2' is two separable ReLU-conv-BN in a row); in a reduction
cell, those reading x or x_prev have stride 2.

Every layer has an exact FPropMeta, so ``NumParams`` counts models too large
to build. Deliberately NOT included: the auxiliary head, drop path's burn-in.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import conv
from gpipe_tf.layers import core
from gpipe_tf.layers import initializers
from gpipe_tf.layers import normalization

__all__ = ['AmoebaCellLayer', 'AmoebaHeadLayer', 'AmoebaNet', 'AmoebaNetB',
           'AmoebaNetD', 'CELLS', 'CellPlan', 'CellSpec', 'CellSpecError',
           'FactorizedReductionLayer', 'HeInit', 'NumParams']

LayerMeta = base_layer.LayerMeta
Params = hyperparams.InstantiableParams


class CellSpecError(errors.Error, ValueError):
  """A cell description (operations, hidden-state wiring) that cannot work."""


class CellSpec(NamedTuple):
  """2B operations; operation j reads hidden state hiddenstate_indices[j]
  (0: x, 1: x_prev, 2 + i: combination i); the states whose
  used_hiddenstates flag is 0 are concatenated into the output."""
  operations: tuple
  hiddenstate_indices: tuple
  used_hiddenstates: tuple


# (normal cell, reduction cell), as in Real et al. 2018 and the reference.
CELLS = {
    'B': (CellSpec(('1x1', 'max_pool_3x3', 'none', 'separable_3x3_2', '1x1',
                    'separable_3x3_2', '1x1', 'none', 'avg_pool_3x3', '1x1'),
                   (1, 1, 1, 0, 1, 0, 2, 2, 1, 5), (0, 1, 1, 0, 0, 1, 0)),
          CellSpec(('max_pool_2x2', 'max_pool_3x3', 'none', '3x3',
                    'dil_2_separable_5x5_2', 'max_pool_3x3', 'none',
                    'separable_3x3_2', 'avg_pool_3x3', '1x1'),
                   (0, 0, 2, 1, 2, 2, 3, 1, 4, 3), (1, 1, 1, 1, 1, 0, 0))),
    'D': (CellSpec(('1x1', 'max_pool_3x3', 'none', '1x7_7x1', '1x1',
                    '1x7_7x1', 'max_pool_3x3', 'none', 'avg_pool_3x3', '1x1'),
                   (1, 1, 1, 0, 0, 0, 2, 2, 1, 5), (0, 1, 1, 0, 0, 1, 0)),
          CellSpec(('max_pool_2x2', 'max_pool_3x3', 'none', '3x3', '1x7_7x1',
                    'max_pool_3x3', 'none', 'max_pool_2x2', 'avg_pool_3x3',
                    '1x1'),
                   (0, 0, 2, 1, 2, 2, 3, 1, 2, 3), (1, 1, 1, 1, 0, 0, 0))),
}


def HeInit() -> hyperparams.Params:
  """Normal with stddev sqrt(2 / fan_in): the default of every weight here."""
  return initializers.WeightInit('gaussian_sqrt_fanin', 2.0**0.5)


# ---- Sub-layer Params -------------------------------------------------------
def _Relu(name: str = 'relu') -> Params:
  return core.ActivationLayer.Params().Set(name=name, activation='RELU')


def _BN(p, dim: int, name: str = 'bn') -> Params:
  return normalization.BatchNormLayer.Params().Set(
      name=name, dim=dim, decay=p.batch_norm_decay,
      epsilon=p.batch_norm_epsilon)


def _Conv(p, name: str, shape: Sequence[int],
          stride: Sequence[int] = (1, 1)) -> Params:
  return conv.Conv2DLayer.Params().Set(
      name=name, filter_shape=tuple(shape), filter_stride=tuple(stride),
      params_init=p.params_init)


def _Seq(name: str, layers: list) -> Params:
  return core.SequentialLayer.Params().Set(name=name, layers=layers)


def _Meta(lp: Params, *shapes) -> LayerMeta:
  return lp.cls.FPropMeta(lp, *shapes)


def _OperationParams(p, name: str, op: str, c_in: int, stride: int) -> Params:
  """Params of operation `op` of cell `p`: c_in channels in, F out."""
  f = p.num_filters
  layers = []
  if op in ('none', '1x1'):
    if stride > 1 or op == '1x1' or c_in != f:  # Else the identity.
      layers = [_Relu(), _Conv(p, 'conv_1x1', (1, 1, c_in, f),
                               (stride, stride)), _BN(p, f)]
  elif re.fullmatch(r'(avg|max)_pool_(\d)x\2', op):
    k = int(op[-1])
    layers = [conv.PoolingLayer.Params().Set(
        name='pool', pooling_type=op[:3].upper(), window_shape=(k, k),
        window_stride=(stride, stride), padding='SAME')]
    if c_in != f:
      layers += [_Conv(p, 'conv_1x1', (1, 1, c_in, f)), _BN(p, f)]
  elif re.fullmatch(r'(dil_\d+_)?separable_(\d)x\2_\d+', op):
    k, repeats = int(op.split('x')[-2][-1]), int(op.rsplit('_', 1)[1])
    rate = int(op.split('_')[1]) if op.startswith('dil_') else 1
    for i in range(repeats):  # Only the first one strides.
      s = stride if i == 0 else 1
      layers += [_Relu(f'relu_{i}'), conv.SeparableConv2DLayer.Params().Set(
          name=f'separable_{i}', filter_shape=(k, k, c_in, f),
          filter_stride=(s, s), dilation_rate=(rate, rate) if s == 1 else
          (1, 1), params_init=p.params_init), _BN(p, f, f'bn_{i}')]
      c_in = f
  elif re.fullmatch(r'3x3|1x(\d)_\1x1', op):
    # Bottleneck: 1x1 to r = F/4 (3F/8 for 1x3_3x1) channels, conv, 1x1 to F.
    r = int(3 * f / 8) if op == '1x3_3x1' else int(f / 4)
    c_mid = r if r >= 1 else c_in
    if op == '3x3':
      convs = [_Conv(p, 'conv_3x3', (3, 3, c_mid, r or f), (stride, stride))]
    else:
      k = int(op[2])
      convs = [_Conv(p, f'conv_1x{k}', (1, k, c_mid, r or f), (1, stride)),
               _BN(p, r or f, f'bn_1x{k}'), _Relu(f'relu_1x{k}'),
               _Conv(p, f'conv_{k}x1', (k, 1, r or f, r or f), (stride, 1))]
    if r < 1:  # Too narrow for a bottleneck.
      layers = [_Relu(), *convs, _BN(p, f)]
    else:
      layers = [_Relu('pre_relu'), _Conv(p, 'pre_1x1', (1, 1, c_in, r)),
                _BN(p, r, 'pre_bn'), _Relu(), *convs, _BN(p, r),
                _Relu('post_relu'), _Conv(p, 'post_1x1', (1, 1, r, f)),
                _BN(p, f, 'post_bn')]
  else:
    raise CellSpecError(f"Unknown operation {op!r} in cell '{p.name}'.")
  if op != 'none' and p.drop_path_keep_prob < 1.0:
    layers.append(core.DropoutLayer.Params().Set(
        name='drop_path', keep_prob=p.drop_path_keep_prob,
        noise_shape_broadcast_dims=[1, 2, 3]))
  if not layers:
    return core.ActivationLayer.Params().Set(name=name, activation='NONE')
  return _Seq(name, layers)


def _CheckMetaImage(p, shape, channels: int) -> None:
  if shape is None or len(shape) != 4:
    raise base_layer.LayerInputError(
        f"layer '{p.name}' ({p.cls.__name__}) expects an NHWC image batch but"
        f' got shape {shape}')
  base_layer.CheckMetaLastDim(p, shape, channels)


class FactorizedReductionLayer(base_layer.BaseLayer):
  """[ReLU,] 1x1 conv, BN; with stride 2, two 1x1 convs on grids offset by one.

  Stride 2: BN(concat(conv_a(x[::2, ::2]), conv_b(x[1::2, 1::2]))), so no
  pixel is skipped (odd sizes see a zero row and column added at the end).
  """

  @classmethod
  def Params(cls) -> Params:
    p = super().Params()
    p.Define('input_dim', 0, 'Input channels.')
    p.Define('output_dim', 0, 'Output channels (even when stride is 2).')
    p.Define('stride', 2, '1 or 2.')
    p.Define('relu_first', False, 'Apply ReLU to the input first.')
    p.Define('batch_norm_decay', 0.9997, 'BatchNorm moving-average decay.')
    p.Define('batch_norm_epsilon', 1e-3, 'BatchNorm epsilon.')
    return p

  @classmethod
  def _Children(cls, p) -> dict:
    if p.stride not in (1, 2) or min(p.input_dim, p.output_dim) < 1 or (
        p.stride == 2 and p.output_dim % 2):
      raise base_layer.LayerConfigError(
          f"FactorizedReductionLayer '{p.name}' needs stride 1 "
          'or 2, positive dims and an even output_dim for stride'
          f' 2; got stride={p.stride}, input_dim={p.input_dim}, '
          f'output_dim={p.output_dim}.')
    convs = ['conv'] if p.stride == 1 else ['conv_a', 'conv_b']
    width = p.output_dim // len(convs)
    children = {n: _Conv(p, n, (1, 1, p.input_dim, width)) for n in convs}
    return dict(children, bn=_BN(p, p.output_dim))

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    for name, child in self._Children(self.p).items():
      self.CreateChild(name, child)

  def FProp(self, x, training=False):
    x = tf.nn.relu(x) if self.p.relu_first else x
    if self.p.stride == 1:
      return self.bn.FProp(self.conv.FProp(x), training=training)
    shifted = tf.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1:, 1:, :]
    y = tf.concat([self.conv_a.FProp(x[:, ::2, ::2, :]),
                   self.conv_b.FProp(shifted[:, ::2, ::2, :])], axis=-1)
    return self.bn.FProp(y, training=training)

  @classmethod
  def FPropMeta(cls, p, shape):
    *convs, bn = cls._Children(p).values()
    _CheckMetaImage(p, shape, p.input_dim)
    sub = (shape[0], *(None if d is None else -(-d // p.stride)
                       for d in shape[1:3]), shape[3])
    metas = [_Meta(c, sub) for c in convs]
    metas.append(_Meta(bn, sub[:3] + (p.output_dim,)))
    flops = sum(m.flops for m in metas) + p.relu_first * (
        base_layer.NumElements(shape))
    return LayerMeta(flops, metas[-1].out_shapes,
                     sum(m.num_params for m in metas))


def _FR(p, name: str, c_in: int, c_out: int, stride: int,
        relu_first: bool) -> Params:
  return FactorizedReductionLayer.Params().Set(
      name=name, input_dim=c_in, output_dim=c_out, stride=stride,
      relu_first=relu_first, batch_norm_decay=p.batch_norm_decay,
      batch_norm_epsilon=p.batch_norm_epsilon, params_init=p.params_init)


class CellPlan(NamedTuple):
  """The sub-layers of a cell, derived from its Params alone."""
  prev: Params | None  # Matches x_prev to x (None: x_prev is used as it is).
  base: Params         # ReLU-1x1 conv-BN of x: hidden state 0.
  ops: list            # One Params per operation.
  combine: list        # (unused hidden state, Params of its reducer or None).
  out_channels: int


class AmoebaCellLayer(base_layer.BaseLayer):
  """One normal or reduction cell: FProp(x, x_prev) -> (output, x).

  ``Plan`` turns the Params (a CellSpec's fields, F and the input channels)
  into sub-layer Params. The first cell after a stem conv takes x alone
  (prev_channels None) and uses x as x_prev, as the reference does when there
  is no earlier cell.
  """

  @classmethod
  def Params(cls) -> Params:
    p = super().Params()
    p.params_init = HeInit()
    for field in CellSpec._fields:
      p.Define(field, (), 'See CellSpec.')
    p.Define('num_filters', 0, 'F: output channels of every operation.')
    p.Define('stride', 1, '1 (normal cell) or 2 (reduction cell).')
    p.Define('input_channels', 0, 'Channels of x.')
    p.Define('prev_channels', None,
             'Channels of x_prev; None: FProp takes x alone, x_prev = x.')
    p.Define('prev_stride', 1,
             '2 when x_prev is twice as high and wide as x, else 1.')
    p.Define('drop_path_keep_prob', 1.0,
             'Keep probability of each operation output, per example.')
    p.Define('batch_norm_decay', 0.9997, 'BatchNorm moving-average decay.')
    p.Define('batch_norm_epsilon', 1e-3, 'BatchNorm epsilon.')
    return p

  @classmethod
  def Plan(cls, p: hyperparams.Params) -> CellPlan:
    """The sub-layer Params of cell `p`; raises CellSpecError if it is bad."""
    ops, idx, used = p.operations, p.hiddenstate_indices, p.used_hiddenstates
    f, num = p.num_filters, len(ops) // 2
    if not ops or len(ops) % 2 or len(idx) != len(ops) or len(used) != num + 2:
      raise CellSpecError(
          f"Cell '{p.name}': need 2B operations, 2B hiddenstate_indices and "
          f'B + 2 used_hiddenstates; got {len(ops)}, {len(idx)}, {len(used)}.')
    if min(f, p.input_channels, p.prev_channels or 1) < 1 or not (
        p.stride in (1, 2) and p.prev_stride in (1, 2)):
      raise CellSpecError(
          f"Cell '{p.name}': need num_filters, input_channels, prev_channels"
          f' >= 1 and strides in (1, 2); got {f}, {p.input_channels}, '
          f'{p.prev_channels}, {p.stride}, {p.prev_stride}.')
    prev, channels, reduced = None, [f, f], [False, False]
    if p.prev_channels is None:
      channels[1] = p.input_channels
    elif p.prev_stride == 2 or p.prev_channels != f:
      prev = _FR(p, 'prev', p.prev_channels, f, p.prev_stride, True)
    base = _Seq('base', [_Relu(), _Conv(p, 'conv_1x1', (1, 1,
                                                        p.input_channels, f)),
                         _BN(p, f)])
    op_params = []
    for j, (op, h) in enumerate(zip(ops, idx)):
      if not 0 <= h < 2 + j // 2:
        raise CellSpecError(f"Cell '{p.name}': operation {j} reads hidden "
                            f'state {h}; only 0..{1 + j // 2} exist there.')
      stride = p.stride if h < 2 else 1
      op_params.append(_OperationParams(p, f'op_{j}', op, channels[h],
                                        stride))
      if j % 2:  # A new hidden state of F channels.
        channels.append(f)
        reduced.append(reduced[h] or stride > 1)
    combine = []
    for h in (h for h, u in enumerate(used) if not u):
      fix = None
      if channels[h] != f or reduced[h] != reduced[-1]:
        fix = _FR(p, f'reduce_{h}', channels[h], f,
                  2 if reduced[h] != reduced[-1] else 1, False)
      combine.append((h, fix))
    if not combine:
      raise CellSpecError(f"Cell '{p.name}': every hidden state is used, so "
                          'the output would be empty.')
    return CellPlan(prev, base, op_params, combine, f * len(combine))

  @classmethod
  def _Dataflow(cls, p, plan: CellPlan, x, prev, run: Callable,
                add: Callable) -> list:
    """The cell's dataflow, shared by FProp (on tensors) and FPropMeta (on
    shapes): run(sub-layer Params, input) applies a sub-layer, add(a, b)
    sums two hidden states. Returns the hidden states to concatenate."""
    prev = prev if plan.prev is None else run(plan.prev, prev)
    states, idx = [run(plan.base, x), prev], p.hiddenstate_indices
    for j in range(0, len(plan.ops), 2):
      states.append(add(run(plan.ops[j], states[idx[j]]),
                        run(plan.ops[j + 1], states[idx[j + 1]])))
    return [run(fix, states[h]) if fix else states[h]
            for h, fix in plan.combine]

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self._plan = plan = self.Plan(self.p)
    for sub in [plan.prev, plan.base, *plan.ops, *(f for _, f in plan.combine)]:
      if sub is not None:
        self.CreateChild(sub.name, sub)

  def FProp(self, x, x_prev=None, training=False):
    """(x [B, H, W, C], x_prev) -> (output [B, H', W', n * F], x)."""
    if (x_prev is None) != (self.p.prev_channels is None):
      raise base_layer.LayerInputError(
          f"layer '{self.path}' (AmoebaCellLayer) expects "
          f"{'(x, x_prev)' if x_prev is None else 'x alone'}; set "
          'Params.prev_channels to match.')
    outs = self._Dataflow(
        self.p, self._plan, x, x if x_prev is None else x_prev,
        lambda sub, h: getattr(self, sub.name).FProp(h, training=training),
        tf.add)
    return tf.concat(outs, axis=-1), x

  @classmethod
  def FPropMeta(cls, p, x_shape, prev_shape=None):
    _CheckMetaImage(p, x_shape, p.input_channels)
    if (prev_shape is None) != (p.prev_channels is None):
      raise base_layer.LayerInputError(
          f"layer '{p.name}' (AmoebaCellLayer) expects "
          f"{'(x, x_prev)' if prev_shape is None else 'x alone'}.")
    if prev_shape is not None:
      _CheckMetaImage(p, prev_shape, p.prev_channels)
      if any(a is not None and b is not None and -(-a // p.prev_stride) != b
             for a, b in zip(prev_shape[1:3], x_shape[1:3])):
        raise base_layer.LayerInputError(
            f"layer '{p.name}' (AmoebaCellLayer): x_prev {list(prev_shape)} "
            f'is not x {list(x_shape)} times prev_stride={p.prev_stride}.')
    metas, adds = [], []

    def _Run(sub, shape):
      metas.append(_Meta(sub, shape))
      return metas[-1].out_shapes[0]

    def _Add(a, b):
      if a != b:
        raise CellSpecError(f"Cell '{p.name}' sums hidden states of shapes "
                            f'{a} and {b}.')
      adds.append(base_layer.NumElements(a))
      return a

    plan = cls.Plan(p)
    outs = cls._Dataflow(p, plan, tuple(x_shape),
                         tuple(prev_shape or x_shape), _Run, _Add)
    out = tuple(outs[0][:3]) + (plan.out_channels,)
    return LayerMeta(sum(m.flops for m in metas) + sum(adds),
                     (out, tuple(x_shape)), sum(m.num_params for m in metas))


class AmoebaHeadLayer(base_layer.BaseLayer):
  """(x, x_prev) -> logits: ReLU, global average pool, dropout, FC (x_prev unused)."""

  @classmethod
  def Params(cls) -> Params:
    p = super().Params()
    p.params_init = HeInit()
    p.Define('input_dim', 0, 'Channels of x.')
    p.Define('num_classes', 0, 'Number of logits.')
    p.Define('keep_prob', 0.5, 'Dropout keep probability before the FC.')
    return p

  @classmethod
  def _Children(cls, p) -> dict:
    return {'dropout': core.DropoutLayer.Params().Set(keep_prob=p.keep_prob),
            'logits': core.FCLayer.Params().Set(
                input_dim=p.input_dim, output_dim=p.num_classes,
                activation='NONE', params_init=p.params_init)}

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    for name, child in self._Children(self.p).items():
      self.CreateChild(name, child)

  def FProp(self, x, x_prev=None, training=False):
    """[B, H, W, input_dim] (and x_prev, ignored) -> [B, num_classes]."""
    self.CheckLastDim(x, self.p.input_dim)
    y = tf.reduce_mean(tf.nn.relu(x), axis=[1, 2])
    return self.logits.FProp(self.dropout.FProp(y, training=training))

  @classmethod
  def FPropMeta(cls, p, x_shape, prev_shape=None):
    _CheckMetaImage(p, x_shape, p.input_dim)
    pooled = (x_shape[0], p.input_dim)
    metas = [_Meta(c, pooled) for c in cls._Children(p).values()]
    return LayerMeta(2 * base_layer.NumElements(x_shape) +
                     sum(m.flops for m in metas), metas[-1].out_shapes,
                     sum(m.num_params for m in metas))


# ---- Builders ----------------------------------------------------------------
def AmoebaNet(cells: tuple[CellSpec, CellSpec], num_normal_layers: int,
              num_filters: int, num_classes: int = 1000,
              image_size: int | None = 224, num_input_channels: int = 3, *,
              num_stem_cells: int = 2, stem_filters: int = 32,
              stem_stride: int = 2, num_reduction_cells: int = 2,
              dropout_keep_prob: float = 0.5, drop_path_keep_prob: float = 1.0,
              batch_norm_decay: float = 0.9997,
              batch_norm_epsilon: float = 1e-3) -> list[Params]:
  """[stem, cells..., head]: the layer Params of AmoebaNet(L, D), images to logits.

  Args:
    cells: (normal, reduction) CellSpecs, e.g. CELLS['D'].
    num_normal_layers: L, all normal cells; the R = num_reduction_cells
      reduction cells go before normal cells int(L * r / (R + 1)), r = 1..R.
    num_filters: D, filters of the first stack, doubled at every reduction.
    num_classes, num_input_channels: logits, and channels of the images.
    image_size: if set, the chain is checked on [None, S, S, C] images.
    num_stem_cells: reduction cells after the stem conv (2 for ImageNet, with
      D/4 and D/2 filters; 0 for small images). D must be a multiple of 2**it.
    stem_filters, stem_stride: of the stem's 3x3 VALID convolution.
    dropout_keep_prob: of the head; drop_path_keep_prob: of each operation
      output, per example (1.0: off).
    batch_norm_decay, batch_norm_epsilon: of every BatchNorm.
  """
  for name, value in (('num_normal_layers', num_normal_layers),
                      ('num_filters', num_filters),
                      ('num_classes', num_classes),
                      ('stem_filters', stem_filters)):
    if not isinstance(value, int) or value < 1:
      raise base_layer.LayerConfigError(
          f'AmoebaNet: {name} must be a positive int, got '
          f'{value!r}.')
  if num_filters % 2**num_stem_cells:
    raise base_layer.LayerConfigError(
        f'AmoebaNet: num_filters={num_filters} must be a multiple'
        f' of 2**num_stem_cells={2**num_stem_cells} (the stem '
        'cells have D / 4 and D / 2 filters, and factorized '
        'reductions need even filter counts).')
  template = AmoebaCellLayer.Params().Set(
      drop_path_keep_prob=drop_path_keep_prob,
      batch_norm_decay=batch_norm_decay, batch_norm_epsilon=batch_norm_epsilon)
  stem_conv = _Conv(template, 'conv_3x3',
                    (3, 3, num_input_channels, stem_filters),
                    (stem_stride, stem_stride)).Set(padding='VALID')
  layers = [_Seq('stem', [stem_conv, _BN(template, stem_filters)])]
  x, prev = (stem_filters, 0), None  # (channels, times reduced).

  def _Add(name: str, spec: CellSpec, filters: int, stride: int) -> None:
    nonlocal x, prev
    cell = template.Copy().Set(
        name=name, **spec._asdict(), num_filters=filters, stride=stride,
        input_channels=x[0], prev_channels=prev and prev[0],
        prev_stride=2 if prev and prev[1] < x[1] else 1)
    layers.append(cell)
    prev, x = x, (AmoebaCellLayer.Plan(cell).out_channels, x[1] + stride - 1)

  normal, reduction = cells
  for i in range(num_stem_cells):
    _Add(f'stem_cell_{i}', reduction,
         num_filters // 2**(num_stem_cells - i), 2)
  where = [int((r + 1) / (num_reduction_cells + 1) * num_normal_layers)
           for r in range(num_reduction_cells)]
  filters = num_filters
  for i in range(num_normal_layers):
    for r in (r for r, at in enumerate(where) if at == i):
      filters *= 2
      _Add(f'reduction_cell_{r}', reduction, filters, 2)
    _Add(f'cell_{i}', normal, filters, 1)
  layers.append(AmoebaHeadLayer.Params().Set(
      name='head', input_dim=x[0], num_classes=num_classes,
      keep_prob=dropout_keep_prob))
  if image_size is not None:
    shape = (None, image_size, image_size, num_input_channels)
    last = core.MetaOfSequence(layers[:-1], (shape,))[-1].out_shapes[0]
    if min(last[1:3]) < 1:
      raise base_layer.LayerConfigError(
          f'AmoebaNet: image_size={image_size} is too small: '
          f'the last feature map is {list(last)}.')
  return layers


def AmoebaNetD(num_normal_layers: int, num_filters: int,
               num_classes: int = 1000, image_size: int | None = 224,
               **kwargs) -> list[Params]:
  """AmoebaNet-D(L, D); see AmoebaNet for the arguments."""
  return AmoebaNet(CELLS['D'], num_normal_layers, num_filters, num_classes,
                   image_size, **kwargs)


def AmoebaNetB(num_normal_layers: int, num_filters: int,
               num_classes: int = 1000, image_size: int | None = 224,
               **kwargs) -> list[Params]:
  """AmoebaNet-B(L, D); see AmoebaNet for the arguments."""
  return AmoebaNet(CELLS['B'], num_normal_layers, num_filters, num_classes,
                   image_size, **kwargs)


def NumParams(layer_params: Sequence[Params],
              input_shape: Sequence[int | None]) -> int:
  """Parameters (all variables) of a chain of layers, from FPropMeta alone."""
  return sum(m.num_params for m in core.MetaOfSequence(
      list(layer_params), (tuple(input_shape),)))
