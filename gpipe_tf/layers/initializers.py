"""Weight initialisers declared by Params and drawn deterministically from a seed."""

from __future__ import annotations

import math
import zlib
from typing import Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import hyperparams

__all__ = ['Constant', 'Draw', 'Gaussian', 'METHODS', 'Uniform',
           'UnknownInitMethodError', 'WeightInit', 'Xavier', 'path_seed']

METHODS = ('xavier', 'gaussian', 'uniform', 'constant', 'gaussian_sqrt_fanin',
           'uniform_sqrt_fanin')


class UnknownInitMethodError(errors.Error, ValueError):
  """An initialiser's method is none of METHODS."""


def WeightInit(method: str = 'xavier', scale: float = 1.0) -> hyperparams.Params:
  """Returns Params describing an initialiser.

  Methods (``scale`` multiplies each):
    xavier:              Glorot uniform, limit = scale * sqrt(6 / (fan_in + fan_out)).
    gaussian:            normal with stddev = scale.
    uniform:             uniform in [-scale, scale].
    constant:            every element equals scale.
    gaussian_sqrt_fanin: normal with stddev = scale / sqrt(fan_in).
    uniform_sqrt_fanin:  uniform in +-scale * sqrt(3 / fan_in) (unit variance
                         output for unit variance input when scale = 1).
  """
  if method not in METHODS:
    raise UnknownInitMethodError(
        f'Unknown init method {method!r}; use one of {METHODS}.')
  p = hyperparams.Params()
  p.Define('method', method, 'One of ' + ', '.join(METHODS) + '.')
  p.Define('scale', float(scale), 'Multiplier of the initialiser.')
  return p


def Xavier(scale: float = 1.0) -> hyperparams.Params:
  return WeightInit('xavier', scale)


def Gaussian(scale: float = 1.0) -> hyperparams.Params:
  return WeightInit('gaussian', scale)


def Uniform(scale: float = 1.0) -> hyperparams.Params:
  return WeightInit('uniform', scale)


def Constant(scale: float = 0.0) -> hyperparams.Params:
  return WeightInit('constant', scale)


def _fans(shape: Sequence[int]) -> tuple[int, int]:
  """fan_in, fan_out of a weight: the last dim is fan_out, the rest fan_in."""
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return int(shape[0]), int(shape[0])
  receptive = math.prod(int(d) for d in shape[:-2]) if len(shape) > 2 else 1
  return int(shape[-2]) * receptive, int(shape[-1]) * receptive


def path_seed(path: str, seed: int | None) -> tf.Tensor:
  """A stateless seed pair from a variable path and an optional user seed.

  The same path and seed always give the same values, whatever order variables
  are created in, so a model built twice (or split into pipeline cells) starts
  from the same weights when its variable paths match.
  """
  return tf.constant([0 if seed is None else int(seed),
                      zlib.crc32(path.encode('utf-8'))], dtype=tf.int64)


def Draw(init: hyperparams.Params, shape: Sequence[int], dtype: tf.DType,
         seed: tf.Tensor) -> tf.Tensor:
  """Draws a tensor of `shape` from the initialiser `init`."""
  shape = [int(d) for d in shape]
  method, scale = init.method, float(init.scale)
  fan_in, fan_out = _fans(shape)
  if method == 'constant':
    return tf.fill(shape, tf.cast(scale, dtype))
  if method in ('gaussian', 'gaussian_sqrt_fanin'):
    std = scale if method == 'gaussian' else scale / math.sqrt(max(fan_in, 1))
    return tf.random.stateless_normal(shape, seed, stddev=std, dtype=dtype)
  if method == 'xavier':
    limit = scale * math.sqrt(6.0 / max(fan_in + fan_out, 1))
  elif method == 'uniform':
    limit = scale
  elif method == 'uniform_sqrt_fanin':
    limit = scale * math.sqrt(3.0 / max(fan_in, 1))
  else:
    raise UnknownInitMethodError(
        f'Unknown init method {method!r}; use one of {METHODS}.')
  return tf.random.stateless_uniform(shape, seed, -limit, limit, dtype=dtype)
