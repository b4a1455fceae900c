"""The named errors of bringing Keras layers and models into gpipe_tf."""

from gpipe_tf import errors

__all__ = ['KerasInputShapeError', 'KerasLambdaError', 'KerasLayerError',
           'KerasPrecisionError', 'KerasWeightsError', 'UnknownKerasClassError',
           'UnsupportedKerasLayerError']


class KerasLayerError(errors.Error, ValueError):
  """Base of the errors raised while bringing Keras layers into gpipe_tf."""


class UnknownKerasClassError(KerasLayerError):
  """``keras_class`` names no importable or registered Keras layer class."""


class KerasInputShapeError(KerasLayerError):
  """A Keras layer (or model) lacks the input shapes needed to build it."""


class UnsupportedKerasLayerError(KerasLayerError):
  """A Keras layer a pipeline could not run exactly, or Params cannot hold."""


class KerasWeightsError(KerasLayerError):
  """Weights copied from a Keras layer that does not match the built layer."""


class KerasPrecisionError(KerasLayerError):
  """A Keras layer's own dtype policy conflicts with the pipeline's."""


class KerasLambdaError(UnsupportedKerasLayerError):
  """A Lambda layer whose function cannot be named in Params (a lambda, a
  nested function): write it as a module-level or registered function."""
