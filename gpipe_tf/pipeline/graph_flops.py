"""The floating-point operations a traced graph computes per call: its matrix products and convolutions, inside called shared layer traces too.

cell_program.py weighs each piece of a cell's program with it to decide
whether the piece is called whole or inlined into the step (a call costs a
fixed overhead; a piece that computes little pays it in every step). Only
the ops that dominate a layer's cost are counted: MatMul, BatchMatMul,
Einsum, and 2-D/3-D and depthwise convolutions with their gradients, as
2 x multiply-adds. Element-wise ops count nothing, and an op whose shapes are
not static counts nothing: an estimate errs low, never high.

Calls of shared layer traces (layers/shared_trace.py) count their graph's
ops; a loop over a run of layers (layers/shared_run.py) and any other
control flow count nothing.
"""

from __future__ import annotations

import math

import tensorflow as tf

from gpipe_tf.layers import shared_trace

__all__ = []  # Internal to the engine.

_MATMULS = frozenset({'MatMul', 'BatchMatMul', 'BatchMatMulV2',
                      'BatchMatMulV3'})
_CONVS = frozenset({'Conv2D', 'Conv3D', 'DepthwiseConv2dNative'})
_CONV_INPUT_GRADS = frozenset({'Conv2DBackpropInput', 'Conv3DBackpropInputV2',
                               'DepthwiseConv2dNativeBackpropInput'})
_CONV_FILTER_GRADS = frozenset({'Conv2DBackpropFilter',
                                'Conv3DBackpropFilterV2',
                                'DepthwiseConv2dNativeBackpropFilter'})

# A called trace's name -> its FLOPs.
_CALLED: dict[str, int] = {}


def _Elements(shape: tf.TensorShape) -> int | None:
  if shape.rank is None or not shape.is_fully_defined():
    return None
  return math.prod(shape.as_list())


def _Attr(op: tf.Operation, name: str, default=False):
  try:
    return op.get_attr(name)
  except ValueError:
    return default


def _MatMul(op: tf.Operation) -> int:
  out, a = _Elements(op.outputs[0].shape), op.inputs[0].shape
  if out is None or a.rank is None or a.rank < 2:
    return 0
  transposed = _Attr(op, 'transpose_a') or _Attr(op, 'adj_x')
  k = a[-2] if transposed else a[-1]
  return 0 if k is None else 2 * out * k


def _Einsum(op: tf.Operation) -> int:
  """2 x the product of every index's size (a contraction of two
  operands: each output element sums over the indices it lacks)."""
  equation = tf.compat.as_str(op.get_attr('equation')).replace(' ', '')
  if '.' in equation:
    return 0
  specs = equation.split('->')[0].split(',')
  sizes = {}
  for spec, x in zip(specs, op.inputs):
    if x.shape.rank != len(spec):
      return 0
    for letter, size in zip(spec, x.shape.as_list()):
      if size is None:
        return 0
      sizes[letter] = size
  return 2 * math.prod(sizes.values())


def _Conv(op: tf.Operation, out: tf.Tensor, kernel: tf.TensorShape) -> int:
  """2 x `out`'s elements x the kernel's taps per output element."""
  elements = _Elements(out.shape)
  if elements is None or kernel.rank is None or not kernel.is_fully_defined():
    return 0
  taps = kernel.as_list()[:-1]  # Spatial sizes x input channels.
  if op.type.startswith('DepthwiseConv2dNative'):
    taps = taps[:-1]  # Each channel convolved on its own.
  return 2 * elements * math.prod(taps)


def _OpFlops(op: tf.Operation) -> int:
  kind = op.type
  if kind in _MATMULS:
    return _MatMul(op)
  if kind == 'Einsum':
    return _Einsum(op)
  if kind in _CONVS:
    return _Conv(op, op.outputs[0], op.inputs[1].shape)
  if kind in _CONV_INPUT_GRADS:  # (input sizes, filter, output gradient)
    return _Conv(op, op.inputs[2], op.inputs[1].shape)
  if kind in _CONV_FILTER_GRADS:  # The filter's gradient has its shape.
    return _Conv(op, op.inputs[2], op.outputs[0].shape)
  called = shared_trace.CalledGraph(op)
  if called is not None:
    name = tf.compat.as_str(op.get_attr('f').name)
    if name not in _CALLED:
      _CALLED[name] = Flops(called)
    return _CALLED[name]
  return 0


def Flops(graph: tf.Graph) -> int:
  """The FLOPs one call of `graph` computes (see the module)."""
  return sum(_OpFlops(op) for op in graph.get_operations())
