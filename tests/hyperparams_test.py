"""Tests of gpipe_tf.hyperparams: fields, paths, copy, freeze and text form."""

import copy
import enum
import math
import pickle
import unittest


from gpipe_tf import hyperparams  # pylint: disable=g-import-not-at-top

Params = hyperparams.Params
InstantiableParams = hyperparams.InstantiableParams


class Color(enum.Enum):
  RED = 1
  BLUE = 2


class Widget:
  """Records what InstantiableParams.Instantiate passed it."""

  def __init__(self, params, **kwargs):
    self.params = params
    self.kwargs = kwargs

  class Inner:
    pass


def _Helper():
  pass


def _Layer(name='fc', dim=8):
  p = InstantiableParams(Widget)
  p.Define('name', name, 'Layer name.')
  p.Define('dim', dim, 'Output width.')
  return p


def _Model():
  """A Params tree holding every supported kind of value, at defaults."""
  p = Params()
  p.Define('num_partitions', 2, 'Number of pipeline stages.')
  p.Define('lr', 1.0, 'Learning rate.')
  p.Define('name', 'model', 'Name.')
  p.Define('flag', False, 'A bool.')
  p.Define('nothing', 0, 'Becomes None.')
  p.Define('shape', [1, 2], 'Becomes a tuple.')
  p.Define('nested', [], 'Nested lists and tuples.')
  p.Define('table', {}, 'A dict of simple values.')
  p.Define('kind', int, 'A class.')
  p.Define('encoder', Params(), 'Nested Params.')
  p.encoder.Define('dim', 4, 'Width.')
  p.encoder.Define('inner', Params(), 'Doubly nested Params.')
  p.encoder.inner.Define('eps', 1.0, 'Epsilon.')
  p.Define('layers', [_Layer('a'), _Layer('b'), 7], 'Layers and a plain value.')
  p.Define('pair', (_Layer('c'), [_Layer('d')]), 'A tuple holding Params.')
  return p


def _ModifiedModel():
  p = _Model()
  p.Set(num_partitions=-3, lr=0.1, flag=True, nothing=None, shape=(4, None),
        name='it\'s "quoted"; a\nnew line # not a comment \\ \t',
        nested=[[1, (2.5, [True])], (), ('x',)],
        table={'a': 1e-30, 'b': -0.0, 3: [None, 'y']},
        kind=Widget.Inner)
  p.Set(**{'encoder.dim': 16, 'encoder.inner.eps': 1e-30,
           'layers[0].name': 'fc;0', 'layers[1].cls': dict,
           'layers[1].dim': 0, 'layers[2]': Color.BLUE,
           'pair[0].dim': 3, 'pair[1][0].name': '', 'pair[1][0].cls': _Helper})
  return p


