"""More of tensorpack 0.11's example pipelines, run on generated data with only their imports
changed (the companion of tests/test_tensorpack_examples.py, in the same style).

Each pipeline below is written from the calls of the example named above it: basics/ (the MNIST
and CIFAR convnets, export-model), keras/, SimilarityLearning/, Char-RNN/, CTC-TIMIT/,
DisturbLabel/, DeepQNetwork/expreplay.py (its DataFlow subclass only), boilerplate.py and the
code of docs/tutorial/{dataflow,extend/dataflow,philosophy/dataflow}.md. Only their dataflow,
dataset, serialize and imgaug calls are reproduced; the model code is left out.
"""
import gzip
import pickle

import numpy as np
import pytest

from dataflow import (AugmentImageComponent, BatchData, DataFlow, DataFromGenerator,
                      DataFromList, FakeData, LMDBSerializer, MapData, MapDataComponent,
                      MultiProcessRunnerZMQ, PrefetchDataZMQ, ProxyDataFlow, RNGDataFlow,
                      dataset, get_rng, imgaug, serialize, set_seed)

from .test_tensorpack_examples import make_cifar10, take


@pytest.fixture(autouse=True)
def _unseeded():
    yield
    set_seed(None)              # the tests that seed leave the library as they found it


def make_mnist(root, n_train=140, n_test=25):
    """MNIST's gzip IDX files in ``root/mnist_data``; labels cycle through 0..9."""
    d = root / "mnist_data"
    d.mkdir()
    rs = np.random.RandomState(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rs.randint(0, 256, (n, 28, 28)).astype(np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        with gzip.open(d / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(b"".join(v.to_bytes(4, "big") for v in (2051, n, 28, 28)) + images.tobytes())
        with gzip.open(d / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(b"".join(v.to_bytes(4, "big") for v in (2049, n)) + labels.tobytes())


@pytest.fixture
def mnist(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_mnist(tmp_path)


# == basics/mnist-convnet.py, mnist-tflayers.py, mnist-visualizations.py, keras/mnist-keras.py ====

def get_mnist_data():
    train = BatchData(dataset.Mnist('train'), 128)
    test = BatchData(dataset.Mnist('test'), 256, remainder=True)
    return train, test


def test_mnist_get_data(mnist):
    train, test = get_mnist_data()
    assert len(train) == train.size() == 1              # 140 images: one full batch of 128
    assert len(test) == 1                               # 25 images, remainder kept
    (images, labels), = take(test, 5)
    assert images.shape == (25, 28, 28) and images.dtype == np.float32
    assert 0 <= images.min() and images.max() <= 1
    assert labels.dtype == np.uint8 and sorted(labels.tolist()) == sorted(np.arange(25) % 10)
    # the attributes the SimilarityLearning example reads
    ds = dataset.Mnist('train', shuffle=False)
    assert ds.images.shape == (140, 28, 28, 1) and ds.images.dtype == np.float32
    assert ds.labels.shape == (140,) and ds.labels.dtype == np.uint8
    first = take(ds, 1)[0]
    np.testing.assert_array_equal(first[0], ds.images[0, :, :, 0])
    assert first[1] == 0


# == SimilarityLearning/embedding_data.py + mnist-embeddings.py ====================================

def digits_by_label(images, labels):
    return [list(images[np.where(labels == c)].reshape((-1, 28, 28))) for c in range(10)]


class MnistPairs(dataset.Mnist):
    """Written, as the example's, with the pre-0.9 ``get_data`` name: endless pairs, ``y = 1``
    when both digits have the same label."""

    def __init__(self, train_or_test):
        super(MnistPairs, self).__init__(train_or_test, shuffle=False)
        self.data_dict = digits_by_label(self.images, self.labels)

    def pick(self, label):
        idx = self.rng.randint(len(self.data_dict[label]))
        return self.data_dict[label][idx].astype(np.float32)

    def get_data(self):
        while True:
            y = self.rng.randint(2)
            if y == 0:
                a, b = self.rng.choice(10, size=2, replace=False)
            else:
                a = b = self.rng.randint(10)
            yield [self.pick(a), self.pick(b), y]


class MnistTriplets(MnistPairs):
    def get_data(self):
        while True:
            a, b = self.rng.choice(10, size=2, replace=False)
            yield [self.pick(a), self.pick(a), self.pick(b)]


def _label_of(img, ds):
    return int(ds.labels[[np.array_equal(img, x[:, :, 0]) for x in ds.images].index(True)])


def test_similarity_learning_pairs_and_triplets(mnist):
    ref = dataset.Mnist('train', shuffle=False)
    pairs = MnistPairs('train')
    assert [len(v) for v in pairs.data_dict] == [14] * 10
    (left, right, y), = take(BatchData(pairs, 128 // 2), 1)      # endless: take one batch
    assert left.shape == right.shape == (64, 28, 28) and left.dtype == np.float32
    assert y.shape == (64,) and set(y.tolist()) <= {0, 1}
    for k in range(8):
        same = _label_of(left[k], ref) == _label_of(right[k], ref)
        assert same == bool(y[k])
    (a, p, n), = take(BatchData(MnistTriplets('train'), 128 // 3), 1)
    assert a.shape == p.shape == n.shape == (42, 28, 28)
    for k in range(6):
        assert _label_of(a[k], ref) == _label_of(p[k], ref) != _label_of(n[k], ref)
    (digits, labels), = take(BatchData(dataset.Mnist('test'), 10), 1)   # get_test_data
    assert digits.shape == (10, 28, 28)


# == DisturbLabel/disturb.py + mnist-disturb.py ====================================================

class DisturbLabel(ProxyDataFlow):
    def __init__(self, ds, prob):
        super(DisturbLabel, self).__init__(ds)
        self.prob = prob

    def reset_state(self):
        super(DisturbLabel, self).reset_state()
        self.rng = get_rng(self)

    def get_data(self):
        for img, label in self.ds.get_data():
            if self.rng.rand() < self.prob:
                label = self.rng.choice(10)
            yield [img, label]


def test_disturb_label(mnist):
    ds = BatchData(DisturbLabel(dataset.Mnist('train'), 0.5), 16)
    assert len(ds) == 8
    batches = take(ds, 10)
    assert len(batches) == 8
    for images, labels in batches:
        assert images.shape == (16, 28, 28) and labels.shape == (16,)
        # the batch's dtype is its first label's: uint8 from Mnist, int32 for rng.choice's int
        assert labels.dtype in (np.uint8, np.int32) and set(labels.tolist()) <= set(range(10))
    kept = take(DisturbLabel(dataset.Mnist('test', shuffle=False), 0.0), 30)
    assert [int(label) for _, label in kept] == [k % 10 for k in range(25)]
    changed = take(DisturbLabel(dataset.Mnist('test', shuffle=False), 1.0), 30)
    assert all(type(label) is int for _, label in changed)


# == basics/cifar-convnet.py =======================================================================

def get_cifar_convnet_data(train_or_test, cifar_classnum, batch=128):
    isTrain = train_or_test == 'train'
    if cifar_classnum == 10:
        ds = dataset.Cifar10(train_or_test)
    else:
        ds = dataset.Cifar100(train_or_test)
    if isTrain:
        augmentors = [
            imgaug.RandomCrop((30, 30)),
            imgaug.Flip(horiz=True),
            imgaug.Brightness(63),
            imgaug.Contrast((0.2, 1.8)),
            imgaug.MeanVarianceNormalize(all_channel=True)]
    else:
        augmentors = [
            imgaug.CenterCrop((30, 30)),
            imgaug.MeanVarianceNormalize(all_channel=True)]
    ds = AugmentImageComponent(ds, augmentors)
    ds = BatchData(ds, batch, remainder=not isTrain)
    if isTrain:
        ds = MultiProcessRunnerZMQ(ds, 1)             # the example starts 5
    return ds


def make_cifar100(root, n_train=40, n_test=12):
    d = root / "cifar100_data" / "cifar-100-python"
    d.mkdir(parents=True)
    rs = np.random.RandomState(2)
    for name, n in (("train", n_train), ("test", n_test)):
        with open(d / name, "wb") as f:
            pickle.dump({b"data": rs.randint(0, 256, (n, 3072)).astype(np.uint8),
                         b"fine_labels": [int(v) for v in rs.randint(0, 100, n)]}, f)
    with open(d / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"fine{i}" for i in range(100)]}, f)


@pytest.mark.usefixtures("no_leaks")
def test_cifar_convnet_get_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path))
    make_cifar10(tmp_path, n_train=40, n_test=70)
    make_cifar100(tmp_path)
    train = get_cifar_convnet_data('train', 10, batch=16)
    assert len(train) == 2
    for x, y in take(train, 2):
        # MeanVarianceNormalize returns float32 (README: tensorpack 0.11 returned float64)
        assert x.shape == (16, 30, 30, 3) and x.dtype == np.float32
        assert y.shape == (16,) and y.dtype == np.int32
        for img in x:
            assert abs(float(img.mean())) < 1e-4 and abs(float(img.std()) - 1) < 1e-3
    test = take(get_cifar_convnet_data('test', 10, batch=64), 10)
    assert [len(b[1]) for b in test] == [64, 6]
    (x, y), = take(get_cifar_convnet_data('test', 100, batch=64), 10)
    assert x.shape == (12, 30, 30, 3) and y.max() < 100


# == Char-RNN/char-rnn.py ==========================================================================

class CharRNNData(RNGDataFlow):
    """``size`` random windows of ``seq_len + 1`` characters of the corpus, as input and
    next-character target."""

    def __init__(self, input_file, size, seq_len=50):
        self.seq_length = seq_len
        self._size = size
        with open(input_file, 'rb') as f:
            data = f.read()
        data = [chr(c) for c in data if c < 128]
        self.chars = sorted(set(data), key=data.count, reverse=True)
        self.char2idx = {c: i for i, c in enumerate(self.chars)}
        self.whole_seq = np.array([self.char2idx[c] for c in data], dtype='int32')

    def __len__(self):
        return self._size

    def __iter__(self):
        starts = self.rng.randint(0, self.whole_seq.shape[0] - self.seq_length - 1, (self._size,))
        for st in starts:
            seq = self.whole_seq[st:st + self.seq_length + 1]
            yield [seq[:-1], seq[1:]]


def test_char_rnn_data(tmp_path):
    corpus = tmp_path / "input.txt"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 5 + "caf\u00e9".encode())
    set_seed(3)
    ds = BatchData(CharRNNData(str(corpus), 20, seq_len=8), 8)
    assert len(ds) == 2                                      # remainder dropped
    batches = take(ds, 5)
    assert len(batches) == 2
    inv = ds.ds.chars
    for x, y in batches:
        assert x.shape == y.shape == (8, 8) and x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])    # y is x shifted by one
        text = "".join(inv[i] for i in x[0])
        assert text in "the quick brown fox jumps over the lazy dog\n" * 5 + "caf"
    set_seed(3)
    again = take(BatchData(CharRNNData(str(corpus), 20, seq_len=8), 8), 5)
    for (x, _), (x2, _) in zip(batches, again):
        np.testing.assert_array_equal(x, x2)                # reproducible with set_seed


# == CTC-TIMIT: create-lmdb.py (build + stat), timitdata.py, train-timit.py get_data ===============

class RawFeatures(DataFlow):
    """Stands for create-lmdb.py's RawTIMIT: ``[feature (T, 39) float64, label (L,) int]``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        rs = np.random.RandomState(self.n)
        for k in range(self.n):
            yield [rs.rand(5 + k, 39) * 10, np.arange(k % 4 + 1) * 3]


class TIMITBatch(ProxyDataFlow):
    """timitdata.py's: pads the features of ``batch`` datapoints to the longest and gives the
    labels as a sparse tensor. Like the example, it never calls ``ProxyDataFlow.__init__``."""

    def __init__(self, ds, batch):
        self.batch = batch
        self.ds = ds

    def __len__(self):
        return len(self.ds) // self.batch

    def __iter__(self):
        itr = self.ds.__iter__()
        for _ in range(self.__len__()):
            feats, labs = [], []
            for _ in range(self.batch):
                feat, lab = next(itr)
                feats.append(feat)
                labs.append(lab)
            padded = np.zeros((len(feats), max(f.shape[0] for f in feats), feats[0].shape[1]))
            for i, f in enumerate(feats):
                padded[i, :f.shape[0]] = f
            indices = np.asarray([[b, t] for b, lab in enumerate(labs) for t in range(len(lab))])
            values = np.asarray([c for lab in labs for c in lab])
            shape = [len(labs), max(len(lab) for lab in labs)]
            yield [padded, indices, values, shape, np.asarray([f.shape[0] for f in feats])]


def get_timit_data(path, isTrain, stat_file):
    ds = LMDBSerializer.load(path, shuffle=isTrain)
    with open(stat_file, 'rb') as f:
        mean, std = serialize.loads(f.read())
    ds = MapDataComponent(ds, lambda x: (x - mean) / std)
    ds = TIMITBatch(ds, 3)
    if isTrain:
        ds = PrefetchDataZMQ(ds, 1)
    return ds


@pytest.mark.usefixtures("no_leaks")
def test_ctc_timit_lmdb_stats_and_batches(tmp_path):
    db = str(tmp_path / "train.lmdb")
    LMDBSerializer.save(RawFeatures(7), db)              # create-lmdb.py build
    ds = LMDBSerializer.load(db, shuffle=False)          # create-lmdb.py stat
    ds.reset_state()
    feats = np.concatenate([dp[0] for dp in ds])
    del ds
    stat = tmp_path / "stats.data"
    stat.write_bytes(serialize.dumps([feats.mean(axis=0), feats.std(axis=0)]))
    test = get_timit_data(db, False, str(stat))
    assert len(test) == 2
    batches = take(test, 5)
    assert len(batches) == 2
    padded, indices, values, shape, seqlen = batches[0]
    assert padded.shape == (3, 7, 39) and padded.dtype == np.float64
    assert seqlen.tolist() == [5, 6, 7]
    assert shape == [3, 3] and values.tolist() == [0, 0, 3, 0, 3, 6]
    assert indices.tolist() == [[0, 0], [1, 0], [1, 1], [2, 0], [2, 1], [2, 2]]
    assert (padded[0, 5:] == 0).all()                    # padding stays zero
    stored = RawFeatures(7)
    first = next(iter(stored))[0]
    np.testing.assert_allclose(padded[0, :5], (first - feats.mean(0)) / feats.std(0))
    whole = np.concatenate([b[0][i, :n] for b in batches for i, n in enumerate(b[4])])
    np.testing.assert_allclose(whole.mean(0), 0, atol=0.35)
    train = get_timit_data(db, True, str(stat))
    train.reset_state()
    try:
        passes = [list(train), list(train)]       # each pass of the runner: len(ds) batches
    finally:
        train.close()
    assert len(train) == 2 and [len(p) for p in passes] == [2, 2]
    out = passes[0] + passes[1]
    assert all(len(b[4]) == 3 and b[0].shape[1] == b[4].max() for b in out)


# == keras/imagenet-resnet-keras.py (--fake, and the one-hot labels), basics/export-model.py,
#    boilerplate.py: FakeData =====================================================================

def test_fake_data_of_keras_export_and_boilerplate():
    train = FakeData([[4, 16, 16, 3], [4, 10]], 5, random=False, dtype='uint8')
    val = FakeData([[4, 16, 16, 3], [4, 10]], 5, random=False)
    a = take(train, 10)
    assert len(train) == len(a) == 5
    assert a[0][0].shape == (4, 16, 16, 3) and a[0][0].dtype == np.uint8
    assert all(np.array_equal(a[0][0], dp[0]) for dp in a)   # random=False: one datapoint
    v, = take(val, 1)
    assert v[0].dtype == v[1].dtype == np.float32 and 0 <= v[0].min() and v[0].max() < 1

    def one_hot(label):
        return np.eye(10)[label]
    labelled = BatchData(DataFromList([[np.zeros((2, 2, 3), np.uint8), k] for k in range(8)],
                                      shuffle=False), 4)
    (_, hot), _ = take(MapDataComponent(labelled, one_hot, 1), 2)
    assert hot.shape == (4, 10) and hot.dtype == np.float64
    assert hot.argmax(1).tolist() == [0, 1, 2, 3]

    export = BatchData(FakeData([[8, 8, 3], [8, 8, 3]], 10, random=False,
                                dtype=['uint8', 'uint8'], domain=[(0, 255), (0, 10)]), 1)
    (img, target), = take(export, 1)
    assert len(export) == 10 and img.shape == target.shape == (1, 8, 8, 3)
    assert img.dtype == target.dtype == np.uint8 and target.max() < 10


@pytest.mark.usefixtures("no_leaks")
def test_boilerplate_get_data():
    ds = FakeData([[28, 28, 3], [1]], 40, random=False,
                  dtype=['float32', 'uint8'], domain=[(0, 255), (0, 10)])
    ds = PrefetchDataZMQ(ds, 2)
    ds = BatchData(ds, 16)
    assert ds.size() == len(ds) == 2                     # steps_per_epoch=ds_train.size()
    for x, y in take(ds, 2):
        assert x.shape == (16, 28, 28, 3) and x.dtype == np.float32
        assert 0 <= x.min() and x.max() < 255
        assert y.shape == (16, 1) and y.dtype == np.uint8 and y.max() < 10


# == DeepQNetwork/expreplay.py: a DataFlow that is also a callback ================================

class _Callback:
    """Stands for tensorpack's Callback (the second base of ExpReplay)."""

    def setup_graph(self, trainer):
        self.trainer = trainer


class ExpReplay(DataFlow, _Callback):
    """The example's DataFlow part: every constructor argument set as an attribute through
    ``locals()``, its own ``get_rng(self)``, no ``DataFlow.__init__``, endless batches sampled
    from a memory."""

    def __init__(self, predictor_io_names, player, state_shape, batch_size, memory_size,
                 init_memory_size, init_exploration, update_frequency, history_len):
        init_memory_size = int(init_memory_size)
        for k, v in locals().items():
            if k != 'self':
                setattr(self, k, v)
        self.exploration = init_exploration
        self.rng = get_rng(self)
        self.state = np.arange(memory_size * 4, dtype='uint8').reshape((memory_size,) + state_shape)

    def __iter__(self):
        while True:
            idx = self.rng.randint(4 * self.update_frequency,
                                   self.memory_size - self.history_len - 1, size=self.batch_size)
            yield [np.asarray(self.state[idx], dtype='uint8'),
                   np.asarray(idx % 4, dtype='int8'),
                   np.zeros(len(idx), 'float32'), np.zeros(len(idx), 'bool')]


def test_expreplay_dataflow_subclass():
    e = ExpReplay(("state", "Qvalue"), None, (2, 2, 1), 8, 50, 20.0, 1.0, 4, 4)
    assert (e.batch_size, e.memory_size, e.init_memory_size, e.history_len) == (8, 50, 20, 4)
    e.reset_state()                                      # DataFlow's: keeps e.rng
    e.setup_graph("trainer")
    it = iter(e)
    for _ in range(3):
        state, action, reward, over = next(it)
        assert state.shape == (8, 2, 2, 1) and state.dtype == np.uint8
        assert action.dtype == np.int8 and reward.dtype == np.float32 and over.dtype == bool
        assert 16 <= state[:, 0, 0, 0].min() // 4 and state[:, 0, 0, 0].max() // 4 < 45
    with pytest.raises(NotImplementedError):
        len(e)


# == docs/tutorial/dataflow.md, extend/dataflow.md, philosophy/dataflow.md =========================

def test_dataflow_tutorial_snippets(no_leaks):
    def my_data_loader():
        for k in range(100):
            yield [np.full((2, 2), k), k]
    df = DataFromGenerator(my_data_loader)
    df.reset_state()
    assert [dp[1] for dp in df] == list(range(100))
    with pytest.raises(NotImplementedError):            # no length
        len(df)

    class MyDataFlow(DataFlow):
        def __iter__(self):
            for _ in range(100):
                yield [np.random.rand(28, 28), np.random.randint(10)]
    df = MyDataFlow()
    df.reset_state()
    points = list(df)
    assert len(points) == 100 and points[0][0].shape == (28, 28) and 0 <= points[0][1] < 10

    class ProcessingDataFlow(DataFlow):
        def __init__(self, ds):
            self.ds = ds

        def reset_state(self):
            self.ds.reset_state()

        def __iter__(self):
            for dp in self.ds:
                yield [dp[0] * 2]
    df = ProcessingDataFlow(DataFromList([[1], [2], [3]], shuffle=False))
    df.reset_state()
    assert list(df.get_data()) == [[2], [4], [6]]        # the old spelling still iterates

    # philosophy/dataflow.md: indices mapped to datapoints with __getitem__
    data = ["a", "b", "c"]
    df = MapData(DataFromList([[i] for i in range(3)], shuffle=False), lambda idx: data[idx[0]])
    assert take(df, 5) == ["a", "b", "c"]

    # dataflow.md: read, resize, batch, run in processes (here: one)
    df = DataFromList([[np.zeros((30, 40, 3), np.uint8), k] for k in range(4)], shuffle=True)
    df = AugmentImageComponent(df, [imgaug.Resize((225, 225))])
    df = BatchData(df, 2)
    df = PrefetchDataZMQ(df, 1)
    try:
        batches = take(df, 2)
    finally:
        df.close()
    assert [b[0].shape for b in batches] == [(2, 225, 225, 3)] * 2
    assert sorted(sum((b[1].tolist() for b in batches), [])) == [0, 1, 2, 3]
