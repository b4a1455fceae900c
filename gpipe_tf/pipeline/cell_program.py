"""A cell's training step traced once and cut into the pieces a schedule's steps run: F, B, W, BW and FB.

One graph holds the cell's whole step for one micro-batch: the forward (and,
on the last stage with the loss inside, the loss), then the gradient of the
outputs (or of the loss) with respect to the cell's inputs and every
trainable variable it read. Its ops fall into three sets::

    forward ops  F   everything up to the outputs (and the loss)
    input-grad   B   backward ops the input gradient dx needs
    weight-grad  W   backward ops only the weight gradients dws need

Each piece is that graph pruned (``layers/prune.py``) between a set of
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

The forward is traced first, under a tape; the backward after, into the
same graph, fed placeholders shaped as the outputs (at once, or with
``deferred`` once the next cell's program says which gradients come back):
each cell's forward is traced once.

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

Auxiliary losses the cell's layers add (aux_carry) ride beside its outputs
as one more output, the carrier, or on the last stage with the loss inside
are added to the loss sums, so they are differentiated in this backward.

A variable the cell reads several times (in several layers, or in the loss)
is differentiated once: it gets the sum of its uses' gradients. Sparse
gradients (IndexedSlices) are made dense so that they can be summed in a
loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import tensorflow as tf

from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision
from gpipe_tf.layers import prune
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import shared_run
from gpipe_tf.layers import shared_trace
from gpipe_tf.pipeline import aux_carry
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import graph_edit
from gpipe_tf.pipeline import graph_flops
from gpipe_tf.pipeline import leaves
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import roles
from gpipe_tf.pipeline import tensor_loop
from gpipe_tf.pipeline import tf_internals
from gpipe_tf.pipeline.roles import Piece as PieceKind
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.roles import Tensors
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


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
  defers_w: bool
  last: bool = False


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
    reads: the roles it is fed, in the order it takes them.
    makes: the roles it returns.
    num_ops: what a call of it adds to a step's graph once inlined.
    traced: the program's traced Tensors (where its outputs are None).
    fed: per role read, whether each of its tensors is fed.
  """
  function: Callable[..., Any]
  reads: tuple[Role, ...] = ()
  makes: tuple[Role, ...] = ()
  num_ops: int = 0
  traced: Tensors = Tensors()
  fed: tuple[tuple[bool, ...], ...] = ()
  whole: Callable[..., Any] | None = None

  def __call__(self, feeds: Tensors) -> Tensors:
    args = [v for role, fed in zip(self.reads, self.fed)
            for v, f in zip(feeds[role], fed) if f]
    # Called whole only into a graph (eagerly, a call runs as it is).
    function = (self.whole if self.whole is not None and tf.inside_function()
                else self.function)
    out = iter(function(*args))
    return Tensors({role: tuple(None if x is None else next(out)
                                for x in self.traced[role])
                    for role in self.makes})


# The W of a cell whose B computed the whole backward: nothing to run.
_NO_PIECE = Piece(lambda: ())

# The value of PipeliningLayer Param whole_piece_min_flops the docs
# suggest: a piece that computes this much per call is called whole. A call
# costs a step about the same whatever it computes; at 50 MFLOPs a call (a
# Transformer block of width 128 on 8 sequences of 16 tokens) calls kept
# whole cost a step 1-6% on this 2-core CPU, at 3-13 MFLOPs up to 1.6x
# (benchmarks/first_step).
WHOLE_PIECE_MIN_FLOPS = 50_000_000

# Roles whose tensors a piece holds until its call returns when called
# whole, where inlined ops free each once read: a backward reading a kept
# forward's activations (or W, B's stash) would hold them all.
_STASHES = frozenset({Role.SAVED, Role.WCUT})

_MIN_FLOPS: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_whole_piece_min_flops', default=None)


