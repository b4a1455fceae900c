"""Synthetic token batches for the sequence tasks: noisy arithmetic sequences (LM) and reversed sentences (MT).

Batches (int32 ids, float32 paddings with 1.0 at padded positions), as
gpipe_tf.tasks.sequence reads them::

  SyntheticTokenInput        {'ids': [B,T], 'labels': [B,T], 'paddings': [B,T]}
  SyntheticTranslationInput  {'src_ids': [B,S], 'src_paddings': [B,S],
                              'tgt_ids': [B,T] (decoder input, BOS first),
                              'tgt_labels': [B,T], 'tgt_paddings': [B,T]}

Ids 0, 1 and 2 are padding, BOS and EOS (gpipe_tf.data.vocab); generated
tokens are drawn from 3 .. vocab_size - 1. The examples are a pure function
of the Params (data_seed), held in memory like every
``inputs.BaseInputGenerator``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpipe_tf import hyperparams
from gpipe_tf.data import inputs
from gpipe_tf.data import vocab as vocab_lib

__all__ = ['SyntheticTokenInput', 'SyntheticTranslationInput']

_FIRST_TOKEN = 3  # Ids below this are reserved (PAD, BOS, EOS).


class SyntheticTokenInput(inputs.BaseInputGenerator):
  """Language-model batches of noisy arithmetic sequences over a vocabulary.

  Sequence i starts at a random token and steps by a random stride (1..4)
  modulo the non-reserved ids, so the next token follows from the previous
  two; a fraction ``noise`` of tokens is replaced by random ones. Lengths are
  uniform in [min_length, seq_len] (min_length 0: always seq_len) and the rest
  is padding. Features: ids, labels (ids shifted by one), paddings.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size V (ids 0..2 reserved).')
    p.Define('seq_len', 1024, 'Length T of every example.')
    p.Define('min_length', 0, 'Shortest unpadded length; 0 means seq_len.')
    p.Define('num_examples', 256, 'Examples N in one epoch.')
    p.Define('noise', 0.0, 'Fraction of tokens replaced by random ones.')
    p.Define('data_seed', 0, 'Seed of the generated examples.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self.p
    if p.vocab_size <= _FIRST_TOKEN or p.seq_len < 1 or p.num_examples < 1:
      raise inputs.InputConfigError(
          f'{p.name}: needs vocab_size > {_FIRST_TOKEN} and positive seq_len '
          f'and num_examples, got {p.vocab_size}, {p.seq_len} and '
          f'{p.num_examples}.')
    if not 0 <= p.min_length <= p.seq_len:
      raise inputs.InputConfigError(
          f'{p.name}: min_length must be in [0, seq_len={p.seq_len}], got '
          f'{p.min_length}.')

  def _LoadExamples(self) -> dict[str, Any]:
    p = self.p
    rng = np.random.default_rng(p.data_seed)
    n, t = p.num_examples, p.seq_len
    span = p.vocab_size - _FIRST_TOKEN
    start = rng.integers(0, span, size=[n, 1])
    stride = rng.integers(1, 5, size=[n, 1])
    tokens = (start + stride * np.arange(t + 1)[None, :]) % span
    noisy = rng.random([n, t + 1]) < p.noise
    tokens = np.where(noisy, rng.integers(0, span, size=[n, t + 1]), tokens)
    tokens = (tokens + _FIRST_TOKEN).astype(np.int32)
    lengths = rng.integers(p.min_length or t, t + 1, size=[n, 1])
    paddings = (np.arange(t)[None, :] >= lengths).astype(np.float32)
    keep = paddings == 0
    pad = vocab_lib.PAD_ID
    return {'ids': np.where(keep, tokens[:, :-1], pad).astype(np.int32),
            'labels': np.where(keep, tokens[:, 1:], pad).astype(np.int32),
            'paddings': paddings}


class SyntheticTranslationInput(inputs.BaseInputGenerator):
  """Translation batches whose target is the source sentence reversed.

  A source of n random tokens (n uniform in [min_length, src_len - 1]) is
  followed by EOS; the decoder input is BOS then the reversed tokens, the
  labels the reversed tokens then EOS. Features: src_ids, src_paddings,
  tgt_ids, tgt_labels, tgt_paddings.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 64000, 'Shared vocabulary size (ids 0..2 reserved).')
    p.Define('src_len', 128, 'Length S of the source (with its EOS).')
    p.Define('tgt_len', 128, 'Length T of the target; >= src_len.')
    p.Define('min_length', 1, 'Fewest source tokens before EOS.')
    p.Define('num_examples', 256, 'Sentence pairs N in one epoch.')
    p.Define('data_seed', 0, 'Seed of the generated examples.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self.p
    if p.vocab_size <= _FIRST_TOKEN or p.num_examples < 1:
      raise inputs.InputConfigError(
          f'{p.name}: needs vocab_size > {_FIRST_TOKEN} and num_examples >= 1,'
          f' got {p.vocab_size} and {p.num_examples}.')
    if not 1 <= p.min_length < p.src_len <= p.tgt_len:
      raise inputs.InputConfigError(
          f'{p.name}: needs 1 <= min_length < src_len <= tgt_len, got '
          f'{p.min_length}, {p.src_len} and {p.tgt_len}.')

  def _LoadExamples(self) -> dict[str, Any]:
    p = self.p
    rng = np.random.default_rng(p.data_seed)
    n = p.num_examples
    lengths = rng.integers(p.min_length, p.src_len, size=[n, 1])
    tokens = rng.integers(_FIRST_TOKEN, p.vocab_size, size=[n, p.src_len - 1])
    pos_s = np.arange(p.src_len)[None, :]
    src = np.where(pos_s < lengths,
                   np.pad(tokens, [[0, 0], [0, 1]]), vocab_lib.PAD_ID)
    src = np.where(pos_s == lengths, vocab_lib.EOS_ID, src)
    # Reversed tokens: position j holds token lengths - 1 - j.
    pos_t = np.arange(p.tgt_len)[None, :]
    index = np.clip(lengths - 1 - pos_t, 0, p.src_len - 2)
    reversed_tokens = np.take_along_axis(tokens, index, axis=1)
    labels = np.where(pos_t < lengths, reversed_tokens, vocab_lib.PAD_ID)
    labels = np.where(pos_t == lengths, vocab_lib.EOS_ID, labels)
    tgt = np.concatenate([np.full([n, 1], vocab_lib.BOS_ID), labels[:, :-1]],
                         axis=1)
    tgt = np.where(pos_t <= lengths, tgt, vocab_lib.PAD_ID)
    return {'src_ids': src.astype(np.int32),
            'src_paddings': (pos_s > lengths).astype(np.float32),
            'tgt_ids': tgt.astype(np.int32),
            'tgt_labels': labels.astype(np.int32),
            'tgt_paddings': (pos_t > lengths).astype(np.float32)}
