"""Where a step's Python tracing goes: the seconds spent in each part of the engine, each counted once.

``Parts()`` wraps the functions that build a pipelined step's graph, for as
long as it is entered, and adds up the wall time spent in each, less the
time of the wrapped functions it called (so nothing is counted twice):

  * spec traces: a cell's forward traced alone for the specs of its
    outputs (cell_program.OutputsOf, in trees before 2026-11-29's stop 56;
    since, each forward is traced once, in its program);
  * cell programs: a cell's forward and backward traced as one program
    (cell_program.CellProgram, its pieces apart; its backward's part, a
    deferred program's Finish, counted here too);
  * pieces: the program's pieces cut out (CellProgram._Prune);
  * tick graph: the tick program built into the step (interpreter.Run);
  * optimizer: the Keras optimizer's update of every variable
    (apply_gradients).

What is not in a part (the step's own code, a plain model's forward and
gradient, the engine's other steps) is ``rest``: the tracing time less the
parts. A tree that lacks a function leaves its part at 0.

    with tracing_parts.Parts() as parts:
      step.get_concrete_function()
    parts.seconds  # {'spec traces': ..., ...}
"""

from __future__ import annotations

import functools
import importlib
import time
from typing import Any, Callable

__all__ = ['LEGACY', 'PARTS', 'Parts']

# (part, module, attribute path) of each wrapped function.
PARTS = (
    ('spec traces', 'gpipe_tf.pipeline.cell_program', 'OutputsOf'),
    ('cell programs', 'gpipe_tf.pipeline.cell_program',
     'CellProgram.__init__'),
    ('cell programs', 'gpipe_tf.pipeline.cell_program',
     'CellProgram.Finish'),
    ('pieces', 'gpipe_tf.pipeline.cell_program', 'CellProgram._Prune'),
    ('tick graph', 'gpipe_tf.pipeline.interpreter', 'Run'),
    ('optimizer', 'keras.src.optimizers.base_optimizer',
     'BaseOptimizer.apply_gradients'),
)


# Parts only older trees have (kept to compare them with this one).
LEGACY = frozenset({'spec traces'})


class Parts:
  """A context that counts each part's exclusive seconds (module docstring).

  Attributes:
    seconds: per part, its seconds so far.
  """

  def __init__(self, parts: tuple = PARTS) -> None:
    self._parts = parts
    self.seconds = dict.fromkeys((name for name, _, _ in parts), 0.0)
    self._stack: list[float] = []  # Per open call, its callees' seconds.
    self._restore: list[tuple[Any, str, Any]] = []

  def _Wrapped(self, name: str, fn: Callable) -> Callable:

    @functools.wraps(fn)
    def _Timed(*args, **kwargs):
      start = time.perf_counter()
      self._stack.append(0.0)
      try:
        return fn(*args, **kwargs)
      finally:
        took = time.perf_counter() - start
        self.seconds[name] += took - self._stack.pop()
        if self._stack:
          self._stack[-1] += took

    return _Timed

  def __enter__(self) -> 'Parts':
    for name, module, path in self._parts:
      try:
        owner = importlib.import_module(module)
      except ImportError:
        continue
      *owners, attr = path.split('.')
      for o in owners:
        owner = getattr(owner, o, None)
      if owner is None or not hasattr(owner, attr):
        continue  # An older tree.
      original = owner.__dict__[attr] if isinstance(owner, type) else (
          getattr(owner, attr))
      self._restore.append((owner, attr, original))
      setattr(owner, attr, self._Wrapped(name, original))
    return self

  def __exit__(self, *exc) -> None:
    for owner, attr, original in reversed(self._restore):
      setattr(owner, attr, original)
    self._restore.clear()