@contextlib.contextmanager
def WholePieces(min_flops: int | None) -> Iterator[None]:
  """Pieces cut in here that read no stash and compute at least
  `min_flops` a call (graph_flops.Flops) are called whole (prune.KeptWhole):
  TensorFlow optimises and places each once per device instead of once per
  call site in the step. None: every piece is inlined."""
  token = _MIN_FLOPS.set(min_flops)
  try:
    yield
  finally:
    _MIN_FLOPS.reset(token)


def _Whole(reads: Sequence[Role], graph: tf.Graph) -> bool:
  """Whether a piece reading `reads`, of `graph`, is called whole."""
  min_flops = _MIN_FLOPS.get()
  return (min_flops is not None and not _STASHES.intersection(reads) and
          graph_flops.Flops(graph) >= min_flops)

# The largest weight gradient a piece packs into its cell's one vector of
# small gradients (tensor_loop.Flat; 64 KiB of float32): every weight of a
# block of width 64, where the steady step did not change (64 blocks, 1F1B:
# benchmarks/first_step); larger ones are summed on their own.
_PACKED_GRADIENT_ELEMENTS = 16384


def _RunCell(cell: cell_lib.Cell, structure: Any, seed: tf.Tensor,
             xs: Sequence[Any], skips: Sequence[Any], training: bool,
             end: str = aux_carry.PASS) -> tuple[Any, tuple, Any]:
  """(outputs, skip_out, aux): the cell's forward, its auxiliary losses
  carried on (aux_carry.Run)."""
  # Layers of one kind share one trace (layers/shared_trace.py), here as in
  # a plain model: a cell of L/K identical blocks traces one block.
  with random_seeds.StepSeedScope(seed):
    return aux_carry.Run(
        lambda s, flat: cell.Forward(s, flat, skips, training), structure,
        xs, training, end)


def NestKey(nest: Any) -> str:
  """A hashable key of a nest's structure (its leaves ignored)."""
  return repr(tf.nest.map_structure(lambda _: 0, nest))


def _Dense(grad: Any, shape: tf.TensorShape) -> Any:
  """A variable's gradient as a dense tensor of its shape (None stays)."""
  if grad is None:
    return None
  grad = tf.convert_to_tensor(grad)
  return (grad if grad.shape.is_fully_defined() else
          tf.ensure_shape(grad, shape))


