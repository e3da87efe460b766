"""tensorpack 0.11's own ``tensorpack/dataflow/serialize_test.py``, ported: the same dataflow,
the same write-then-read check and the same four tests, with the import changed to ``dataflow``.

Two deliberate differences. tensorpack's ``run_write_read_test`` catches ``ImportError`` and
prints a message (so a missing optional dependency passes silently); here every dependency is
installed by the ``[test]`` extra, so nothing is caught and nothing can be skipped. And it
compares the two dataflows through ``zip``, which stops at the shorter one, so a read that gave
nothing (or a prefix) passed; here the read must also give exactly the datapoints written.
"""
import os
import tempfile
import unittest

import numpy as np

from dataflow import (DataFlow, HDF5Serializer, LMDBSerializer, NumpySerializer,
                      TFRecordSerializer)


class SeededFakeDataFlow(DataFlow):
    """docstring for SeededFakeDataFlow"""

    def __init__(self, seed=42, size=32):
        super(SeededFakeDataFlow, self).__init__()
        self.seed = seed
        self._size = size
        self.cache = []

    def reset_state(self):
        np.random.seed(self.seed)
        for _ in range(self._size):
            label = np.random.randint(low=0, high=10)
            img = np.random.randn(28, 28, 3)
            self.cache.append([label, img])

    def __len__(self):
        return self._size

    def __iter__(self):
        for dp in self.cache:
            yield dp


def delete_file_if_exists(fn):
    try:
        os.remove(fn)
    except OSError:
        pass


class SerializerTest(unittest.TestCase):

    def run_write_read_test(self, file, serializer, w_args, w_kwargs, r_args, r_kwargs):
        delete_file_if_exists(file)

        ds_expected = SeededFakeDataFlow()
        serializer.save(ds_expected, file, *w_args, **w_kwargs)
        ds_actual = serializer.load(file, *r_args, **r_kwargs)

        ds_actual.reset_state()
        ds_expected.reset_state()

        for dp_expected, dp_actual in zip(ds_expected.__iter__(), ds_actual.__iter__()):
            self.assertEqual(dp_expected[0], dp_actual[0])
            self.assertTrue(np.allclose(dp_expected[1], dp_actual[1]))
        # not in tensorpack (see the module doc): the whole file was read. (The fake dataflow
        # appends to its cache at every reset_state, so it holds two copies by now: the
        # datapoints written are its first len() ones.)
        self.assertEqual(len(list(ds_actual)), len(ds_expected))

    def test_lmdb(self):
        with tempfile.TemporaryDirectory() as f:
            self.run_write_read_test(
                os.path.join(f, 'test.lmdb'),
                LMDBSerializer,
                {}, {},
                {}, {'shuffle': False})

    def test_tfrecord(self):
        with tempfile.TemporaryDirectory() as f:
            self.run_write_read_test(
                os.path.join(f, 'test.tfrecord'),
                TFRecordSerializer,
                {}, {},
                {}, {'size': 32})

    def test_numpy(self):
        with tempfile.TemporaryDirectory() as f:
            self.run_write_read_test(
                os.path.join(f, 'test.npz'),
                NumpySerializer,
                {}, {},
                {}, {'shuffle': False})

    def test_hdf5(self):
        args = [['label', 'image']]
        with tempfile.TemporaryDirectory() as f:
            self.run_write_read_test(
                os.path.join(f, 'test.h5'),
                HDF5Serializer,
                args, {},
                args, {'shuffle': False})


if __name__ == '__main__':
    unittest.main()