class DefineGetSetTest(unittest.TestCase):

  def testDefineGetSet(self):
    p = Params()
    p.Define('dim', 4, 'Width of the layer.')
    p.Define('act', 'RELU', 'Activation.')
    self.assertEqual(p.dim, 4)
    p.dim = 5
    self.assertEqual(p.Get('dim'), 5)
    self.assertIs(p.Set(act='TANH', dim=6), p)
    self.assertEqual((p.act, p.dim), ('TANH', 6))
    self.assertEqual(list(p.IterParams()), [('dim', 6), ('act', 'TANH')])
    self.assertEqual(p.GetDescription('dim'), 'Width of the layer.')
    self.assertIn('dim', p)
    self.assertNotIn('width', p)

  def testDefineTwiceRaises(self):
    p = Params()
    p.Define('dim', 4, '')
    with self.assertRaisesRegex(AttributeError, 'dim'):
      p.Define('dim', 5, '')
    self.assertEqual(p.dim, 4)

  def testInvalidNamesRaise(self):
    p = Params()
    for name in ('1a', '_private', 'a-b', 'a.b', '', 'class', 'Copy', 'Set'):
      with self.assertRaises(ValueError, msg=name):
        p.Define(name, 1, '')
    self.assertEqual(list(p.IterParams()), [])

  def testSetNamedSelf(self):
    p = Params()
    p.Define('self', 1, 'Any identifier works as a Set keyword.')
    p.Set(self=2)
    self.assertEqual(p.self, 2)

  def testDottedAndIndexedPaths(self):
    p = _Model()
    p.Set(**{'encoder.inner.eps': 0.5, 'layers[1].dim': 3, 'pair[1][0].dim': 9})
    self.assertEqual(p.encoder.inner.eps, 0.5)
    self.assertEqual(p.Get('encoder.inner.eps'), 0.5)
    self.assertEqual(p.Get('layers[1].dim'), 3)
    self.assertEqual(p.pair[1][0].dim, 9)
    self.assertIn('layers[2]', p)
    self.assertNotIn('layers[3]', p)
    self.assertEqual(p.GetDescription('encoder.inner.eps'), 'Epsilon.')

  def testSettingTupleElementRebuildsTuple(self):
    p = Params()
    p.Define('t', (1, 2, 3), '')
    p.Set(**{'t[1]': 'two'})
    self.assertEqual(p.t, (1, 'two', 3))
    self.assertIsInstance(p.t, tuple)

  def testInvalidPathRaisesValueError(self):
    p = _Model()
    for key in ('a..b', 'layers[x]', '.a', 'layers[-1]'):
      with self.assertRaises(ValueError, msg=key):
        p.Set(**{key: 1})

  def testDelete(self):
    p = _Model()
    self.assertIs(p.Delete('lr', 'encoder.inner'), p)
    self.assertNotIn('lr', p)
    self.assertNotIn('encoder.inner', p)
    self.assertIn('encoder.dim', p)

  def testDeleteUnknownRemovesNothing(self):
    p = _Model()
    with self.assertRaisesRegex(AttributeError, 'flg'):
      p.Delete('lr', 'flg')
    self.assertIn('lr', p)


class UnknownKeyTest(unittest.TestCase):

  def _AssertMessage(self, fn, key, suggestion):
    with self.assertRaises(AttributeError) as ctx:
      fn()
    self.assertIn(f"'{key}'", str(ctx.exception))
    self.assertIn(suggestion, str(ctx.exception))

  def testMessagesNameKeyAndClosestKeys(self):
    p = _Model()
    self._AssertMessage(lambda: p.num_partiton, 'num_partiton',
                        'Did you mean: num_partitions?')
    self._AssertMessage(lambda: setattr(p, 'num_partiton', 1), 'num_partiton',
                        'num_partitions')
    self._AssertMessage(lambda: p.Set(**{'encoder.dimm': 1}), 'encoder.dimm',
                        'Did you mean: encoder.dim?')
    self._AssertMessage(lambda: p.Get('layers[0].nme'), 'layers[0].nme',
                        'layers[0].name')
    self.assertNotIn('num_partiton', p.ToText())

  def testNoCloseMatchListsDefinedParams(self):
    p = _Model()
    self._AssertMessage(lambda: p.Get('encoder.zzzzzz'), 'encoder.zzzzzz',
                        'encoder.dim, encoder.inner')

  def testPathThroughNonParams(self):
    p = _Model()
    self._AssertMessage(lambda: p.Set(**{'lr.x': 1}), 'lr.x', 'float')
    self._AssertMessage(lambda: p.Set(**{'lr[0]': 1}), 'lr[0]', 'float')
    self._AssertMessage(lambda: p.Set(**{'layers[3].dim': 1}), 'layers[3].dim',
                        '3 elements')

  def testDunderLookupsKeepProtocols(self):
    p = _Model()
    self.assertFalse(hasattr(p, '__missing_dunder__'))
    self.assertFalse(hasattr(p, '_private'))
    self.assertEqual(copy.deepcopy(p), p)
    self.assertEqual(copy.copy(p), p)
    restored = pickle.loads(pickle.dumps(_ModifiedModel()))
    self.assertEqual(restored, _ModifiedModel())
    self.assertIsInstance(restored.layers[0], InstantiableParams)
    self.assertIn('num_partitions', dir(p))


