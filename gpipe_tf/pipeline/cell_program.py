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

from typing import Any, NamedTuple, Sequence

import tensorflow as tf

from tensorflow.python.ops import op_selector  # pylint: disable=g-direct-tensorflow-import

from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import graph_edit
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = ['CellProgram', 'LossHead', 'NestKey', 'OutputsOf', 'Piece']

GROUPS = ('seed', 'x', 'labels', 'dy', 'pinned', 'saved', 'wcut',
          'y', 'bn', 'sums', 'dx', 'dws')


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


class Piece:
  """One pruned piece of a program: piece(**feeds) -> {group: list}.

  Feeds and results are groups of GROUPS, each a list with None where the
  program has no tensor (a None input, an integer output's gradient).
  """

  def __init__(self, function: Any, feeds: tuple[str, ...],
               fetches: tuple[str, ...], program: 'CellProgram',
               kept: list[list]) -> None:
    self.function = function
    if program.jit_compile:
      self.function = tf.function(lambda *args: function(*args),
                                  jit_compile=True, autograph=False)
    self.feeds = feeds
    self.fetches = fetches
    self.program = program
    self._kept = kept   # per feed group: its tensors, None where not fed
    # What a call of it adds to a step's graph once inlined.
    self.num_ops = len(function.graph.get_operations())

  def __call__(self, **feeds: Sequence[Any]) -> dict[str, list]:
    args = []
    for group, kept in zip(self.feeds, self._kept):
      args += [v for v, x in zip(feeds[group], kept) if x is not None]
    out = iter(self.function(*args))
    return {group: [None if x is None else next(out)
                    for x in self.program.tensors[group]]
            for group in self.fetches}


class _NoPiece:
  """The W of a cell whose B computed the whole backward: nothing to run."""
  feeds: tuple[str, ...] = ()
  fetches: tuple[str, ...] = ()
  num_ops = 0

  def __call__(self, **feeds: Sequence[Any]) -> dict[str, list]:
    return {}


_NO_PIECE = _NoPiece()


def _Fill(specs: Sequence[Any], values: Sequence[Any]) -> list:
  """`values` at the non-None places of `specs`, None elsewhere."""
  values = iter(values)
  return [None if s is None else next(values) for s in specs]


def _RunCell(cell: cell_lib.Cell, structure: Any, seed: tf.Tensor,
             xs: Sequence[Any], training: bool) -> Any:
  with random_seeds.StepSeedScope(seed):
    return cell.Run(structure, xs, training)


def NestKey(nest: Any) -> str:
  """A hashable key of a nest's structure (its leaves ignored)."""
  return repr(tf.nest.map_structure(lambda _: 0, nest))


def OutputsOf(cell: cell_lib.Cell, in_struct: Any, in_specs: Sequence[Any],
              seed_spec: tf.TensorSpec, training: bool) -> tuple[Any, list]:
  """(output nest, flat output specs) of the cell's forward on `in_specs`,
  from a trace of the forward alone (cached on the cell)."""
  key = ('outputs', NestKey(in_struct),
         tuple(map(repr, in_specs)), training, precision.CurrentPolicy())
  if key not in cell.programs:
    holder = {}

    def _Body(seed, *xs):
      with normalization.DeferMovingStats():
        y = _RunCell(cell, in_struct, seed,
                     _Fill(in_specs, xs), training)
      holder['y'] = y
      return [x for x in tf.nest.flatten(y) if x is not None]

    tf.compat.v1.wrap_function(
        _Body, [seed_spec] + [s for s in in_specs if s is not None])
    cell.programs[key] = (holder['y'],
                          _Specs(tf.nest.flatten(holder['y'])))
  return cell.programs[key]


