"""Skips: tensors a layer stashes under a name for a later layer of the same sequence to pop (torchgpipe's stash/pop).

Every layer's Params have ``stash`` and ``pop`` (base_layer.BaseLayer)::

    enc1  stash=('s1',)   returns (h, s)  ->  h flows on, s is stashed as 's1'
    ...                                       (layers in between never see s)
    dec1  pop=('s1',)     gets (x, s)     ->  the popped tensors are appended
                                              to the inputs, in pop's order

A layer with ``stash=names`` has its last ``len(names)`` outputs taken out of
the flow and kept under those names; a layer with ``pop=names`` gets the
tensors kept under them appended to its inputs. Each name is stashed once and
popped once, by a later layer of the same list (``Check``). SequentialLayer
(core.RunSequence) is the reference; a PipeliningLayer sends a skip that
crosses cells from the stashing cell's device straight to the popping cell's
(docs/pipeline.md, "Skips").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from gpipe_tf import errors

__all__ = ['Check', 'Crossing', 'Names', 'NothingStashedError', 'Pop',
           'PopWithoutStashError', 'Skip', 'SkipError', 'Stash',
           'StashNeverPoppedError', 'StashedTwiceError']


class SkipError(errors.Error, ValueError):
  """A layer list's stash/pop names do not pair up (one of the errors below),
  or a layer returns fewer outputs than it stashes."""


class PopWithoutStashError(SkipError):
  """A layer pops a name no earlier layer stashed (or one already popped)."""


class StashedTwiceError(SkipError):
  """Two layers (or one layer twice) stash the same name."""


class StashNeverPoppedError(SkipError):
  """A layer stashes a name no later layer pops."""


class NothingStashedError(SkipError):
  """At run time, a layer pops a name under which nothing is stashed: its
  layer list was run without ``Check`` (the Params validation of
  SequentialLayer and PipeliningLayer)."""


@dataclasses.dataclass(frozen=True)
class Skip:
  """One stashed tensor: its name and the indices of the layers that stash
  and pop it."""
  name: str
  stasher: int
  popper: int


def Names(p: Any, which: str) -> tuple[str, ...]:
  """A layer Params' ``stash`` or ``pop`` names (a tuple; () if it has none)."""
  names = getattr(p, which, None) if p is not None else None
  if not names:
    return ()
  if isinstance(names, str):
    return (names,)
  return tuple(names)


def _Name(p: Any, i: int) -> str:
  return f"layer {i} '{getattr(p, 'name', p)}'"


def Check(layer_params: Sequence[Any]) -> tuple[Skip, ...]:
  """The skips of a list of layer Params, in stash order.

  Raises:
    PopWithoutStashError: a pop of a name no earlier layer stashed.
    StashedTwiceError: a name stashed twice.
    StashNeverPoppedError: a name no later layer pops.
  """
  stashed: dict[str, int] = {}
  popped: dict[str, int] = {}
  for i, p in enumerate(layer_params):
    for name in Names(p, 'pop'):
      if name in popped:
        raise PopWithoutStashError(
            f"{_Name(p, i)} pops {name!r}, which "
            f'{_Name(layer_params[popped[name]], popped[name])} already '
            'popped: a stashed tensor is popped once. Stash it again under '
            'another name (the first popper returns it and stashes it) or '
            'pop it in one layer.')
      if name not in stashed:
        raise PopWithoutStashError(
            f'{_Name(p, i)} pops {name!r}, but no earlier layer stashes it: '
            f"add {name!r} to the Params stash of the layer that makes the "
            'tensor, before this one, or remove it from this pop.')
      popped[name] = i
    for name in Names(p, 'stash'):
      if name in stashed:
        raise StashedTwiceError(
            f'{_Name(p, i)} stashes {name!r}, which '
            f'{_Name(layer_params[stashed[name]], stashed[name])} stashes '
            'too: give each stashed tensor its own name.')
      stashed[name] = i
  never = [n for n in stashed if n not in popped]
  if never:
    raise StashNeverPoppedError(
        'stashed but never popped: ' + ', '.join(
            f'{n!r} by {_Name(layer_params[stashed[n]], stashed[n])}'
            for n in never) +
        '. Pop each in a later layer (its Params pop) or drop it from the '
        'stash (and from the outputs of the layer that makes it).')
  return tuple(Skip(n, i, popped[n]) for n, i in stashed.items())


def Crossing(skips: Sequence[Skip], balance: Sequence[int]
             ) -> tuple[tuple[str, int, int], ...]:
  """(name, stashing cell, popping cell) of each skip whose stash and pop
  fall in different cells of `balance` (layers per cell); a skip inside one
  cell stays in it."""
  cell_of = [c for c, n in enumerate(balance) for _ in range(n)]
  return tuple((s.name, cell_of[s.stasher], cell_of[s.popper])
               for s in skips if cell_of[s.stasher] != cell_of[s.popper])


def Pop(p: Any, xs: tuple, stashed: dict) -> tuple:
  """`xs` with the tensors a layer of Params `p` pops appended (taken out
  of `stashed`).

  Raises:
    NothingStashedError: a name `p` pops is not in `stashed`.
  """
  names = Names(p, 'pop')
  missing = [n for n in names if n not in stashed]
  if missing:
    raise NothingStashedError(
        f"layer '{getattr(p, 'name', p)}' pops {missing} but nothing is "
        f'stashed under {"that name" if len(missing) == 1 else "those names"}'
        f' (stashed now: {sorted(stashed)}): no layer before it stashed it, '
        'or it was popped already. Run the layer list through skips.Check '
        '(SequentialLayer and PipeliningLayer Params do) to find the '
        'mismatch, and stash each name in an earlier layer.')
  return tuple(xs) + tuple(stashed.pop(n) for n in names)


def Stash(p: Any, outputs: tuple, stashed: dict, what: str = 'outputs'
          ) -> tuple:
  """`outputs` without the last ones a layer of Params `p` stashes (put
  into `stashed` under its names).

  Raises:
    SkipError: the layer returns fewer outputs than it stashes.
  """
  names = Names(p, 'stash')
  if not names:
    return tuple(outputs)
  if len(outputs) < len(names):
    raise SkipError(
        f"layer '{getattr(p, 'name', p)}' stashes {list(names)} but returns "
        f'{len(outputs)} {what}: a layer stashes its last len(stash) outputs, '
        'so return the stashed tensors after the ones that flow on.')
  keep = len(outputs) - len(names)
  stashed.update(zip(names, tuple(outputs)[keep:]))
  return tuple(outputs)[:keep]
