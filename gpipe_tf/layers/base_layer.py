"""BaseLayer: the tf.Module every gpipe_tf layer derives from, built from Params."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import hyperparams
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import initializers

__all__ = ['BaseLayer', 'CheckMetaLastDim', 'LayerConfigError',
           'LayerInputError', 'LayerMeta', 'NumElements', 'Shape',
           'ShapeMismatchError']

Shape = tuple  # A tuple of ints, None for an unknown dimension.


class LayerInputError(errors.Error, ValueError):
  """A layer got an input whose shape or structure it cannot take."""


class ShapeMismatchError(errors.Error, ValueError):
  """Two consecutive layers disagree on the shape passed between them."""


class LayerConfigError(errors.Error, ValueError):
  """A layer's (or task's) Params hold a value it cannot be built with."""


@dataclasses.dataclass(frozen=True)
class LayerMeta:
  """What FPropMeta reports about a layer, computed without creating variables.

  Attributes:
    flops: forward floating point operations for the given input shapes (a
      multiply-add counts 2; an unknown batch dimension counts as 1, so with a
      None batch this is per example).
    out_shapes: a tuple with one shape per output; feeding it to the next
      layer's FPropMeta chains the estimate.
    num_params: number of parameters (trainable and not).
  """
  flops: int
  out_shapes: tuple
  num_params: int


def NumElements(shape: Sequence[int | None]) -> int:
  """Product of a shape, counting unknown dimensions as 1."""
  return math.prod(1 if d is None else int(d) for d in shape)


def _ModuleName(name: str) -> str:
  name = re.sub(r'\W', '_', name)
  return name if name and not name[0].isdigit() else '_' + name


class BaseLayer(tf.Module):
  """Base class of all layers.

  A layer is built from its Params (``Layer.Params().Set(...).Instantiate()``),
  copies and freezes them (``layer.params``), creates its variables and
  children in ``__init__`` and reads them directly in ``FProp``. Subclasses
  implement ``FProp(*inputs, training=False)`` and the classmethod
  ``FPropMeta(params, *input_shapes)``.

  Variable paths follow the layer tree (``model/encoder/fc/w``) and are the
  same on every run, and so are the initial values (drawn statelessly from the
  path and ``random_seed``).

  A layer deliberately does NOT build lazily from its first input (as Keras
  and Sonnet do): shapes come from Params, so parameter counts and costs can be
  computed for models too large to build.
  """

  # Whether layers of this class with equal Params (apart from the name)
  # share one trace (layers/shared_trace.py): set it on a class whose FProp
  # reads nothing but its Params, its inputs, its variables and its
  # sub-layers' (no Python state set after __init__).
  SHARE_TRACE = False

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', cls.__name__, 'Name of this layer; part of variable paths.')
    p.Define('dtype', 'float32', 'Dtype of variables and activations.')
    p.Define('params_init', initializers.Xavier(1.0),
             'Default initialiser of this layer\'s weights (method, scale).')
    p.Define('random_seed', None,
             'Seed of initialisers and of dropout masks. None: derived from '
             'the layer path (stable across runs).')
    p.Define('stash', (),
             'Names under which the last len(stash) outputs are stashed: '
             'taken out of the flow for a later layer of the same list to '
             'pop (layers/skips.py). A pipeline sends each straight to the '
             'cell that pops it.')
    p.Define('pop', (),
             'Names of tensors an earlier layer of the same list stashed, '
             'appended (in this order) to this layer\'s inputs.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    if not params.name:
      raise LayerConfigError(
          f'{type(self).__name__} needs a non-empty Params.name.')
    super().__init__(name=_ModuleName(params.name))
    p = params.Copy()
    p.Freeze()
    self._params = p
    self._path = f'{parent_path}/{p.name}' if parent_path else p.name
    self._child_names: list[str] = []

  # ---- Properties -------------------------------------------------------
  @property
  def params(self) -> hyperparams.InstantiableParams:
    """This layer's Params (a frozen copy)."""
    return self._params

  @property
  def p(self) -> hyperparams.InstantiableParams:
    return self._params

  @property
  def path(self) -> str:
    """The layer's position in the tree, e.g. 'model/encoder/fc1'."""
    return self._path

  @property
  def fprop_dtype(self) -> tf.DType:
    return tf.as_dtype(self._params.dtype)

  @property
  def layer_seed(self) -> int | tf.Tensor:
    """Integer seed for this layer's stateless randomness (a tensor argument
    while a trace shared by layers of its kind is made: shared_trace.py)."""
    from gpipe_tf.layers import random_seeds  # pylint: disable=g-import-not-at-top
    traced = random_seeds.TracedLayerSeed(self)
    if traced is not None:
      return traced
    base = random_seeds.NameSeed(self._path)
    if self._params.random_seed is None:
      return base
    return (base + 1000003 * int(self._params.random_seed)) % 2**31

  def AddAuxLoss(self, value: Any) -> None:
    """Adds `value` (summed) to the training loss, as Lingvo's aux_loss:
    call it from FProp in training only. The loss that trains the layer
    collects it (aux_losses.Collect; a pipeline weighs it per micro-batch,
    docs/keras.md). Not for a class with SHARE_TRACE: its trace is shared."""
    aux_losses.Add(value, f"layer '{self._path}'")

  # ---- Building ---------------------------------------------------------
  def CreateChild(self, name: str, params: hyperparams.InstantiableParams,
                  path: str | None = None) -> 'BaseLayer':
    """Instantiates `params` as child `name` (also set as attribute `name`)."""
    p = params.Copy()
    p.name = name
    child = p.Instantiate(parent_path=self._path if path is None else path)
    setattr(self, name, child)
    self._child_names.append(name)
    return child

  def CreateChildren(self, name: str,
                     params_list: Sequence[hyperparams.InstantiableParams],
                     path: str | None = None,
                     devices: Sequence[str] | None = None
                     ) -> list['BaseLayer']:
    """Instantiates a list of children, kept as attribute `name` (a list).

    Each child keeps its own ``Params.name`` when set and unique among them,
    else is named ``{name}_{i}``. With `devices`, child i (and so its
    variables) is built under ``tf.device(devices[i])``; without, under
    the caller's device scope (a model built under ``tf.device(d)`` keeps
    its variables on d; ``tf.device(None)`` here moved them to the default
    device).
    """
    names = [p.name for p in params_list]
    children = []
    for i, p in enumerate(params_list):
      p = p.Copy()
      if not p.name or names.count(p.name) > 1:
        p.name = f'{name}_{i}'
      with (tf.device(devices[i]) if devices else contextlib.nullcontext()):
        children.append(
            p.Instantiate(parent_path=self._path if path is None else path))
    setattr(self, name, children)
    self._child_names.append(name)
    return children

  def CreateVariable(self, name: str, shape: Sequence[int],
                     init: hyperparams.Params | None = None,
                     dtype: Any = None, trainable: bool = True) -> tf.Variable:
    """Creates variable `name` (also set as attribute `name`).

    Args:
      name: attribute name and last component of the variable path.
      shape: static shape.
      init: initialiser Params (see initializers.WeightInit); defaults to
        ``params.params_init``.
      dtype: defaults to ``params.dtype``.
      trainable: whether optimisers update it.
    """
    init = self._params.params_init if init is None else init
    dtype = self.fprop_dtype if dtype is None else tf.as_dtype(dtype)
    full = f'{self._path}/{name}'
    seed = initializers.path_seed(full, self._params.random_seed)
    value = initializers.Draw(init, shape, dtype, seed)
    var = tf.Variable(value, name=full, trainable=trainable)
    setattr(self, name, var)
    return var

  # ---- Forward ----------------------------------------------------------
  def FProp(self, *inputs: Any, training: bool = False) -> Any:
    """The forward pass. `training` switches dropout and batch statistics."""
    raise NotImplementedError(f'{type(self).__name__}.FProp')

  def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
    return self.FProp(*inputs, **kwargs)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Shape
               ) -> LayerMeta:
    """Flops, output shapes and parameter count, without creating variables."""
    raise NotImplementedError(f'{cls.__name__}.FPropMeta')

  def NumParams(self) -> int:
    """Number of parameters of the built layer (all variables)."""
    return sum(int(v.shape.num_elements()) for v in self.variables)

  # ---- Helpers for subclasses -------------------------------------------
  def CheckLastDim(self, x: tf.Tensor, expected: int, what: str = 'input'
                   ) -> None:
    """Raises LayerInputError if the static last dimension is not `expected`."""
    last = x.shape[-1] if x.shape.rank else None
    if last is not None and int(last) != int(expected):
      raise LayerInputError(
          f"layer '{self._path}' ({type(self).__name__}) expects {what} of "
          f'shape [..., {expected}] but got {x.shape.as_list()}')


def CheckMetaLastDim(params: hyperparams.Params, shape: Shape,
                     expected: int) -> None:
  """FPropMeta twin of BaseLayer.CheckLastDim."""
  if shape and shape[-1] is not None and int(shape[-1]) != int(expected):
    raise LayerInputError(
        f"layer '{params.name}' ({params.cls.__name__}) expects input of shape "
        f'[..., {expected}] but got {list(shape)}')