def _FedGradients(specs: Sequence[Any], present: Sequence[bool]) -> list:
  """A placeholder shaped as each spec where `present` says a gradient is
  fed to it, else None."""
  return [tf.compat.v1.placeholder(o.dtype, o.shape) if o is not None and p
          else None for o, p in zip(specs, present)]


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
      to it (default: every float output), shaped as the output.
    skip_specs: one micro-batch's specs of the skips it pops that earlier
      cells stashed (Cell.skip_in).
    dskip_present: per skip it stashes for later cells (Cell.skip_out),
      whether a gradient is fed to it (default: every float one).
    jit_compile: compile every piece with XLA.
    defers_w: whether a schedule will run this program's backward as B and
      W later (else its W pieces are never cut).
    last: whether the cell is the last stage (where auxiliary losses stop
      being carried: into the loss, or without a head into an output).
    deferred: in training, trace the forward only; `Finish` traces the
      backward into the same graph once the gradients fed are known (the
      interpreter traces forwards in order, each one's outputs the next
      one's input specs, then backwards last first).

  Attributes:
    finished: whether the program is whole (its backward traced, if any).
    out_struct, out_specs: the outputs' nest and flat specs.
    bn_layers: the BatchNorm layers whose sufficient statistics Role.BN
      holds, packed by `bn_flat` (three a layer: sum, sum of squares, count).
    variables: the trainable variables whose gradients Role.DWS holds,
      each once, the small ones packed by `dws_flat`.
    tensors: the traced Tensors of one micro-batch's step.
  """

  def __init__(self, cell: cell_lib.Cell, in_struct: Any,
               in_specs: Sequence[Any], seed_spec: tf.TensorSpec,
               training: bool, head: LossHead | None = None,
               input_grads: bool = True,
               dy_present: Sequence[bool] | None = None,
               jit_compile: bool = False, defers_w: bool = True,
               skip_specs: Sequence[Any] = (),
               dskip_present: Sequence[bool] | None = None,
               last: bool = False, deferred: bool = False) -> None:
    self.cell = cell
    self._end = (aux_carry.LOSS if head is not None else
                 aux_carry.MERGE if last else aux_carry.PASS)
    self.in_struct = in_struct
    self.training = training
    self.head = head
    self.jit_compile = jit_compile
    self.defers_w = defers_w
    self._pieces: dict[PieceKind, Piece] = {}
    self._input_grads = input_grads
    # Runs of identical layers are loops (layers/shared_run.py) where the
    # PipeliningLayer asks (layer_loops), with W's loop apart from B's where
    # a schedule defers W; none in XLA pieces. Called layer by layer, each
    # layer's shared trace is called whole (not inlined into the step: its
    # ops are optimised and placed once per device, not once per call)
    # where the PipeliningLayer asks (whole_layer_calls); XLA pieces inline
    # them.
    by_layer = jit_compile or not shared_run.CellsLoop()
    whole = (by_layer and not jit_compile and
             shared_trace.CellsCallWhole())
    self._contexts = lambda: (
        shared_run.NoRuns() if by_layer else
        shared_run.SeparateWeights() if training and defers_w else
        contextlib.nullcontext(), shared_trace.CallsKeptWhole() if whole
        else contextlib.nullcontext())
    # The traced function's arguments: the seed, then these in turn. The
    # gradients fed in are placeholders its backward makes, shaped as the
    # outputs its forward made.
    templates = [in_specs, skip_specs, head.label_specs if head else ()]
    runs, calls = self._contexts()
    with runs, calls:
      self._wrapped = tf_internals.WrapFunction(
          lambda seed, *args: self._Forward(
              seed, *leaves.FillEach(templates, args)),
          [seed_spec] + [x for t in templates for x in leaves.Present(t)])
    self.finished = not training
    if not training:  # No backward reads the tape.
      del self._tape, self._target
    elif not deferred:
      self.Finish(dy_present, dskip_present)

  def Finish(self, dy_present: Sequence[bool] | None = None,
             dskip_present: Sequence[bool] | None = None) -> None:
    """Traces the backward of a program made with ``deferred``, into the
    same graph (the forward is not traced again), fed a gradient for the
    outputs and stashed skips ``dy_present`` and ``dskip_present`` say (as
    the constructor's); then cuts the program."""
    if self.finished:
      raise ValueError('CellProgram.Finish: the backward is traced already')
    self.finished = True
    runs, calls = self._contexts()
    with self._wrapped.graph.as_default(), runs, calls:
      self._Backward(dy_present, dskip_present)
    self._Cut()

  @functools.cached_property
  def w_separable(self) -> bool:
    """Whether W can run apart from B. Where the weight-gradient ops read
    something the cut cannot feed (a control edge into the input-gradient
    ops, say), B computes the whole backward and W nothing: still exact,
    without zero-bubble's overlap. Found on first use (only schedules with
    W ask)."""
    if not (self.training and self.defers_w):
      return False
    try:
      self._pieces[PieceKind.W] = self._Prune(
          *roles.Signature(PieceKind.W, False))
    except prune.ERRORS:
      return False
    return True

  @property
  def calls_whole(self) -> bool:
    """Whether a piece cut so far is called whole (WholePieces)."""
    return any(p.whole is not None for p in self._pieces.values())

  # ---- Tracing -------------------------------------------------------------

  def _Forward(self, seed: tf.Tensor, xs: list, skips: list,
               labels_flat: list) -> list:
    """The forward (and the loss), under a tape the backward reads."""
    graph = tf.compat.v1.get_default_graph()
    self._wanted = [self.training and self._input_grads and
                    cell_lib.IsFloat(x) for x in xs]
    self._wanted_skips = [self.training and cell_lib.IsFloat(x)
                          for x in skips]
    sums_flat = []
    self._target = None
    with tf.GradientTape() as tape:
      tape.watch([x for x, w in zip(xs + skips,
                                    self._wanted + self._wanted_skips) if w])
      with normalization.DeferMovingStats() as stats:
        y, skip_out, aux = _RunCell(self.cell, self.in_struct, seed, xs,
                                    skips, self.training, self._end)
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
        if aux is not None:  # Weighed as the micro-batch's loss (aux_carry).
          sums = sums._replace(loss=sums.loss + sums.weight * aux)
        self._target = sums.loss * scale if self.head.scaled else sums.loss
        sums_flat = tf.nest.flatten(sums)
        self.sums_struct = sums
    self._tape = tape
    self.out_struct = y
    self.out_specs = _Specs(flat_y)
    self.bn_layers, bn = stats.Export()
    bn = [x for stat in bn for x in stat]
    self.bn_flat = tensor_loop.Flat(_Specs(bn))
    self.tensors = Tensors({
        Role.SEED: (seed,), Role.X: xs, Role.SKIP_IN: skips,
        Role.LABELS: labels_flat, Role.Y: flat_y, Role.SKIP_OUT: skip_out,
        Role.BN: self.bn_flat.Pack(bn), Role.SUMS: sums_flat})
    return self.tensors.Present(Role.Y, Role.SKIP_OUT, Role.BN, Role.SUMS)

  def _Backward(self, dy_present: Sequence[bool] | None,
                dskip_present: Sequence[bool] | None) -> None:
    """The gradient of the outputs fed (or of the loss) with respect to the
    inputs and every trainable variable the forward read, in the graph of
    the forward (its default graph)."""
    graph = tf.compat.v1.get_default_graph()
    t = self.tensors
    # A placeholder per gradient fed (None where none is), shaped as its
    # output or stashed skip.
    skip_out = _Specs(t[Role.SKIP_OUT])
    if dskip_present is None:
      dskip_present = [cell_lib.IsFloat(o) for o in skip_out]
    dskips = _FedGradients(skip_out, dskip_present)
    dys = [None] * len(self.out_specs)
    if self.head is None:
      if dy_present is None:
        dy_present = [cell_lib.IsFloat(o) for o in self.out_specs]
      dys = _FedGradients(self.out_specs, dy_present)
    # The backward's ops start here: the gradients fed are read from
    # outside it, as the forward's tensors are (what W reads of them is cut).
    self._mark = len(graph.get_operations())
    self.variables = cell_lib.Unique(
        list(self.cell.variables) +
        [v for v in self._tape.watched_variables() if v.trainable])
    xs, skips = list(t[Role.X]), list(t[Role.SKIP_IN])
    sources = ([x for x, w in zip(xs, self._wanted) if w] +
               [x for x, w in zip(skips, self._wanted_skips) if w] +
               self.variables)
    # A stashed tensor's gradient from the cell that popped it adds into
    # this cell's backward like an output's (the tape sums both uses).
    pairs = [(o, g) for o, g in
             ([(self._target, tf.ones_like(self._target))] if self.head else
              list(zip(t[Role.Y], dys))) + list(zip(t[Role.SKIP_OUT], dskips))
             if g is not None]
    grads = (self._tape.gradient([o for o, _ in pairs], sources,
                                 output_gradients=[g for _, g in pairs])
             if pairs else [None] * len(sources))
    del self._tape, self._target
    graph_edit.CastsJustInTime(
        graph, graph.get_operations()[self._mark:],
        graph_edit.TrainableReads(graph, self.variables))
    grads = iter(grads)
    dx = [next(grads) if w else None for w in self._wanted]
    dskip_in = [next(grads) if w else None for w in self._wanted_skips]
    dws = [_Dense(g, v.shape) for g, v in zip(grads, self.variables)]
    self.dws_flat = tensor_loop.Flat(_Specs(dws), _PACKED_GRADIENT_ELEMENTS)
    self.tensors = t.With({
        Role.DY: dys, Role.DSKIP_OUT: dskips, Role.DX: dx,
        Role.DSKIP_IN: dskip_in, Role.DWS: self.dws_flat.Pack(dws)})

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
        # Not a shared trace's call: a B's input gradients are not its W's.
        for x in [y for x in op.inputs for y in (
            [x] if shared_trace.CalledGraph(x.op) else x.op.outputs)]:
          if (x.op not in consumers and id(x) not in seen and
              x.dtype != tf.resource and x.op.type != 'Const' and
              not _ReadsTrainable(x)):
            seen.add(id(x))
            out.append(x)
      return tuple(out)

    dys = {id(g) for g in t.Present(Role.DY, Role.DSKIP_OUT)}
    need_dx = graph_edit.Ancestors(t[Role.DX] + t[Role.DSKIP_IN], backward)
    w_ops = graph_edit.Ancestors(t[Role.DWS], backward) - need_dx
    self.tensors = t.With({
        Role.SAVED: [x for x in _Crossing(backward) if id(x) not in dys],
        # The forward's reads of non-trainable variables.
        Role.PINNED: [op.outputs[0] for op in sorted(ops[:self._mark],
                                                     key=lambda o: o.name)
                      if op.type == 'ReadVariableOp' and
                      not _ReadsTrainable(op.outputs[0])],
        Role.WCUT: _Crossing(w_ops)})

  # ---- Pieces --------------------------------------------------------------
  def Piece(self, step: ticks_lib.Step) -> Piece:
    """The piece `step` runs (its kind, keep and defers_w; the stage is
    this program's cell)."""
    kind = PieceKind.Of(step, self.training)
    if kind is PieceKind.W and not self.w_separable:
      return _NO_PIECE
    if kind not in self._pieces:
      self._pieces[kind] = self._Prune(*self._Signature(kind))
    return self._pieces[kind]

  def _Signature(self, kind: PieceKind
                 ) -> tuple[tuple[Role, ...], tuple[Role, ...]]:
    """(the roles the piece reads, the roles it makes): the table's."""
    reads, makes = roles.Signature(kind, self.training and
                                   self.head is not None)
    if Role.WCUT in makes and not self.w_separable:  # B makes all of them.
      makes = tuple(r for r in makes if r is not Role.WCUT) + (Role.DWS,)
    return reads, makes

  def _Prune(self, reads: tuple[Role, ...], makes: tuple[Role, ...]) -> Piece:
    # A tensor of two roles read (an input also saved, say) is fed once,
    # from the first.
    fed, seen = [], set()
    for role in reads:
      fed.append(tuple(x is not None and id(x) not in seen
                       for x in self.tensors[role]))
      seen.update(id(x) for x in self.tensors[role] if x is not None)
    feeds = [x for role, f in zip(reads, fed)
             for x, ok in zip(self.tensors[role], f) if ok]
    function = prune.Prune(self._wrapped, feeds,
                           self.tensors.Present(*makes))
    num_ops = shared_trace.InlinedSize(function.graph)
    whole = None
    if self.jit_compile:
      function = tf.function(lambda *args, f=function: f(*args),
                             jit_compile=True, autograph=False)
    elif _Whole(reads, function.graph):
      whole = prune.KeptWhole(function)
    return Piece(function, reads, makes, num_ops, self.tensors, tuple(fed),
                 whole)

  def Specs(self, role: Role) -> list:
    """The specs of a role's tensors (None where absent)."""
    return _Specs(self.tensors[role])
