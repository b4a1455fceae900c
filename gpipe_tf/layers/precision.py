"""Mixed precision: layers compute in 16 bits from float32 master variables (Keras's policy names).

A policy is in force inside ``Policy(name)``::

    'float32'          everything in float32 (the default)
    'mixed_bfloat16'   math and activations in bfloat16, variables float32
    'mixed_float16'    math and activations in float16, variables float32;
                       train with a loss scale (dynamic: Keras's
                       LossScaleOptimizer) so small gradients do not vanish

``core.RunSequence`` (behind SequentialLayer and every pipeline cell) runs
each layer through ``RunLayer``: float inputs are cast to the compute dtype
and, while the layer runs, its float variables (and its sublayers') read as
compute-dtype casts of the float32 masters, so gradients flow to the masters
in float32. Layers whose statistics need float32 (``KEEP_FLOAT32 = True``:
BatchNorm, LayerNorm) run in float32 on float32 inputs and hand their output
back in the compute dtype. The loss is computed in float32 (the pipeline's
loss head casts the outputs up).

This module deliberately does NOT wrap variables or change what they are:
checkpoints, optimizers and variable paths are those of float32 training.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from gpipe_tf import errors

__all__ = ['POLICIES', 'AsLayerInputs', 'ComputeDtype', 'CurrentPolicy',
           'Policy', 'PolicyError', 'RunLayer', 'ToFloat32']

POLICIES = {'float32': tf.float32, 'mixed_bfloat16': tf.bfloat16,
            'mixed_float16': tf.float16}

_POLICY: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_precision_policy', default='float32')


class PolicyError(errors.Error, ValueError):
  """An unknown mixed-precision policy name."""


def ComputeDtype(policy: str) -> tf.DType:
  """The dtype layers compute in under `policy`."""
  if policy not in POLICIES:
    raise PolicyError(f'Unknown precision policy {policy!r}; use one of '
                      f'{sorted(POLICIES)}.')
  return POLICIES[policy]


def CurrentPolicy() -> str:
  """The policy in force ('float32' outside every Policy scope)."""
  return _POLICY.get()


@contextlib.contextmanager
def Policy(policy: str | None) -> Iterator[str]:
  """Layers run inside compute under `policy` (None: keep the one in force)."""
  if policy is None:
    yield CurrentPolicy()
    return
  ComputeDtype(policy)
  token = _POLICY.set(policy)
  try:
    yield policy
  finally:
    _POLICY.reset(token)


def _Cast(xs: tuple, dtype: tf.DType) -> tuple:
  return tuple(tf.cast(x, dtype) if isinstance(x, tf.Tensor) and
               x.dtype.is_floating and x.dtype != dtype else x for x in xs)


def AsLayerInputs(layer: Any, xs: Sequence[Any]) -> list:
  """The flat tensors `xs` cast as RunLayer casts `layer`'s inputs under
  the policy in force (unchanged under float32, and for a KEEP_FLOAT32
  layer). A pipeline casts its inputs so before it splits them into
  micro-batches, so that the micro-batches it holds are 16-bit."""
  policy = CurrentPolicy()
  if policy == 'float32' or getattr(layer, 'KEEP_FLOAT32', False):
    return list(xs)
  return list(_Cast(tuple(xs), POLICIES[policy]))


def ToFloat32(x: Any) -> Any:
  """`x` (any nest) with its 16-bit float tensors cast to float32."""
  return tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32) if isinstance(t, tf.Tensor) and
      t.dtype in (tf.bfloat16, tf.float16) else t, x)


@contextlib.contextmanager
def _ReadAs(module: tf.Module, dtype: tf.DType) -> Iterator[None]:
  """Inside, the float variables that `module` and its submodules hold as
  attributes read as `dtype` casts (object attributes are swapped, not
  tracked, and put back)."""
  swapped = []
  for owner in [module] + list(module.submodules):
    for name, value in list(vars(owner).items()):
      if (isinstance(value, tf.Variable) and value.trainable and
          value.dtype.is_floating and value.dtype != dtype):
        swapped.append((owner, name, value))
        object.__setattr__(owner, name, tf.cast(value, dtype))
  try:
    yield
  finally:
    for owner, name, value in swapped:
      object.__setattr__(owner, name, value)


def RunLayer(layer: Any, fprop: Callable[..., Any], xs: tuple) -> Any:
  """fprop(*xs) under the policy in force (see the module docstring)."""
  policy = CurrentPolicy()
  if policy == 'float32':
    return fprop(*xs)
  dtype = POLICIES[policy]
  if getattr(layer, 'KEEP_FLOAT32', False):
    out = fprop(*_Cast(xs, tf.float32))
    return tf.nest.map_structure(
        lambda t: tf.cast(t, dtype) if isinstance(t, tf.Tensor) and
        t.dtype == tf.float32 else t, out)
  with _ReadAs(layer, dtype):
    return fprop(*_Cast(xs, dtype))
