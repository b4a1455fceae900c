"""KerasOpLayer, KerasInputs, KerasOutputs: the parts of a Keras graph that are not layers.

A Keras functional model also holds operation nodes: ``x + y``, ``x[:, 0]``
or any ``keras.ops`` call on Keras tensors, an Operation object (its class
and ``get_config()``) called on tensors and constants. ``KerasOpLayer`` runs
one such call as a layer of a chain: Params hold the operation's class path,
its config, and its call's arguments as a text-writable template in which an
input tensor is ``{'__input__': i}`` (FProp input i), a slice
``{'__slice__': [start, stop, step]}``, ``...`` ``{'__ellipsis__': 1}`` and
a NumPy or tensor constant (Gemma's embedding scale, at most
MAX_ARRAY_ELEMENTS elements) its numbers,
``{'__array__': {'value': [...], 'dtype': 'float32'}}``::

    x * 2.0              op 'keras.src.ops.numpy.Multiply',
                         args [{'__input__': 0}, 2.0]
    x[:, 0, :]           op 'keras.src.ops.core.GetItem', args
                         [{'__input__': 0}, ({'__slice__': [None, None,
                         None]}, 0, {'__slice__': [None, None, None]})]

``KerasInputs`` heads a chain over a model with several inputs: it takes
them as Keras does (a dict keyed by input name, or positionally in the
model's order when the model's inputs are a list) and hands them on flat.
``KerasOutputs`` ends a chain whose model has several outputs: it packs the
flat tensors into the model's output structure (list or dict).

These layers have no variables; they deliberately do NOT run operations with
random numbers or state (they have none in ``keras.ops``).
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import keras_layer

__all__ = ['DecodeArguments', 'EncodeArguments', 'KerasInputs',
           'KerasInputsError', 'KerasOpLayer', 'KerasOutputs',
           'ResolveKerasOp']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape

_INPUT, _SLICE, _ELLIPSIS = '__input__', '__slice__', '__ellipsis__'
_ARRAY = '__array__'
# The most elements an array constant is written out with; a bigger one
# belongs in a weight.
MAX_ARRAY_ELEMENTS = 4096
_LITERALS = (type(None), bool, int, float, str)


class KerasInputsError(keras_layer.KerasLayerError):
  """Inputs fed to an imported Keras model by the wrong names, number or dtype."""


def ResolveKerasOp(name: str) -> type:
  """The Keras Operation class an importable path names.

  Raises:
    UnknownKerasClassError: `name` names no Keras Operation class.
  """
  module_name, _, attr = str(name).rpartition('.')
  try:
    cls = getattr(importlib.import_module(module_name), attr, None)
  except (ImportError, ValueError):
    cls = None
  if not (isinstance(cls, type) and issubclass(cls, keras.Operation)):
    raise keras_layer.UnknownKerasClassError(
        f'op {name!r} is not an importable Keras Operation class, e.g. '
        "'keras.src.ops.numpy.Add'.")
  return cls


def EncodeArguments(value: Any, index: Any, where: str) -> Any:
  """`value` (a call's argument) as a text-writable template.

  Args:
    value: any nest of Keras tensors and constants.
    index: Keras tensor -> FProp input index.
    where: names the argument in errors.

  Raises:
    UnsupportedKerasLayerError: a constant Params cannot hold as text.
  """
  if isinstance(value, keras.KerasTensor):
    return {_INPUT: index(value)}
  if isinstance(value, slice):
    return {_SLICE: [EncodeArguments(v, index, where)
                     for v in (value.start, value.stop, value.step)]}
  if value is Ellipsis:
    return {_ELLIPSIS: 1}
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, (np.ndarray, tf.Tensor)) and not isinstance(
      value, keras.KerasTensor):
    return _EncodeArray(value, where)
  if isinstance(value, (list, tuple)):
    return type(value)(EncodeArguments(v, index, where) for v in value)
  if isinstance(value, dict) and all(isinstance(k, str) for k in value):
    return {k: EncodeArguments(v, index, where) for k, v in value.items()}
  if isinstance(value, _LITERALS):
    return value
  raise keras_layer.UnsupportedKerasLayerError(
      f'{where} holds a {type(value).__name__}, which Params cannot hold as '
      'text: pass tensors, numbers, strings, slices or lists of them (make '
      'an array constant a keras.Input or a layer weight).')


def _EncodeArray(value: Any, where: str) -> dict:
  try:
    array = np.asarray(value)
  except (TypeError, ValueError, NotImplementedError) as e:  # Symbolic.
    raise keras_layer.UnsupportedKerasLayerError(
        f'{where} holds a {type(value).__name__} with no value ({e}): make '
        'it a keras.Input or a layer weight.') from e
  if array.size > MAX_ARRAY_ELEMENTS:
    raise keras_layer.UnsupportedKerasLayerError(
        f'{where} holds a constant array of {array.size} elements, more than '
        f'the {MAX_ARRAY_ELEMENTS} Params write out as numbers: make it a '
        'keras.Input or a layer weight.')
  return {_ARRAY: {'value': array.tolist(), 'dtype': array.dtype.name}}


def DecodeArguments(template: Any, xs: Sequence[Any]) -> Any:
  """The argument `template` (EncodeArguments) stands for, inputs `xs`."""
  if isinstance(template, dict):
    if set(template) == {_INPUT}:
      return xs[template[_INPUT]]
    if set(template) == {_SLICE}:
      return slice(*[DecodeArguments(v, xs) for v in template[_SLICE]])
    if set(template) == {_ELLIPSIS}:
      return Ellipsis
    if set(template) == {_ARRAY}:
      return np.asarray(template[_ARRAY]['value'],
                        dtype=template[_ARRAY]['dtype'])
    return {k: DecodeArguments(v, xs) for k, v in template.items()}
  if isinstance(template, (list, tuple)):
    return type(template)(DecodeArguments(v, xs) for v in template)
  return template


def _Used(template: Any) -> list[int]:
  if isinstance(template, dict):
    if set(template) == {_INPUT}:
      return [template[_INPUT]]
    return [i for v in template.values() for i in _Used(v)]
  if isinstance(template, (list, tuple)):
    return [i for v in template for i in _Used(v)]
  return []


class KerasOpLayer(base_layer.BaseLayer):
  """One call of a Keras Operation (``x + y``, ``keras.ops.*``) as a layer.

  FProp(*inputs) calls the operation on ``args`` and ``kwargs`` with the
  inputs put in (module docstring) and returns its outputs (flattened), then
  the inputs named in ``passthrough``.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('op', None,
             "The Operation class's importable path, e.g. "
             "'keras.src.ops.numpy.Add'.")
    p.Define('config', {}, "The operation's get_config() (literals).")
    p.Define('input_shapes', None,
             'One shape per FProp input, batch dimension first.')
    p.Define('input_dtypes', None,
             'One dtype name per FProp input (None: float32), for the '
             'shapes the cost estimate infers.')
    p.Define('args', [], 'The positional arguments: a template (module '
             "docstring), e.g. [{'__input__': 0}, 2.0].")
    p.Define('kwargs', {}, 'The keyword arguments: a template.')
    p.Define('passthrough', [],
             'FProp input indices returned unchanged after the outputs.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    self._op = _Build(p)

  def FProp(self, *inputs: Any, training: bool = False) -> Any:
    """The operation's outputs, then the ``passthrough`` inputs."""
    p = self.p
    y = self._op(*DecodeArguments(list(p.args), inputs),
                 **DecodeArguments(dict(p.kwargs), inputs))
    outs = tuple(tf.nest.flatten(y)) + tuple(inputs[i] for i in p.passthrough)
    return core.FromTuple(outs)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Shape
                ) -> LayerMeta:
    """Output shapes from Keras; costs one FLOP per input and output
    element."""
    shapes = [tuple(s) for s in input_shapes] or [
        tuple(s) for s in p.input_shapes or ()]
    dtypes = list(p.input_dtypes or [None] * len(shapes))
    dtypes += [None] * (len(shapes) - len(dtypes))
    op = _Build(p, len(shapes))
    xs = [keras.KerasTensor(s, dtype=d or 'float32')
          for s, d in zip(shapes, dtypes)]
    y = op(*DecodeArguments(list(p.args), xs),
           **DecodeArguments(dict(p.kwargs), xs))
    outs = [tuple(t.shape) for t in tf.nest.flatten(y)]
    flops = sum(base_layer.NumElements(s) for s in list(shapes) + outs)
    return LayerMeta(int(flops), tuple(outs) + tuple(
        shapes[i] for i in p.passthrough), 0)


def _Build(p: hyperparams.Params, num_inputs: int | None = None
           ) -> keras.Operation:
  """The Operation of `p`, after checking its routing."""
  n = len(p.input_shapes or ()) if num_inputs is None else num_inputs
  bad = [i for i in _Used(list(p.args)) + _Used(dict(p.kwargs)) +
         list(p.passthrough)
         if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
  if bad:
    raise base_layer.LayerConfigError(
        f"KerasOpLayer '{p.name}': args, kwargs and passthrough refer to its "
        f'{n} inputs (input_shapes) by index, got {bad}.')
  cls = ResolveKerasOp(p.op)
  try:
    return cls.from_config(dict(p.config))
  except (TypeError, ValueError) as e:
    raise keras_layer.UnsupportedKerasLayerError(
        f"KerasOpLayer '{p.name}': {cls.__name__}.from_config failed ({e}); "
        'write the operation as a Keras layer.') from e


class KerasInputs(base_layer.BaseLayer):
  """The inputs of an imported Keras model, taken as Keras takes them.

  FProp(inputs) with one dict takes its values by ``names`` (every name,
  no other key); FProp(*inputs) takes them in ``names`` order, unless
  ``by_name_only`` (a model built on a dict of inputs: two inputs of one
  shape and dtype could be swapped unnoticed). Returns them flat, in
  ``names`` order.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('names', [], "The model's input names, in its inputs' order.")
    p.Define('by_name_only', False,
             'Refuse positional inputs (the model takes a dict).')
    p.Define('input_shapes', None, 'One shape per input, in names order.')
    p.Define('input_dtypes', None, 'One dtype name per input.')
    return p

  def FProp(self, *inputs: Any, training: bool = False) -> Any:
    p = self.p
    names = list(p.names)
    if len(inputs) == 1 and isinstance(inputs[0], dict):
      given = inputs[0]
      missing = [n for n in names if n not in given]
      extra = sorted(str(k) for k in given if k not in names)
      if missing or extra:
        raise KerasInputsError(
            f"'{self.path}' takes inputs {names}; missing {missing}, "
            f'unknown {extra}: key the dict by these names.')
      xs = [given[n] for n in names]
    elif p.by_name_only and len(names) > 1:
      raise KerasInputsError(
          f"'{self.path}' takes a dict of inputs keyed by {names} (its Keras "
          f'model takes a dict), not {len(inputs)} positional inputs: '
          'feed {name: tensor}.')
    elif len(inputs) != len(names):
      raise KerasInputsError(
          f"'{self.path}' takes {len(names)} inputs {names} (in this order, "
          f'or as a dict keyed by them), got {len(inputs)}.')
    else:
      xs = list(inputs)
    for name, x, dtype in zip(names, xs, p.input_dtypes or [None] * len(xs)):
      got = getattr(x, 'dtype', None)
      if dtype is None or got is None:
        continue
      want = tf.as_dtype(dtype)
      if (tf.as_dtype(got).is_floating, tf.as_dtype(got).is_integer) != (
          want.is_floating, want.is_integer):
        raise KerasInputsError(
            f"'{self.path}' input {name!r} is {want.name} in the Keras model "
            f'but got {tf.as_dtype(got).name}: feed it as {want.name} (are '
            'two inputs swapped?).')
    return core.FromTuple(tuple(xs))

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Shape
                ) -> LayerMeta:
    shapes = tuple(tuple(s) for s in input_shapes) or tuple(
        tuple(s) for s in p.input_shapes)
    return LayerMeta(0, shapes, 0)


class KerasOutputs(base_layer.BaseLayer):
  """Packs the flat tensors a chain ends with into a model's outputs.

  ``structure`` is the model's output structure, a template (module
  docstring) of FProp's inputs, e.g. ``{'pooled_output': {'__input__': 0},
  'sequence_output': {'__input__': 1}}``.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('structure', None,
             'The outputs: a list or dict template of FProp inputs.')
    p.Define('input_shapes', None, 'One shape per FProp input.')
    return p

  def FProp(self, *inputs: Any, training: bool = False) -> Any:
    return DecodeArguments(self.p.structure, inputs)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Shape
                ) -> LayerMeta:
    shapes = tuple(tuple(s) for s in input_shapes) or tuple(
        tuple(s) for s in p.input_shapes)
    return LayerMeta(0, tuple(shapes[i] for i in _Used(p.structure)), 0)
