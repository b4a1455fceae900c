"""The Transformer block tools.plan --synthesize_table is made of, at a chosen size: its bytes traced, its times scaled from the benchmark block's measured ones.

The table's model is L identical Transformer encoder blocks
(layers.TransformerEncoderLayer) of width d, T tokens, h heads and a hidden
layer of H, run on micro-batches of b sequences. At the default size
(BlockSize(): d=256, T=32, h=4, H=1024, b=8) the block is tools.benchmark's
--block=transformer block, and its F, B and W are the engine's pieces'
CPU times measured on it (TRANSFORMER_TIMES). At any other size:

  * the bytes are traced for that block, as schedule='auto' sizes a layer
    (layer_bytes.KeptBytes on a batch of 2: what the kept forward stashes
    beyond the block's input, what its B stashes for its W), times b;
  * F and B are the measured ones scaled by the block's forward FLOPs x b
    (FPropMeta, attention included) over the benchmark block's; W by its
    weight-gradient FLOPs x b (2 per parameter and token: W computes no
    attention) over the benchmark block's. Not measured: on 2 shared CPU
    cores one forward of a d=1024, T=512 block on 8 sequences would take
    seconds (3.2 s by this scaling), and kernels run nearer their peak on
    larger matmuls, so the scaled times are an estimate whose ratios
    F : B : W are the benchmark block's but for W's share of attention;
  * a message between stages (TRANSFORMER_COMM at the benchmark's size)
    scales with the bytes it carries (the block's input, b sequences).

Imports TensorFlow only in TransformerBlock (the trace).
"""

from __future__ import annotations

import dataclasses
import math

from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory
from tools.plan import lib as plan_lib

__all__ = ['Block', 'BlockSize', 'TRANSFORMER_COMM', 'TRANSFORMER_TIMES',
           'TransformerBlock']

# The Transformer benchmark block (tools.benchmark --block=transformer:
# d=256, 32 tokens, float32) per micro-batch of 8 sequences: the engine's
# pieces' CPU time at K=2, M=8, remat 'never' (benchmarks/benchmark/README.md,
# "Schedules as accelerators run them", Transformer at M=8: F 46.7, B 49.3,
# W 37.4 ms per 4-block stage, a message 0.66 ms + 0.41 ms of CPU).
TRANSFORMER_TIMES = (46.7e-3 / 4, 49.3e-3 / 4, 37.4e-3 / 4)
TRANSFORMER_COMM = (0.66 + 0.41) * 1e-3


@dataclasses.dataclass(frozen=True)
class BlockSize:
  """A Transformer encoder block's shape and the sequences per micro-batch.

  The defaults are tools.benchmark's Transformer block (whose times were
  measured) and the micro-batch they were measured on.
  """
  width: int = 256  # d, the model width.
  tokens: int = 32  # T, the sequence length.
  heads: int = 4  # h, attention heads (dividing d).
  hidden: int = 1024  # H, the feed-forward hidden width.
  micro_batch: int = 8  # b, sequences per micro-batch.

  def Check(self) -> None:
    """Raises plan_lib.PlanError for sizes no block can have."""
    for name in ('width', 'tokens', 'heads', 'hidden', 'micro_batch'):
      if getattr(self, name) < 1:
        raise plan_lib.PlanError(
            f'the table block\'s {name} must be at least 1, got '
            f'{getattr(self, name)}: pass --table_{name}=<a positive '
            'integer>.')
    if self.width % self.heads:
      raise plan_lib.PlanError(
          f'the table block\'s width {self.width} is not a multiple of its '
          f'{self.heads} heads: pass a --table_heads that divides '
          '--table_width.')

  def Params(self):
    """The block's layers.TransformerEncoderLayer Params (as the
    benchmark builds its blocks)."""
    from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
    return layers.TransformerEncoderLayer.Params().Set(
        name='block0', model_dim=self.width, hidden_dim=self.hidden,
        num_heads=self.heads)

  def InputShapes(self) -> list[tuple]:
    """The block's input shapes, batch None: the sequence and its mask."""
    return [(None, self.tokens, self.width), (None, self.tokens)]