class CopyFreezeTest(unittest.TestCase):

  def testCopyIsDeep(self):
    p = _Model()
    p.table = {'k': [1]}
    c = p.Copy()
    self.assertEqual(c, p)
    c.encoder.inner.eps = 2.0
    c.layers[0].dim = 99
    c.pair[1][0].name = 'changed'
    c.table['k'].append(2)
    c.shape.append(3)
    self.assertEqual(p, _Model().Set(table={'k': [1]}))
    self.assertIsNot(c.layers, p.layers)
    self.assertIsInstance(c.layers[0], InstantiableParams)
    self.assertIs(c.layers[0].cls, Widget)
    self.assertEqual(c.GetDescription('encoder.dim'), 'Width.')

  def testCopyOfFrozenIsUnfrozen(self):
    p = _Model()
    p.Freeze()
    c = p.Copy()
    self.assertFalse(c.IsFrozen())
    c.encoder.dim = 1
    c.layers[0].dim = 1
    c.pair[1][0].dim = 1
    self.assertTrue(p.IsFrozen())
    self.assertEqual(p.encoder.dim, 4)

  def _AssertFrozen(self, fn, name):
    with self.assertRaises(hyperparams.FrozenParamsError) as ctx:
      fn()
    self.assertIn(name, str(ctx.exception))

  def testFreezeBlocksAllWrites(self):
    def Build():
      p = _Model()
      p.Define('by_key', {'k': _Layer()}, 'Params inside a dict.')
      return p
    p = Build()
    p.Freeze()
    self.assertTrue(p.IsFrozen())
    self.assertTrue(issubclass(hyperparams.FrozenParamsError, TypeError))
    self._AssertFrozen(lambda: setattr(p, 'lr', 2.0), 'lr')
    self._AssertFrozen(lambda: p.Set(lr=2.0), 'lr')
    self._AssertFrozen(lambda: p.Define('extra', 1, ''), 'extra')
    self._AssertFrozen(lambda: p.Delete('lr'), 'lr')
    self._AssertFrozen(lambda: setattr(p.encoder, 'dim', 1), 'dim')
    self._AssertFrozen(lambda: setattr(p.encoder.inner, 'eps', 1), 'eps')
    self._AssertFrozen(lambda: p.encoder.Define('x', 1, ''), 'x')
    self._AssertFrozen(lambda: p.Set(**{'encoder.dim': 1}), 'encoder.dim')
    self._AssertFrozen(lambda: setattr(p.layers[0], 'dim', 1), 'dim')
    self._AssertFrozen(lambda: p.Set(**{'layers[2]': 1}), 'layers[2]')
    self._AssertFrozen(lambda: setattr(p.pair[1][0], 'dim', 1), 'dim')
    self._AssertFrozen(lambda: setattr(p.pair[0], 'dim', 1), 'dim')
    self._AssertFrozen(lambda: setattr(p.by_key['k'], 'dim', 1), 'dim')
    self._AssertFrozen(lambda: p.FromText('encoder.dim : 1'), 'encoder.dim')
    self.assertEqual(p, Build())

  def testFreezingChildLeavesParentWritable(self):
    p = _Model()
    p.encoder.Freeze()
    p.lr = 0.5
    self._AssertFrozen(lambda: p.Set(**{'encoder.dim': 1}), 'encoder.dim')
    self.assertEqual((p.lr, p.encoder.dim), (0.5, 4))

  def testEquality(self):
    self.assertEqual(_Model(), _Model())
    self.assertEqual(_ModifiedModel(), _ModifiedModel())
    self.assertNotEqual(_Model(), _ModifiedModel())
    other = _Model()
    other.layers[1].dim = 9
    self.assertNotEqual(other, _Model())
    other = _Model()
    other.Define('extra', None, '')
    self.assertNotEqual(other, _Model())
    self.assertNotEqual(_Model(), _Model().ToText())


