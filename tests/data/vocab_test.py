"""Tests of gpipe_tf.data.vocab: training, round trips, special ids, language tokens."""

import os
import tempfile

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

_WORDS = ('north wind blows over the quiet harbor', 'seven silver boats',
          'the harbor lights are quiet tonight', 'wind and water',
          'boats return before the storm', 'lights over water')


def _WriteText(directory, name, lines, repeat=20):
  path = os.path.join(directory, name)
  with open(path, 'w', encoding='utf-8') as f:
    for _ in range(repeat):
      f.writelines(line + '\n' for line in lines)
  return path


class VocabularyTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.text = _WriteText(cls.dir, 'train.txt', _WORDS)
    cls.vocab = vocab_lib.Vocabulary.Build(
        [cls.text], 80, os.path.join(cls.dir, 'v', 'sp'),
        language_tokens=['en', 'de'])

  def testModelFileAndSpecialIds(self):
    v = self.vocab
    self.assertEqual(v.model_path, os.path.join(self.dir, 'v', 'sp.model'))
    self.assertTrue(os.path.isfile(v.model_path))
    self.assertEqual((v.pad_id, v.bos_id, v.eos_id, v.unk_id), (0, 1, 2, 3))
    self.assertLessEqual(v.vocab_size, 80)
    self.assertGreater(v.vocab_size, 6)

  def testRoundTrip(self):
    for line in _WORDS:
      ids = self.vocab.Encode(line)
      self.assertNotIn(self.vocab.bos_id, ids)
      self.assertNotIn(self.vocab.eos_id, ids)
      self.assertTrue(all(0 <= i < self.vocab.vocab_size for i in ids))
      self.assertEqual(self.vocab.Decode(ids), line)

  def testUnknownCharactersMapToUnk(self):
    self.assertIn(vocab_lib.UNK_ID, self.vocab.Encode('zebra'))

  def testLanguageTokens(self):
    v = self.vocab
    self.assertEqual(v.languages, ['en', 'de'])
    self.assertEqual(v.LanguageId('en'), 4)
    self.assertEqual(v.LanguageId('de'), 5)
    # The token is one piece, also inside text.
    self.assertIn(5, v.Encode('<2de> wind'))
    with self.assertRaisesRegex(vocab_lib.VocabularyError, '<2fr>'):
      v.LanguageId('fr')
    with self.assertRaises(vocab_lib.VocabularyError):
      vocab_lib.LanguageToken('e n')

  def testDecodeStopsAtEosAndDropsSpecials(self):
    v = self.vocab
    ids = v.Encode('seven silver boats')
    padded = [v.bos_id, v.LanguageId('de')] + ids + [v.eos_id] + v.Encode(
        'wind') + [v.pad_id] * 3
    self.assertEqual(v.Decode(padded), 'seven silver boats')
    self.assertEqual(v.Decode(tf.constant(ids + [0, 0])), 'seven silver boats')

  def testDeterministicAcrossDirectories(self):
    other = tempfile.mkdtemp()
    copy = _WriteText(other, 'elsewhere.txt', _WORDS)
    again = vocab_lib.Vocabulary.Build(
        [copy], 80, os.path.join(other, 'sp'), language_tokens=['en', 'de'])
    with open(self.vocab.model_path, 'rb') as a, open(again.model_path,
                                                       'rb') as b:
      self.assertEqual(a.read(), b.read())

  def testUnigram(self):
    v = vocab_lib.Vocabulary.Build([self.text], 60,
                                   os.path.join(self.dir, 'uni'),
                                   model_type='unigram')
    self.assertEqual(v.Decode(v.Encode(_WORDS[0])), _WORDS[0])
    self.assertEqual(v.languages, [])

  def testEncodeTfInsideDataset(self):
    ds = tf.data.Dataset.from_tensor_slices(list(_WORDS)).batch(4).map(
        self.vocab.EncodeTf)
    rows = [row for batch in ds for row in batch.to_list()]
    self.assertEqual(rows, [self.vocab.Encode(line) for line in _WORDS])

  def testErrors(self):
    with self.assertRaisesRegex(vocab_lib.VocabularyError, 'Vocabulary.Build'):
      vocab_lib.Vocabulary(os.path.join(self.dir, 'missing.model'))
    with self.assertRaisesRegex(vocab_lib.VocabularyError, 'vocab_size'):
      vocab_lib.Vocabulary.Build([self.text], 5, os.path.join(self.dir, 'x'))
    with self.assertRaisesRegex(vocab_lib.VocabularyError, 'do not exist'):
      vocab_lib.Vocabulary.Build([os.path.join(self.dir, 'nope.txt')], 50,
                                 os.path.join(self.dir, 'x'))
    empty = _WriteText(self.dir, 'empty.txt', ['', '  '])
    with self.assertRaisesRegex(vocab_lib.VocabularyError, 'no text'):
      vocab_lib.Vocabulary.Build([empty], 50, os.path.join(self.dir, 'x'))
    with self.assertRaisesRegex(vocab_lib.VocabularyError, 'model_type'):
      vocab_lib.Vocabulary.Build([self.text], 50, os.path.join(self.dir, 'x'),
                                 model_type='word')


if __name__ == '__main__':
  tf.test.main()