@dataclasses.dataclass(frozen=True)
class Block:
  """The table's block: its costs per micro-batch and what they came from.

  Attributes:
    size: the block's BlockSize.
    cost: F, B and W seconds and the bytes, per micro-batch of size.micro_batch.
    comm_time: seconds a message between stages takes.
    kept, wcut: traced bytes per sequence: what the kept forward stashes
      beyond the input, what a B stashes for its W.
    time_scale: F and B over the benchmark block's measured ones (1: they
      are the measured ones).
  """
  size: BlockSize
  cost: layout.LayerCost
  comm_time: float
  kept: int
  wcut: int
  time_scale: float

  def Describe(self) -> str:
    """One paragraph: the block, its times and where they came from, its
    bytes and the stash ratio wcut / kept."""
    s, c = self.size, self.cost
    times = ('measured on the benchmark block' if self.size == BlockSize()
             else
             f"the benchmark block's measured ones scaled by FLOPs "
             f'(F and B x{self.time_scale:.4g}; tools/plan/block.py)')
    return (f'Block: Transformer encoder d={s.width}, T={s.tokens}, '
            f'h={s.heads}, H={s.hidden}, float32, micro-batches of '
            f'{s.micro_batch} sequences. Per block and micro-batch: F '
            f'{c.forward * 1e3:.4g}, B {c.backward * 1e3:.4g}, W '
            f'{c.weight * 1e3:.4g} ms, a message {self.comm_time * 1e3:.4g} '
            f'ms ({times}). Traced per sequence: input '
            f'{c.bytes.input // s.micro_batch:,}, kept forward '
            f'{self.kept:,}, stash for W {self.wcut:,} bytes: '
            f'wcut / kept {self.wcut / self.kept:.3f}.')


def _Flops(size: BlockSize) -> tuple[float, float]:
  """(forward FLOPs, weight-gradient FLOPs) per sequence (FPropMeta)."""
  meta = plan_lib.ModelOf([size.Params()], size.InputShapes(),
                          bytes_per_param=4).layers[0]
  return meta.flops, 2.0 * meta.num_params * size.tokens


def _InputBytes(size: BlockSize) -> int:
  """float32 bytes of the block's inputs per sequence."""
  return 4 * sum(math.prod(s[1:]) for s in size.InputShapes())


def TransformerBlock(size: BlockSize = BlockSize()) -> Block:
  """The block of `size` (module docstring): bytes traced now, times
  measured (default size) or scaled by FLOPs.

  Imports TensorFlow and traces one block's training step.

  Raises:
    plan_lib.PlanError: a size no block can have, or the trace cannot size
      the block.
  """
  size.Check()
  from gpipe_tf.pipeline import layer_bytes  # pylint: disable=g-import-not-at-top
  traced = layer_bytes.KeptBytes([size.Params()], size.InputShapes())[0]
  if traced is None:
    raise plan_lib.PlanError(
        f'the Transformer block of {size} could not be traced '
        '(layer_bytes.KeptBytes gave None)')
  kept, wcut = traced
  reference = BlockSize()
  (fwd, wgt), (fwd0, wgt0) = _Flops(size), _Flops(reference)
  b, b0 = size.micro_batch, reference.micro_batch
  f_scale, w_scale = fwd * b / (fwd0 * b0), wgt * b / (wgt0 * b0)
  f, bwd, w = TRANSFORMER_TIMES
  comm = TRANSFORMER_COMM * _InputBytes(size) * b / (
      _InputBytes(reference) * b0)
  cost = layout.LayerCost(f * f_scale, bwd * f_scale, w * w_scale,
                          memory.StageBytes(input=_InputBytes(size) * b,
                                            activations=kept * b,
                                            wcut=wcut * b))
  return Block(size, cost, comm, kept, wcut, f_scale)