class TextTest(unittest.TestCase):

  def testToTextFormat(self):
    p = Params()
    p.Define('dim', 4, '')
    p.Define('enc', Params(), '')
    p.enc.Define('act', 'RELU', '')
    p.Define('layers', [_Layer('fc', 2), None], '')
    p.Define('kind', Color.RED, '')
    expected = '\n'.join([
        'dim : 4',
        "enc.act : 'RELU'",
        f'layers[0].cls : {__name__}.Widget',
        "layers[0].name : 'fc'",
        'layers[0].dim : 2',
        'layers[1] : None',
        f'kind : {__name__}.Color.RED',
    ])
    self.assertEqual(p.ToText(), expected)
    self.assertEqual(repr(p), expected)
    self.assertEqual(str(p), expected)

  def testRoundTrip(self):
    p = _ModifiedModel()
    q = _Model()
    self.assertNotEqual(q, p)
    self.assertIs(q.FromText(p.ToText()), q)
    self.assertEqual(q, p)
    # Equality treats True == 1 and -0.0 == 0.0 as equal; the text does not.
    self.assertEqual(q.ToText(), p.ToText())
    self.assertIs(q.flag, True)
    self.assertIsInstance(q.shape, tuple)
    self.assertIsInstance(q.nested[1], tuple)
    self.assertEqual(math.copysign(1.0, q.table['b']), -1.0)
    self.assertEqual(q.table['a'], 1e-30)
    self.assertIs(q.kind, Widget.Inner)
    self.assertIs(q.layers[1].cls, dict)
    self.assertIs(q.layers[2], Color.BLUE)
    self.assertIs(q.pair[1][0].cls, _Helper)
    self.assertEqual(q.name, p.name)

  def testToTextIsOneLinePerLeaf(self):
    text = _ModifiedModel().ToText()
    keys = [line.split(' : ', 1)[0] for line in text.split('\n')]
    self.assertEqual(len(keys), 24)
    self.assertEqual(len(set(keys)), len(keys))
    self.assertIn('pair[1][0].name', keys)

  def testFloatsRoundTripExactly(self):
    for value in (0.1, 1e-30, -0.0, 1 / 3, 2.0**-1074, 1e300, float('inf'),
                  -float('inf'), [float('inf')]):
      p = Params()
      p.Define('x', value, '')
      q = Params()
      q.Define('x', None, '')
      q.FromText(p.ToText())
      self.assertEqual(q.ToText(), p.ToText())
      self.assertEqual(q.x, value)
    p = Params()
    p.Define('x', float('nan'), '')
    self.assertTrue(math.isnan(p.Copy().FromText(p.ToText()).x))

  def testSemicolonSeparatedOverrides(self):
    p = _Model()
    p.FromText("encoder.dim : 32; name : 'a;b # c'; layers[1].dim: 5 ;"
               ' nested : ["x;y", \'\'\'q;"r"\'\'\'];')
    self.assertEqual(p.encoder.dim, 32)
    self.assertEqual(p.name, 'a;b # c')
    self.assertEqual(p.layers[1].dim, 5)
    self.assertEqual(p.nested, ['x;y', 'q;"r"'])

  def testCommentsAndBlankLines(self):
    p = _Model()
    p.FromText('# a comment : with a colon\n\n  lr : 0.5  # trailing\n'
               '   # indented comment; name : "skipped"\n')
    self.assertEqual(p.lr, 0.5)
    self.assertEqual(p.name, 'model')

  def testMalformedLineErrorNamesLineAndText(self):
    cases = [
        ('lr : 0.5\n\nnum_partitions 4', 'line 3', 'num_partitions 4'),
        ('lr : 0.5; name : [1,', 'line 1', 'name : [1,'),
        ('lr :', 'line 1', 'lr :'),
        ('name : undefined_name', 'line 1', 'undefined_name'),
        ('kind : no_such_module_xyz.Thing', 'line 1', 'no_such_module_xyz'),
        (f'kind : {__name__}.NoSuchClass', 'line 1', 'NoSuchClass'),
        ('lr..x : 1', 'line 1', 'lr..x'),
        ("lr : 1\nname : 'unterminated\nflag : True", 'line 2', 'unterminated'),
        ('name : f(1)', 'line 1', 'f(1)'),
    ]
    for text, line, snippet in cases:
      p = _Model()
      with self.assertRaises(hyperparams.ParamsParseError, msg=text) as ctx:
        p.FromText(text)
      self.assertIn(line, str(ctx.exception))
      self.assertIn(snippet, str(ctx.exception))
      self.assertEqual(p, _Model(), msg='a parse error must change nothing')
    self.assertTrue(issubclass(hyperparams.ParamsParseError, ValueError))

  def testUnknownKeyInText(self):
    p = _Model()
    with self.assertRaises(AttributeError) as ctx:
      p.FromText('lr : 1\nencoder.inner.epss : 2')
    self.assertIn("'encoder.inner.epss'", str(ctx.exception))
    self.assertIn('encoder.inner.eps', str(ctx.exception))
    self.assertIn('line 2', str(ctx.exception))

  def testFromTextNeedsExistingListElements(self):
    p = _Model()
    p.FromText("layers[1].name : 'second'; pair[1][0].dim : 2")
    self.assertEqual(p.layers[1].name, 'second')
    self.assertEqual(p.pair[1][0].dim, 2)
    short = _Model()
    short.layers = short.layers[:1]
    with self.assertRaisesRegex(AttributeError, '1 elements'):
      short.FromText(_ModifiedModel().ToText())
    with self.assertRaisesRegex(AttributeError, 'layers\\[0\\].dim'):
      _Model().Set(layers=[]).FromText('layers[0].dim : 1')
    replaced = _Model().FromText('layers : [1, 2]')
    self.assertEqual(replaced.layers, [1, 2])

  def testFromTextDoesNotCreateFields(self):
    p = Params()
    p.Define('sub', None, '')
    with self.assertRaisesRegex(AttributeError, "'sub.dim'.*NoneType"):
      p.FromText('sub.dim : 3')

  def testClassReferences(self):
    p = Params()
    p.Define('a', Widget, '')
    p.Define('b', Widget.Inner, '')
    p.Define('c', [float, abs, _Helper, Color.RED], '')
    p.Define('d', unittest.TestCase, '')
    text = p.ToText()
    self.assertIn(f'a : {__name__}.Widget\n', text)
    self.assertIn('builtins.float', text)
    self.assertIn('unittest.case.TestCase', text)
    q = Params()
    for name in 'abcd':
      q.Define(name, None, '')
    q.FromText(text)
    self.assertIs(q.a, Widget)
    self.assertIs(q.b, Widget.Inner)
    self.assertEqual(q.c, [float, abs, _Helper, Color.RED])
    self.assertIs(q.d, unittest.TestCase)


class InstantiableParamsTest(unittest.TestCase):

  def testInstantiateCallsClsWithParams(self):
    p = _Layer()
    widget = p.Instantiate(parent_path='model', params_extra=1)
    self.assertIsInstance(widget, Widget)
    self.assertIs(widget.params, p)
    self.assertEqual(widget.kwargs, {'parent_path': 'model', 'params_extra': 1})
    self.assertFalse(p.IsFrozen())

  def testCopyKeepsType(self):
    c = _Layer().Copy()
    self.assertIsInstance(c, InstantiableParams)
    self.assertIsInstance(c.Instantiate(), Widget)

  def testNoClsRaises(self):
    with self.assertRaisesRegex(ValueError, 'cls'):
      InstantiableParams().Instantiate()


if __name__ == '__main__':
  unittest.main()
