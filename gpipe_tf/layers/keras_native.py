"""Keras BatchNormalization and Dropout as this project's BatchNormLayer and DropoutLayer (see keras_layer's docstring for why)."""

from __future__ import annotations

from typing import Sequence

import keras

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers.keras_errors import UnsupportedKerasLayerError

__all__ = ['NativeParams']

Shape = base_layer.Shape

# Keras initialisers BatchNormLayer starts from (their class names).
_BATCH_NORM_INITS = {'gamma_initializer': 'Ones', 'beta_initializer': 'Zeros',
                     'moving_mean_initializer': 'Zeros',
                     'moving_variance_initializer': 'Ones'}


def NativeParams(p: hyperparams.Params, cls: type, shapes: Sequence[Shape]
                  ) -> hyperparams.InstantiableParams | None:
  """This project's layer standing in for Keras BatchNormalization or
  Dropout (module docstring), or None for every other class."""
  if not issubclass(cls, (keras.layers.BatchNormalization,
                          keras.layers.Dropout)):
    return None
  where = f"KerasLayer '{p.name}' ({cls.__name__})"
  if cls not in (keras.layers.BatchNormalization, keras.layers.Dropout):
    raise UnsupportedKerasLayerError(
        f'{where} subclasses {cls.__mro__[1].__name__}, which is run as this '
        "project's own layer; a subclass's changes would be lost. Use the "
        'Keras class itself.')
  if p.inputs not in (None, [0], (0,)) or p.input_kwargs or p.call_kwargs:
    raise UnsupportedKerasLayerError(
        f'{where} takes one tensor input; set inputs=None or [0] and no '
        'input_kwargs or call_kwargs.')
  c = p.config
  base = dict(random_seed=p.random_seed, dtype=p.dtype)
  if cls is keras.layers.Dropout:
    noise = c.get('noise_shape')
    dims = [i for i, d in enumerate(noise) if d == 1] if noise else None
    return core.DropoutLayer.Params().Set(
        keep_prob=1.0 - float(c.get('rate', 0.0)),
        noise_shape_broadcast_dims=dims, **base)
  rank = len(shapes[0])
  axis = c.get('axis', -1)
  axis = list(axis) if isinstance(axis, (list, tuple)) else [axis]
  problems = [f'{k}={c[k]!r} (use {v!r})' for k, v in (
      ('center', True), ('scale', True), ('renorm', False)) if k in c
              and c[k] != v]
  if [a % rank for a in axis] != [rank - 1]:
    problems.append(f'axis={c.get("axis")!r} (use -1)')
  for key, want in _BATCH_NORM_INITS.items():
    init = c.get(key)
    got = init.get('class_name') if isinstance(init, dict) else init
    if got is not None and str(got).lower() != want.lower():
      problems.append(f'{key}={got!r} (use {want!r})')
  if problems:
    raise UnsupportedKerasLayerError(
        f"{where} runs as gpipe_tf's BatchNormLayer, which needs: "
        + ', '.join(problems) + '.')
  return normalization.BatchNormLayer.Params().Set(
      dim=int(shapes[0][-1]), decay=float(c.get('momentum', 0.99)),
      epsilon=float(c.get('epsilon', 1e-3)),
      cross_replica_normalization=bool(c.get('synchronized', False)), **base)