def _Dense(grad: Any, shape: tf.TensorShape) -> Any:
  """A variable's gradient as a dense tensor of its shape (None stays)."""
  if grad is None:
    return None
  grad = tf.convert_to_tensor(grad)
  if not grad.shape.is_fully_defined():
    grad = tf.ensure_shape(grad, shape)
  return grad


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
    jit_compile: compile every piece with XLA.
    split: whether a schedule will run this program's backward as B then W.
      If not, each op's input and weight gradients are gated (made
      available together, tf.gradients' gate_gradients): the executor then
      computes a layer's weight gradient before it moves on to the layer
      below, instead of running the input-gradient chain ahead and keeping
      every layer's output gradient alive until its weight-gradient matmul
      runs. The gates tie B to W, so a program that is split is not gated.

  Attributes:
    out_struct, out_specs: the outputs' nest and flat specs.
    bn_layers: the BatchNorm layers whose sufficient statistics 'bn' holds.
    variables: the trainable variables 'dws' belongs to, each once.
    tensors: {group: the traced tensors of that group (None where absent)}.
  """

  def __init__(self, cell: cell_lib.Cell, in_struct: Any,
               in_specs: Sequence[Any], seed_spec: tf.TensorSpec,
               training: bool, head: LossHead | None = None,
               input_grads: bool = True,
               dy_present: Sequence[bool] | None = None,
               jit_compile: bool = False, split: bool = True) -> None:
    self.cell = cell
    self.in_struct = in_struct
    self.training = training
    self.head = head
    self.jit_compile = jit_compile
    self.split = split
    self.tensors: dict[str, list] = {g: [] for g in GROUPS}
    self._pieces: dict[tuple, Piece] = {}
    in_specs = list(in_specs)
    present_x = [s for s in in_specs if s is not None]
    label_specs = [s for s in (head.label_specs if head else ())
                   if s is not None]
    dy_specs = []
    if training and head is None:
      _, out_specs = OutputsOf(cell, in_struct, in_specs, seed_spec, training)
      if dy_present is None:
        dy_present = [cell_lib.IsFloat(o) for o in out_specs]
      dy_specs = [o for o, p in zip(out_specs, dy_present) if p]
    self._dy_present = dy_present
    signature = [seed_spec] + present_x + label_specs + dy_specs
    self._wrapped = tf.compat.v1.wrap_function(
        lambda *args: self._Trace(args, in_specs, input_grads),
        signature)
    self._Cut()
    self._splittable: bool | None = None

  @property
  def splittable(self) -> bool:
    """Whether W can run apart from B. Where the weight-gradient ops read
    something the cut cannot feed (a control edge into the input-gradient
    ops, say), B computes the whole backward and W nothing: still exact,
    without zero-bubble's overlap. Found on first use (only schedules with
    W ask)."""
    if self._splittable is None:
      self._splittable = self.training and self.split
      if self._splittable:
        try:
          self._pieces[(ticks_lib.W, False, False)] = self._Prune(
              ('wcut',), ('dws',))
        except (op_selector.UnliftableError, KeyError, ValueError):
          self._splittable = False
    return self._splittable

  # ---- Tracing -------------------------------------------------------------
  def _Forward(self, seed: tf.Tensor, xs: list) -> Any:
    return _RunCell(self.cell, self.in_struct, seed, xs, self.training)

  def _Trace(self, args: Sequence[tf.Tensor], in_specs: list,
             input_grads: bool) -> list:
    args = list(args)
    graph = tf.compat.v1.get_default_graph()
    seed = args.pop(0)
    num_x = len([s for s in in_specs if s is not None])
    xs, args = _Fill(in_specs, args[:num_x]), args[num_x:]
    t = self.tensors
    t['seed'], t['x'] = [seed], xs
    wanted = [self.training and input_grads and cell_lib.IsFloat(x)
              for x in xs]
    with tf.GradientTape() as tape:
      tape.watch([x for x, w in zip(xs, wanted) if w])
      with normalization.DeferMovingStats() as stats:
        y = self._Forward(seed, xs)
      flat_y = tf.nest.flatten(y)
      if self.head is not None:
        n_labels = len([s for s in self.head.label_specs if s])
        t['labels'] = _Fill(self.head.label_specs, args[:n_labels])
        args = args[n_labels:]
        labels = tf.nest.pack_sequence_as(self.head.label_struct,
                                          t['labels'])
        if self.head.scaled:
          labels, scale = labels
        # The loss in float32, whatever the layers computed in.
        terms = self.head.loss_fn(core.FromTuple(precision.ToFloat32(y)),
                                  labels)
        n = flat_y[0].shape[0] if flat_y and flat_y[0].shape.rank else None
        sums = loss_lib.WeightedSums(terms, n)
        target = sums.loss * scale if self.head.scaled else sums.loss
        t['sums'] = tf.nest.flatten(sums)
        self.sums_struct = sums
    self.out_struct = y
    self.out_specs = _Specs(flat_y)
    t['y'] = flat_y
    self.bn_layers, bn = stats.Export()
    t['bn'] = [x for stat in bn for x in stat]
    self._mark = len(graph.get_operations())
    if not self.training:
      return [x for x in flat_y if x is not None]
    self.variables = cell_lib.Unique(
        list(self.cell.variables) +
        [v for v in tape.watched_variables() if v.trainable])
    sources = [x for x, w in zip(xs, wanted) if w] + self.variables
    if self.head is not None:
      targets, grads_in = [target], None
    else:
      dys = iter(args)
      t['dy'] = [next(dys) if p else None
                 for o, p in zip(flat_y, self._dy_present)]
      pairs = [(o, g) for o, g in zip(flat_y, t['dy']) if g is not None]
      targets, grads_in = [o for o, _ in pairs], [g for _, g in pairs]
    if not targets:
      grads = [None] * len(sources)
    elif self.split:
      grads = tape.gradient(targets, sources, output_gradients=grads_in)
    else:
      grads = tf.compat.v1.gradients(targets, sources, grad_ys=grads_in,
                                     gate_gradients=True)
    graph_edit.CastsJustInTime(
        graph, graph.get_operations()[self._mark:],
        graph_edit.TrainableReads(graph, self.variables))
    grads = iter(grads)
    t['dx'] = [next(grads) if w else None for w in wanted]
    t['dws'] = [_Dense(g, v.shape) for g, v in zip(grads, self.variables)]
    return [g for g in t['dx'] + t['dws'] + t['y'] + t['bn'] + t['sums']
            if g is not None]

  def _Cut(self) -> None:
    """Finds saved, pinned and wcut (module docstring)."""
    t = self.tensors
    if not self.training:
      return
    graph = self._wrapped.graph
    ops = graph.get_operations()
    inputs = {id(x.op) for g in ('seed', 'x', 'labels', 'dy')
              for x in t[g] if x is not None}
    forward = set(op for op in ops[:self._mark]
                  if op.type != 'Placeholder' or id(op) in inputs)
    backward = set(ops[self._mark:])
    _ReadsTrainable = graph_edit.TrainableReads(graph, self.variables)

    def _Stashable(x):
      return (x.dtype != tf.resource and x.op.type != 'Const' and
              not _ReadsTrainable(x))

    def _Crossing(consumers, producers_excluded):
      out, seen = [], set()
      for op in sorted(consumers, key=lambda o: o.name):
        # Every output of a producer: a prune fed one output of an op drops
        # the op, so its others (tf.custom_gradient's IdentityN) must be fed.
        for x in [y for x in op.inputs for y in x.op.outputs]:
          if (x.op not in producers_excluded and id(x) not in seen and
              _Stashable(x)):
            seen.add(id(x))
            out.append(x)
      return out

    dys = {id(g) for g in t['dy'] if g is not None}
    need_dx = graph_edit.Ancestors(t['dx'], backward)
    w_ops = graph_edit.Ancestors(t['dws'], backward) - need_dx
    t['saved'] = [x for x in _Crossing(backward, backward)
                  if id(x) not in dys]
    t['pinned'] = [op.outputs[0] for op in sorted(forward,
                                                  key=lambda o: o.name)
                   if op.type == 'ReadVariableOp' and
                   not _ReadsTrainable(op.outputs[0])]
    t['wcut'] = _Crossing(w_ops, w_ops)

  # ---- Pieces --------------------------------------------------------------
  def Piece(self, step: ticks_lib.Step) -> Piece:
    """The piece `step` runs (its kind, keep and split; the stage is this
    program's cell)."""
    if step.kind == ticks_lib.W and not self.splittable:
      return _NO_PIECE
    key = (step.kind, step.keep, step.split)
    if key not in self._pieces:
      self._pieces[key] = self._Prune(*self._FeedsAndFetches(step))
    return self._pieces[key]

  def _FeedsAndFetches(self, step: ticks_lib.Step
                       ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    head = ('labels',) if self.head is not None else ()
    out = ('sums',) if self.head is not None else ('y',)
    if not self.training:
      return ('seed', 'x'), ('y',)
    if step.kind == ticks_lib.F:
      return ('seed', 'x') + head, out + ('bn',) + (
          ('saved',) if step.keep else ('pinned',))
    split = step.kind == ticks_lib.B or (step.kind == ticks_lib.FB and
                                         step.split)
    grads = ('wcut',) if split and self.splittable else ('dws',)
    if step.kind == ticks_lib.W:
      return ('wcut',), ('dws',)
    if step.kind == ticks_lib.FB:
      return ('seed', 'x') + head, ('bn', 'sums', 'dx') + grads
    dy = () if self.head is not None else ('dy',)
    if step.keep:
      return ('saved',) + dy, ('dx',) + grads
    return ('seed', 'x') + head + dy + ('pinned',), ('dx',) + grads

  def _Prune(self, feeds: tuple[str, ...], fetches: tuple[str, ...]) -> Piece:
    # A tensor in two feed groups (an input also saved, say) is fed once,
    # from the first.
    kept, seen = [], set()
    for group in feeds:
      kept.append([])
      for x in self.tensors[group]:
        fresh = x is not None and id(x) not in seen
        kept[-1].append(x if fresh else None)
        if fresh:
          seen.add(id(x))
    function = self._wrapped.prune(
        feeds=[x for g in kept for x in g if x is not None],
        fetches=[x for g in fetches for x in self.tensors[g]
                 if x is not None])
    return Piece(function, feeds, fetches, self, kept)

  def Specs(self, group: str) -> list:
    """The specs of a group's tensors (None where absent)."""
    return _Specs(self.tensors[group])
