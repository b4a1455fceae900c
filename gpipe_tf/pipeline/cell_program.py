"""A cell's training step traced once and cut into the pieces a schedule's steps run: F, B, W, BW and FB.

One graph holds the cell's whole step for one micro-batch: the forward (and,
on the last stage with the loss inside, the loss), then the gradient of the
outputs (or of the loss) with respect to the cell's inputs and every
trainable variable it read. Its ops fall into three sets::

    forward ops  F   everything up to the outputs (and the loss)
    input-grad   B   backward ops the input gradient dx needs
    weight-grad  W   backward ops only the weight gradients dws need

Each piece is that graph pruned (``WrappedFunction.prune``) between a set of
feeds and a set of fetches, so every step computes exactly its share, never
twice::

    F   (keep)   seed, x [, labels]   -> y, BatchNorm sums [, loss sums], saved
    F   (remat)  seed, x [, labels]   -> y, BatchNorm sums [, loss sums], pinned
    BW  (keep)   saved, dy            -> dx, dws
    BW  (remat)  seed, x, dy, pinned  -> dx, dws     (recomputes F's ops)
    B   (keep)   saved, dy            -> dx, wcut
    B   (remat)  seed, x, dy, pinned  -> dx, wcut
    W            wcut                 -> dws
    FB           seed, x, labels      -> everything  (F, loss and backward)

Skips that cross cells ride beside the boundary tensors: every piece that
reads x reads ``skip_in`` (the skips earlier cells stashed for this one),
every piece that makes y makes ``skip_out`` (what this cell stashes for later
ones), every piece that reads dy reads ``dskip_out`` (their gradients, from
the cells that popped them) and every piece that makes dx makes ``dskip_in``.
A recomputing backward recomputes exactly the forward ops its gradients need,
the stashed tensors' included.

``saved`` are the forward tensors the backward reads (the activations a kept
forward stashes), ``wcut`` the tensors the W ops read from outside W (layer
inputs and output gradients, stashed from B to W), ``pinned`` the values of
non-trainable variables (BatchNorm's moving statistics) the forward read, so
that a recomputation reads what its forward read even if they moved since.
Variable reads of trainable variables are not stashed: the pieces read the
variables again (they do not change within a step).

A variable the cell reads several times (in several layers, or in the loss)
is differentiated once: it gets the sum of its uses' gradients. Sparse
gradients (IndexedSlices) are made dense so that they can be summed in a
loop.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import tensorflow as tf

from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import shared_trace
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import graph_edit
from gpipe_tf.pipeline import leaves
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import tf_internals
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


@dataclasses.dataclass(frozen=True)
class Tensors:
  """One micro-batch's tensors of a cell's step, by role: what a program
  traced, what a piece is fed and what it makes. Each field is a tuple with
  None where the program has no tensor (a None input, an integer output's
  gradient); a field a piece neither reads nor makes is empty.

  Attributes:
    seed: the micro-batch's seed (one tensor).
    x: the cell's flat inputs.
    skip_in: the skips it pops that earlier cells stashed (Cell.skip_in).
    labels: the flat labels (last stage, loss inside).
    dy: the gradients of the flat outputs (loss outside, or stages before
      the last).
    dskip_out: the gradients of skip_out, from the cells that popped them.
    pinned: the non-trainable values (BatchNorm's moving statistics) the
      forward read, fed to a recomputing backward.
    saved: the forward tensors a kept forward stashes for its backward.
    wcut: what W reads from B (layer inputs and output gradients).
    y: the flat outputs.
    skip_out: the skips it stashes that later cells pop (Cell.skip_out).
    bn: the BatchNorm sufficient statistics, three per BatchNorm layer.
    sums: the flat loss.Sums (last stage, loss inside).
    dx: the gradients of the flat inputs.
    dskip_in: the gradients of skip_in.
    dws: the gradients of `CellProgram.variables`.
  """
  seed: tuple = ()
  x: tuple = ()
  skip_in: tuple = ()
  labels: tuple = ()
  dy: tuple = ()
  dskip_out: tuple = ()
  pinned: tuple = ()
  saved: tuple = ()
  wcut: tuple = ()
  y: tuple = ()
  skip_out: tuple = ()
  bn: tuple = ()
  sums: tuple = ()
  dx: tuple = ()
  dskip_in: tuple = ()
  dws: tuple = ()

  def Present(self, *roles: str) -> list:
    """The non-None tensors of `roles`, in order."""
    return [x for role in roles for x in getattr(self, role)
            if x is not None]


_ROLES = frozenset(f.name for f in dataclasses.fields(Tensors))


@dataclasses.dataclass(frozen=True)
class ProgramKey:
  """What a cell's program is traced for: programs are cached on the cell
  (Cell.programs) by it."""
  in_struct: str
  in_specs: tuple
  skip_specs: tuple
  training: bool
  head: Any
  input_grads: bool
  dy_present: tuple | None
  dskip_present: tuple | None
  policy: Any
  jit_compile: bool
  split: bool


class LossHead(NamedTuple):
  """The loss computed inside the last stage.

  Attributes:
    loss_fn: (outputs, labels) of one micro-batch -> loss.LossTerms.
    label_struct: the labels' nest structure.
    label_specs: one micro-batch's flat label specs.
    scaled: whether the last label leaf is a loss scale (a float32 scalar)
      the loss is multiplied by before it is differentiated (the reported
      loss sums stay unscaled).
  """
  loss_fn: loss_lib.LossFn
  label_struct: Any
  label_specs: tuple
  scaled: bool = False


@dataclasses.dataclass(frozen=True, eq=False)  # Compared by identity.
class Piece:
  """One pruned piece of a program: piece(feeds) -> what it makes.

  Attributes:
    function: the pruned function.
    reads: the Tensors roles it is fed, in the order it takes them.
    makes: the Tensors roles it returns.
    num_ops: what a call of it adds to a step's graph once inlined.
    traced: the program's traced Tensors (where its outputs are None).
    fed: per role read, whether each of its tensors is fed.
  """
  function: Callable[..., Any]
  reads: tuple[str, ...] = ()
  makes: tuple[str, ...] = ()
  num_ops: int = 0
  traced: Tensors = Tensors()
  fed: tuple[tuple[bool, ...], ...] = ()

  def __call__(self, feeds: Tensors) -> Tensors:
    args = [v for role, fed in zip(self.reads, self.fed)
            for v, f in zip(getattr(feeds, role), fed) if f]
    out = iter(self.function(*args))
    return Tensors(**{
        role: tuple(None if x is None else next(out)
                    for x in getattr(self.traced, role))
        for role in self.makes})


# The W of a cell whose B computed the whole backward: nothing to run.
_NO_PIECE = Piece(lambda: ())


def _RunCell(cell: cell_lib.Cell, structure: Any, seed: tf.Tensor,
             xs: Sequence[Any], skips: Sequence[Any], training: bool
             ) -> tuple[tuple, tuple]:
  # Cells trace their layers as written: where a piece runs inside a
  # folded loop, TensorFlow leaves the shared traces' calls un-inlined and
  # the step ran 2x slower (docs/scale.md).
  with random_seeds.StepSeedScope(seed), shared_trace.Off():
    return cell.Forward(structure, xs, skips, training)


def NestKey(nest: Any) -> str:
  """A hashable key of a nest's structure (its leaves ignored)."""
  return repr(tf.nest.map_structure(lambda _: 0, nest))


def OutputsOf(cell: cell_lib.Cell, in_struct: Any, in_specs: Sequence[Any],
              seed_spec: tf.TensorSpec, training: bool,
              skip_specs: Sequence[Any] = ()) -> tuple[Any, list, list]:
  """(output nest, flat output specs, skip_out specs) of the cell's forward
  on `in_specs` and the skip_in `skip_specs`, from a trace of the forward
  alone (cached on the cell: Cell.outputs)."""
  key = (NestKey(in_struct), tuple(map(repr, in_specs)),
         tuple(map(repr, skip_specs)), training, precision.CurrentPolicy())
  if key not in cell.outputs:

    def _Body(seed, *args):
      xs, skips = leaves.FillEach([in_specs, skip_specs], args)
      with normalization.DeferMovingStats():
        return _RunCell(cell, in_struct, seed, xs, skips, training)

    y, skips = tf_internals.WrapFunction(
        _Body, [seed_spec] + leaves.Present(in_specs) +
        leaves.Present(skip_specs)).structured_outputs
    cell.outputs[key] = (y, _Specs(tf.nest.flatten(y)), _Specs(skips))
  return cell.outputs[key]


def _Dense(grad: Any, shape: tf.TensorShape) -> Any:
  """A variable's gradient as a dense tensor of its shape (None stays)."""
  if grad is None:
    return None
  grad = tf.convert_to_tensor(grad)
  return (grad if grad.shape.is_fully_defined() else
          tf.ensure_shape(grad, shape))


def _Specs(tensors: Sequence[Any]) -> list:
  return [None if t is None else tf.TensorSpec(t.shape, t.dtype)
          for t in tensors]


class CellProgram:
  """A cell's step for one input signature, traced once; see the module.

  Args:
    cell: the cell.
    in_struct: the nest its inputs come in.
    in_specs: one micro-batch's flat input specs (None for a None leaf).
    seed_spec: the micro-batch seed's spec.
    training: training mode; False traces the forward only.
    head: the loss, on the last stage with the loss inside; else the
      backward starts from a gradient fed for every float output.
    input_grads: whether to differentiate the cell's float inputs.
    dy_present: without a head, per flat output whether a gradient is fed
      to it (default: every float output); see OutputsOf for its specs.
    skip_specs: one micro-batch's specs of the skips it pops that earlier
      cells stashed (Cell.skip_in).
    dskip_present: per skip it stashes for later cells (Cell.skip_out),
      whether a gradient is fed to it (default: every float one).
    jit_compile: compile every piece with XLA.
    split: whether a schedule will run this program's backward as B then W
      (else its W pieces are never cut).

  Attributes:
    out_struct, out_specs: the outputs' nest and flat specs.
    bn_layers: the BatchNorm layers whose sufficient statistics `bn` holds.
    variables: the trainable variables `dws` belongs to, each once.
    tensors: the traced Tensors of one micro-batch's step.
  """

  def __init__(self, cell: cell_lib.Cell, in_struct: Any,
               in_specs: Sequence[Any], seed_spec: tf.TensorSpec,
               training: bool, head: LossHead | None = None,
               input_grads: bool = True,
               dy_present: Sequence[bool] | None = None,
               jit_compile: bool = False, split: bool = True,
               skip_specs: Sequence[Any] = (),
               dskip_present: Sequence[bool] | None = None) -> None:
    self.cell = cell
    self.in_struct = in_struct
    self.training = training
    self.head = head
    self.jit_compile = jit_compile
    self.split = split
    self._pieces: dict[tuple, Piece] = {}
    # Per output and per stashed skip, the spec of the gradient fed to it
    # (None where none is).
    dy_specs = dskip_specs = ()
    if training:
      _, out_specs, skip_out = OutputsOf(cell, in_struct, in_specs, seed_spec,
                                         training, skip_specs)
      if dskip_present is None:
        dskip_present = [cell_lib.IsFloat(o) for o in skip_out]
      dskip_specs = [o if p else None for o, p in zip(skip_out, dskip_present)]
      if head is None:
        if dy_present is None:
          dy_present = [cell_lib.IsFloat(o) for o in out_specs]
        dy_specs = [o if p else None for o, p in zip(out_specs, dy_present)]
    # The traced function's arguments: the seed, then these in turn.
    templates = [in_specs, skip_specs, head.label_specs if head else (),
                 dy_specs, dskip_specs]
    self._wrapped = tf_internals.WrapFunction(
        lambda seed, *args: self._Trace(
            seed, *leaves.FillEach(templates, args), input_grads),
        [seed_spec] + [x for t in templates for x in leaves.Present(t)])
    if training:
      self._Cut()

  @functools.cached_property
  def splittable(self) -> bool:
    """Whether W can run apart from B. Where the weight-gradient ops read
    something the cut cannot feed (a control edge into the input-gradient
    ops, say), B computes the whole backward and W nothing: still exact,
    without zero-bubble's overlap. Found on first use (only schedules with
    W ask)."""
    if not (self.training and self.split):
      return False
    try:
      self._pieces[(ticks_lib.W, False, False)] = self._Prune(
          ('wcut',), ('dws',))
    except tf_internals.PRUNE_ERRORS:
      return False
    return True

  # ---- Tracing -------------------------------------------------------------

  def _Trace(self, seed: tf.Tensor, xs: list, skips: list, labels_flat: list,
             dys: list, dskips: list, input_grads: bool) -> list:
    graph = tf.compat.v1.get_default_graph()
    wanted = [self.training and input_grads and cell_lib.IsFloat(x)
              for x in xs]
    wanted_skips = [self.training and cell_lib.IsFloat(x) for x in skips]
    sums_flat = []
    with tf.GradientTape() as tape:
      tape.watch([x for x, w in zip(xs + skips, wanted + wanted_skips) if w])
      with normalization.DeferMovingStats() as stats:
        y, skip_out = _RunCell(self.cell, self.in_struct, seed, xs, skips,
                               self.training)
      flat_y = tf.nest.flatten(y)
      if self.head is not None:
        labels = tf.nest.pack_sequence_as(self.head.label_struct,
                                          labels_flat)
        if self.head.scaled:
          labels, scale = labels
        # The loss in float32, whatever the layers computed in.
        terms = self.head.loss_fn(core.FromTuple(precision.ToFloat32(y)),
                                  labels)
        n = flat_y[0].shape[0] if flat_y and flat_y[0].shape.rank else None
        sums = loss_lib.WeightedSums(terms, n)
        target = sums.loss * scale if self.head.scaled else sums.loss
        sums_flat = tf.nest.flatten(sums)
        self.sums_struct = sums
    self.out_struct = y
    self.out_specs = _Specs(flat_y)
    self.bn_layers, bn = stats.Export()
    self.tensors = Tensors(
        seed=(seed,), x=tuple(xs), skip_in=tuple(skips),
        labels=tuple(labels_flat), y=tuple(flat_y), skip_out=tuple(skip_out),
        bn=tuple(x for stat in bn for x in stat), sums=tuple(sums_flat))
    self._mark = len(graph.get_operations())
    if not self.training:
      return self.tensors.Present('y', 'skip_out')
    self.variables = cell_lib.Unique(
        list(self.cell.variables) +
        [v for v in tape.watched_variables() if v.trainable])
    sources = ([x for x, w in zip(xs, wanted) if w] +
               [x for x, w in zip(skips, wanted_skips) if w] + self.variables)
    # A stashed tensor's gradient from the cell that popped it adds into
    # this cell's backward like an output's (the tape sums both uses).
    pairs = [(o, g) for o, g in
             ([(target, tf.ones_like(target))] if self.head else
              list(zip(flat_y, dys))) + list(zip(skip_out, dskips))
             if g is not None]
    grads = (tape.gradient([o for o, _ in pairs], sources,
                           output_gradients=[g for _, g in pairs])
             if pairs else [None] * len(sources))
    graph_edit.CastsJustInTime(
        graph, graph.get_operations()[self._mark:],
        graph_edit.TrainableReads(graph, self.variables))
    grads = iter(grads)
    self.tensors = dataclasses.replace(
        self.tensors, dy=tuple(dys), dskip_out=tuple(dskips),
        dx=tuple(next(grads) if w else None for w in wanted),
        dskip_in=tuple(next(grads) if w else None for w in wanted_skips),
        dws=tuple(_Dense(g, v.shape) for g, v in zip(grads, self.variables)))
    return self.tensors.Present('dx', 'dskip_in', 'dws', 'y', 'skip_out',
                                'bn', 'sums')

  def _Cut(self) -> None:
    """Finds saved, pinned and wcut (module docstring)."""
    t = self.tensors
    graph = self._wrapped.graph
    ops = graph.get_operations()
    backward = set(ops[self._mark:])
    _ReadsTrainable = graph_edit.TrainableReads(graph, self.variables)

    def _Crossing(consumers):
      """What `consumers` read from outside them that can be stashed (no
      resource, constant or read of a trainable variable)."""
      out, seen = [], set()
      for op in sorted(consumers, key=lambda o: o.name):
        # Every output of a producer: a prune fed one output of an op drops
        # the op, so its others (tf.custom_gradient's IdentityN) must be fed.
        for x in [y for x in op.inputs for y in x.op.outputs]:
          if (x.op not in consumers and id(x) not in seen and
              x.dtype != tf.resource and x.op.type != 'Const' and
              not _ReadsTrainable(x)):
            seen.add(id(x))
            out.append(x)
      return tuple(out)

    dys = {id(g) for g in t.Present('dy', 'dskip_out')}
    need_dx = graph_edit.Ancestors(t.dx + t.dskip_in, backward)
    w_ops = graph_edit.Ancestors(t.dws, backward) - need_dx
    self.tensors = dataclasses.replace(
        t,
        saved=tuple(x for x in _Crossing(backward) if id(x) not in dys),
        # The forward's reads of non-trainable variables.
        pinned=tuple(op.outputs[0] for op in sorted(ops[:self._mark],
                                                    key=lambda o: o.name)
                     if op.type == 'ReadVariableOp' and
                     not _ReadsTrainable(op.outputs[0])),
        wcut=_Crossing(w_ops))

  # ---- Pieces --------------------------------------------------------------
  def Piece(self, step: ticks_lib.Step) -> Piece:
    """The piece `step` runs (its kind, keep and split; the stage is this
    program's cell)."""
    if step.kind == ticks_lib.W and not self.splittable:
      return _NO_PIECE
    key = (step.kind, step.keep, step.split)
    if key not in self._pieces:
      self._pieces[key] = self._Prune(*self._Signature(step))
    return self._pieces[key]

  def _Signature(self, step: ticks_lib.Step
                 ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the roles the step's piece reads, the roles it makes)."""
    loss = self.training and self.head is not None  # Labels: training only.
    x = ('seed', 'x', 'skip_in') + (('labels',) if loss else ())
    if not self.training:
      return x, ('y', 'skip_out')
    if step.kind == ticks_lib.W:
      return ('wcut',), ('dws',)
    if step.kind == ticks_lib.F:
      return x, (('sums',) if loss else ('y',)) + ('skip_out', 'bn') + (
          ('saved',) if step.keep else ('pinned',))
    split = step.kind == ticks_lib.B or (step.kind == ticks_lib.FB and
                                         step.split)
    grads = ('dx', 'dskip_in') + (
        ('wcut',) if split and self.splittable else ('dws',))
    if step.kind == ticks_lib.FB:
      return x, ('bn', 'sums') + grads
    dy = ('dskip_out',) if loss else ('dy', 'dskip_out')
    if step.keep:
      return ('saved',) + dy, grads
    return x + dy + ('pinned',), grads

  def _Prune(self, reads: tuple[str, ...], makes: tuple[str, ...]) -> Piece:
    assert set(reads) | set(makes) <= _ROLES, (reads, makes)
    # A tensor of two roles read (an input also saved, say) is fed once,
    # from the first.
    fed, seen = [], set()
    for role in reads:
      fed.append(tuple(x is not None and id(x) not in seen
                       for x in getattr(self.tensors, role)))
      seen.update(id(x) for x in getattr(self.tensors, role) if x is not None)
    feeds = [x for role, f in zip(reads, fed)
             for x, ok in zip(getattr(self.tensors, role), f) if ok]
    function = self._wrapped.prune(feeds=feeds,
                                   fetches=self.tensors.Present(*makes))
    num_ops = shared_trace.InlinedSize(function.graph)
    if self.jit_compile:
      function = tf.function(lambda *args, f=function: f(*args),
                             jit_compile=True, autograph=False)
    return Piece(function, reads, makes, num_ops, self.tensors, tuple(fed))

  def Specs(self, role: str) -> list:
    """The specs of a role's tensors (None where absent)."""
    return _Specs(getattr(self.tensors, role))
