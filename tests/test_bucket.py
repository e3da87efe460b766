import numpy as np
import pytest

from dataflow import BucketBatchData, DataFlow, DataFromList


def seqs(lengths, dtype=np.int64):
    """Datapoints [array of `length` values, id]; the array holds id+1 so padding is visible."""
    return [[np.full(n, i + 1, dtype=dtype), i] for i, n in enumerate(lengths)]


PAD = {0: (None, 0)}  # pad component 0 to the batch max


def src(dps):
    return DataFromList(dps, shuffle=False)


def one_pass(df):
    df.reset_state()
    return list(iter(df))


def ids(batches):
    return [b[1].tolist() for b in batches]


class Passes(DataFlow):
    """Pass p yields the datapoints of passes[p]."""

    def __init__(self, passes):
        self.passes = passes
        self.n = 0

    def __iter__(self):
        dps = self.passes[self.n]
        self.n += 1
        yield from dps


# ---------------------------------------------------------------- bucketing

def test_length_equal_to_boundary_goes_to_next_bucket():
    # buckets [0,3) [3,5) [5,inf): lengths 3 and 5 open the upper buckets
    lengths = [3, 2, 5, 4, 9, 0]
    df = BucketBatchData(src(seqs(lengths)), [3, 5], [2, 2, 2], pad_info=PAD)
    out = one_pass(df)
    assert ids(out) == [[0, 3], [2, 4], [1, 5]]


def test_batch_size_per_bucket():
    lengths = [1] * 6 + [4] * 6 + [10] * 6
    df = BucketBatchData(src(seqs(lengths)), [3, 5], [3, 2, 6])
    out = one_pass(df)
    assert [len(b[1]) for b in out] == [3, 3, 2, 2, 2, 6]
    assert ids(out) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11],
                        [12, 13, 14, 15, 16, 17]]
    # without padding, same-length arrays stack as BatchData does
    assert out[0][0].shape == (3, 1) and out[0][0].dtype == np.int64
    assert out[0][1].dtype == np.int32


def test_emitted_when_a_bucket_fills_in_fill_order():
    # bucket 1 ([2, inf)) fills first, at datapoint 3; bucket 0 fills at datapoint 5
    lengths = [0, 5, 6, 7, 1, 1, 8]
    df = BucketBatchData(src(seqs(lengths)), [2], [3, 3], pad_info=PAD)
    out = one_pass(df)
    assert ids(out) == [[1, 2, 3], [0, 4, 5], [6]]


def test_remainder_flushed_in_bucket_order():
    lengths = [9, 1, 4, 9, 1]  # bucket 2 gets 2, bucket 0 gets 2, bucket 1 gets 1
    df = BucketBatchData(src(seqs(lengths)), [3, 5], [3, 3, 3])
    assert ids(one_pass(df)) == [[1, 4], [2], [0, 3]]


def test_drop_remainder():
    lengths = [9, 1, 4, 9, 1, 9]
    df = BucketBatchData(src(seqs(lengths)), [3, 5], [3, 3, 3], drop_remainder=True)
    assert ids(one_pass(df)) == [[0, 3, 5]]


def test_each_pass_starts_with_empty_buckets():
    p1 = [[np.zeros(1), 0], [np.zeros(1), 1], [np.zeros(1), 2]]
    p2 = [[np.zeros(1), 10], [np.zeros(1), 11]]
    df = BucketBatchData(Passes([p1, p2]), [5], [2, 2], drop_remainder=True)
    df.reset_state()
    assert ids(iter(df)) == [[0, 1]]
    # datapoint 2 of pass 1 was dropped, not carried over into pass 2
    assert ids(iter(df)) == [[10, 11]]


def test_len_is_not_implemented():
    df = BucketBatchData(src(seqs([1, 2])), [3], [1, 1])
    with pytest.raises(NotImplementedError, match="BucketBatchData does not know its length"):
        len(df)


def test_exported_from_package():
    import dataflow
    assert dataflow.BucketBatchData is BucketBatchData


# ---------------------------------------------------------------- lengths

def test_scalar_component_has_length_zero():
    dps = [[3.5, "a"], [np.float32(1), "b"], [np.array(7), "c"], [np.zeros(2), "d"]]
    df = BucketBatchData(src(dps), [1], [3, 3])
    out = one_pass(df)
    assert [b[1].tolist() for b in out] == [["a", "b", "c"], ["d"]]


def test_list_component_length_is_its_len():
    dps = [[[1, 2, 3], 0], [(1,), 1], [[], 2]]
    df = BucketBatchData(src(dps), [2], [2, 2])
    assert ids(one_pass(df)) == [[1, 2], [0]]


def test_custom_element_length_function():
    dps = [[np.zeros(1), "x" * n] for n in (5, 1, 6, 2)]
    df = BucketBatchData(src(dps), [3], [2, 2], element_length_function=lambda dp: len(dp[1]))
    out = one_pass(df)
    assert [b[1].tolist() for b in out] == [["xxxxx", "xxxxxx"], ["x", "xx"]]


def test_custom_length_may_be_numpy_int():
    df = BucketBatchData(src(seqs([1, 2])), [3], [2, 2], pad_info=PAD,
                         element_length_function=lambda dp: np.int64(dp[1]))
    assert ids(one_pass(df)) == [[0, 1]]


@pytest.mark.parametrize("bad", [1.5, 2.0, "3", None, True])
def test_non_int_length_names_the_datapoint(bad):
    df = BucketBatchData(src(seqs([1, 1, 1])), [3], [5, 5],
                         element_length_function=lambda dp: bad if dp[1] == 2 else 1)
    with pytest.raises(TypeError, match=r"length of datapoint 2 of this pass must be an int"):
        one_pass(df)


def test_negative_length_names_the_datapoint():
    df = BucketBatchData(src(seqs([1, 1])), [3], [5, 5],
                         element_length_function=lambda dp: -1 if dp[1] == 1 else 1)
    with pytest.raises(ValueError, match=r"length of datapoint 1 of this pass is -1; "
                                         r"it must be >= 0"):
        one_pass(df)


def test_default_length_of_unknown_type_is_an_error():
    df = BucketBatchData(src([[object()]]), [3], [1, 1])
    with pytest.raises(TypeError, match="cannot take the length of component 0 of type object"):
        one_pass(df)


def test_non_datapoint_is_an_error_naming_it():
    df = BucketBatchData(src([[np.zeros(2)], np.zeros(3)]), [3], [1, 1])
    with pytest.raises(ValueError, match="datapoint 1 of this pass is a ndarray; a datapoint "
                                         "has to be a list, tuple or dict"):
        one_pass(df)


# ---------------------------------------------------------------- dict datapoints

def test_dict_datapoints_default_length_is_first_value():
    dps = [{"tokens": np.arange(n), "label": n} for n in (1, 4, 2, 5)]
    df = BucketBatchData(src(dps), [3], [2, 2], pad_info={"tokens": (None, -1)})
    out = one_pass(df)
    assert [list(b) for b in out] == [["tokens", "label"]] * 2
    assert out[0]["label"].tolist() == [1, 2]
    np.testing.assert_array_equal(out[0]["tokens"], [[0, -1], [0, 1]])
    assert out[1]["label"].tolist() == [4, 5]
    np.testing.assert_array_equal(out[1]["tokens"], [[0, 1, 2, 3, -1], [0, 1, 2, 3, 4]])


def test_dict_datapoints_custom_length_and_boundary_padding():
    dps = [{"label": n, "tokens": np.ones(n, np.float32)} for n in (1, 2)]
    df = BucketBatchData(src(dps), [4, 8], [2, 2, 2], element_length_function=lambda d: d["label"],
                         pad_info={"tokens": (None, 0.5)}, pad_to_bucket_boundary=True)
    (batch,) = one_pass(df)
    assert batch["tokens"].dtype == np.float32
    np.testing.assert_array_equal(batch["tokens"], [[1, 0.5, 0.5], [1, 1, 0.5]])


# ---------------------------------------------------------------- padding

def test_pad_to_batch_max_every_dimension():
    dps = [[np.ones((1, 3), np.uint8), 0], [np.full((2, 1), 2, np.uint8), 1]]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={0: (None, 9)})
    (batch,) = one_pass(df)
    assert batch[0].dtype == np.uint8
    np.testing.assert_array_equal(batch[0], [[[1, 1, 1], [9, 9, 9]],
                                             [[2, 9, 9], [2, 9, 9]]])
    assert batch[1].tolist() == [0, 1]


def test_pad_to_explicit_shape_with_none_entries():
    dps = [[np.ones((1, 2)), 0], [np.ones((3, 1)), 1]]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={0: ((None, 4), 0)})
    (batch,) = one_pass(df)
    assert batch[0].shape == (2, 3, 4)
    assert batch[0].sum() == 2 + 3


def test_pad_to_explicit_shape():
    df = BucketBatchData(src(seqs([1, 2])), [10], [2, 2], pad_info={0: ([4], 0)})
    (batch,) = one_pass(df)
    np.testing.assert_array_equal(batch[0], [[1, 0, 0, 0], [2, 2, 0, 0]])


def test_pad_value_is_cast_to_the_dtype():
    df = BucketBatchData(src(seqs([1, 2], dtype=np.int32)), [10], [2, 2],
                         pad_info={0: (None, 7.9)})
    (batch,) = one_pass(df)
    assert batch[0].dtype == np.int32
    np.testing.assert_array_equal(batch[0], [[1, 7], [2, 2]])


def test_pad_value_none_means_zero():
    df = BucketBatchData(src(seqs([1, 2])), [10], [2, 2], pad_info={0: (None, None)})
    (batch,) = one_pass(df)
    np.testing.assert_array_equal(batch[0], [[1, 0], [2, 2]])


def test_padding_python_lists():
    dps = [[[1, 2, 3], 0], [[4], 1]]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={0: (None, 0)})
    (batch,) = one_pass(df)
    np.testing.assert_array_equal(batch[0], [[1, 2, 3], [4, 0, 0]])


def test_unpadded_components_are_batched_as_is():
    dps = [[np.arange(n), np.zeros(2), "s"] for n in (1, 3)]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={0: (None, 0)})
    (batch,) = one_pass(df)
    assert batch[1].shape == (2, 2)
    assert batch[2].tolist() == ["s", "s"]


def test_pad_to_bucket_boundary():
    # buckets [0,3) [3,6) [6,inf): pad to 2 and to 5
    df = BucketBatchData(src(seqs([1, 4, 2, 3])), [3, 6], [2, 2, 2], pad_info={0: (None, 0)},
                         pad_to_bucket_boundary=True)
    out = one_pass(df)
    assert ids(out) == [[0, 2], [1, 3]]
    np.testing.assert_array_equal(out[0][0], [[1, 0], [3, 3]])
    np.testing.assert_array_equal(out[1][0], [[2, 2, 2, 2, 0], [4, 4, 4, 0, 0]])


def test_pad_to_bucket_boundary_only_dimension_zero():
    dps = [[np.ones((1, 2)), 0], [np.ones((2, 3)), 1]]
    df = BucketBatchData(src(dps), [4], [2, 2], pad_info={0: (None, 0)},
                         pad_to_bucket_boundary=True)
    (batch,) = one_pass(df)
    assert batch[0].shape == (2, 3, 3)  # dim 0 to the boundary - 1, dim 1 to the batch max


def test_pad_to_bucket_boundary_explicit_dim0_wins():
    df = BucketBatchData(src(seqs([1, 2])), [4], [2, 2], pad_info={0: ([6], 0)},
                         pad_to_bucket_boundary=True)
    (batch,) = one_pass(df)
    assert batch[0].shape == (2, 6)


def test_pad_to_bucket_boundary_every_none_dimension_of_a_pad_shape():
    # as MindSpore: each None entry of pad_shape goes to the boundary minus 1, given ones stay
    dps = [[np.ones((1, 2)), 0], [np.ones((5, 3)), 1]]
    for pad_shape, want in (((None, None), (2, 5, 5)), ((8, None), (2, 8, 5)),
                            ((None, 4), (2, 5, 4))):
        df = BucketBatchData(src(dps), [6], [2, 2], pad_info={0: (pad_shape, 0)},
                             pad_to_bucket_boundary=True)
        (batch,) = one_pass(df)
        assert batch[0].shape == want, pad_shape
        np.testing.assert_array_equal(batch[0][1, :5, :3], 1)
        assert batch[0].sum() == 2 + 15


def test_pad_to_bucket_boundary_with_full_pad_shapes_uses_no_boundary():
    # every pad_shape given in full: nothing to pad to a boundary, so the last bucket is fine
    df = BucketBatchData(src(seqs([1, 7])), [3], [2, 2], pad_info={0: ([8], 0)},
                         pad_to_bucket_boundary=True)
    out = one_pass(df)
    assert [b[0].shape for b in out] == [(1, 8), (1, 8)]


def test_pad_to_bucket_boundary_remainder_batch():
    df = BucketBatchData(src(seqs([5])), [3, 8], [4, 4, 4], pad_info={0: (None, 0)},
                         pad_to_bucket_boundary=True)
    (batch,) = one_pass(df)
    np.testing.assert_array_equal(batch[0], [[1, 1, 1, 1, 1, 0, 0]])


# ---------------------------------------------------------------- errors at construction

@pytest.mark.parametrize("boundaries, sizes, match", [
    ([3, 3], [1, 1, 1], r"strictly increasing; bucket_boundaries\[0\]=3 and "
                        r"bucket_boundaries\[1\]=3"),
    ([5, 2], [1, 1, 1], r"strictly increasing"),
    ([0, 2], [1, 1, 1], r"positive ints; bucket_boundaries\[0\] is 0"),
    ([-1], [1, 1], r"positive ints; bucket_boundaries\[0\] is -1"),
    ([2.5], [1, 1], r"positive ints; bucket_boundaries\[0\] is 2.5"),
    (3, [1, 1], r"bucket_boundaries must be a list of ints, got int"),
    ([3], [1], r"one entry per bucket, len\(bucket_boundaries\) \+ 1 = 2, got 1"),
    ([3], [1, 1, 1], r"one entry per bucket, len\(bucket_boundaries\) \+ 1 = 2, got 3"),
    ([3], [1, 0], r"positive ints; bucket_batch_sizes\[1\] is 0"),
    ([3], [1, -2], r"positive ints; bucket_batch_sizes\[1\] is -2"),
    ([3], [1, True], r"positive ints; bucket_batch_sizes\[1\] is True"),
    ([3], 4, r"bucket_batch_sizes must be a list of ints, got int"),
])
def test_invalid_buckets(boundaries, sizes, match):
    with pytest.raises(ValueError, match=match):
        BucketBatchData(src([]), boundaries, sizes)


def test_no_boundaries_is_one_bucket():
    df = BucketBatchData(src(seqs([1, 9, 3])), [], [2], pad_info=PAD)
    assert ids(one_pass(df)) == [[0, 1], [2]]


def test_pad_to_bucket_boundary_requires_pad_info():
    for pad_info in (None, {}):
        with pytest.raises(ValueError, match="pad_to_bucket_boundary=True needs pad_info"):
            BucketBatchData(src([]), [3], [1, 1], pad_info=pad_info, pad_to_bucket_boundary=True)


@pytest.mark.parametrize("pad_info, match", [
    ([(None, 0)], r"pad_info must be None or a dict, got list"),
    ({0: None}, r"pad_info\[0\] must be a pair \(pad_shape, pad_value\), got None"),
    ({0: (None,)}, r"pad_info\[0\] must be a pair"),
    ({"a": (5, 0)}, r"pad_info\['a'\]: pad_shape must be None or a tuple/list"),
    ({0: ((2, -1), 0)}, r"pad_info\[0\]: pad_shape entries must be None or non-negative ints"),
    ({0: ((2.5,), 0)}, r"pad_shape entries must be None or non-negative ints"),
])
def test_invalid_pad_info(pad_info, match):
    with pytest.raises(ValueError, match=match):
        BucketBatchData(src([]), [3], [1, 1], pad_info=pad_info)


def test_length_function_must_be_callable():
    with pytest.raises(ValueError, match="element_length_function must be callable"):
        BucketBatchData(src([]), [3], [1, 1], element_length_function=3)


# ---------------------------------------------------------------- errors while iterating

def test_unequal_shapes_without_padding_name_the_component():
    df = BucketBatchData(src(seqs([1, 2])), [10], [2, 2])
    with pytest.raises(ValueError, match="BatchData: cannot batch component 0"):
        one_pass(df)


def test_last_bucket_with_pad_to_bucket_boundary_names_the_length():
    df = BucketBatchData(src(seqs([1, 7])), [3, 6], [4, 4, 4], pad_info={0: (None, 0)},
                         pad_to_bucket_boundary=True)
    with pytest.raises(ValueError, match=r"datapoint 1 of this pass has length 7, in the last "
                                         r"bucket \[6, inf\)"):
        one_pass(df)


def test_larger_than_explicit_shape_names_component_and_shapes():
    df = BucketBatchData(src(seqs([1, 2, 5])), [10], [3, 3], pad_info={0: ([4], 0)})
    with pytest.raises(ValueError, match=r"cannot pad component 0: datapoint 2 has shape \(5,\), "
                                         r"larger than the target shape \(4,\)"):
        one_pass(df)


def test_larger_than_bucket_boundary_names_component_and_shapes():
    # the length comes from component 1, so component 0 may exceed the boundary
    dps = [[np.zeros(n), 0] for n in (1, 5)]
    df = BucketBatchData(src(dps), [3], [2, 2], element_length_function=lambda dp: dp[1],
                         pad_info={0: (None, 0)}, pad_to_bucket_boundary=True)
    with pytest.raises(ValueError, match=r"cannot pad component 0: datapoint 1 has shape \(5,\), "
                                         r"larger than the target shape \(2,\)"):
        one_pass(df)


def test_rank_mismatch_names_the_component():
    dps = [{"x": np.zeros(2)}, {"x": np.zeros((2, 2))}]
    df = BucketBatchData(src(dps), [10], [2, 2], element_length_function=lambda dp: 0,
                         pad_info={"x": (None, 0)})
    with pytest.raises(ValueError, match=r"cannot pad component 'x': its values must have the "
                                         r"same rank; shapes in the batch: \[\(2,\), \(2, 2\)\]"):
        one_pass(df)


def test_rank_differs_from_pad_shape_names_the_component():
    df = BucketBatchData(src(seqs([1, 2])), [10], [2, 2], pad_info={0: ((3, 3), 0)})
    with pytest.raises(ValueError, match=r"cannot pad component 0: its values must have rank 2 "
                                         r"\(pad_shape \(3, 3\)\)"):
        one_pass(df)


def test_scalar_component_cannot_be_padded_to_the_boundary():
    dps = [[np.zeros(1), 5]]
    df = BucketBatchData(src(dps), [3], [1, 1], pad_info={1: (None, 0)},
                         pad_to_bucket_boundary=True)
    with pytest.raises(ValueError, match="cannot pad component 1 to the bucket boundary: its "
                                         "values are scalars"):
        one_pass(df)


def test_pad_value_that_does_not_fit_the_dtype():
    df = BucketBatchData(src(seqs([1, 2], dtype=np.uint8)), [10], [2, 2],
                         pad_info={0: (None, -1)})
    with pytest.raises(ValueError, match=r"cannot pad component 0: pad_value -1 does not fit its "
                                         r"dtype uint8"):
        one_pass(df)


def test_strings_and_bytes_are_padded_without_being_cut():
    dps = [[["a"], [b"x"], 0], [["ccc", "dd"], [b"yyy", b"zz"], 1]]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={0: (None, None), 1: (None, None)})
    (batch,) = one_pass(df)
    assert batch[0].tolist() == [["a", ""], ["ccc", "dd"]]
    assert batch[1].tolist() == [[b"x", b""], [b"yyy", b"zz"]]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={0: (None, "<pad>")})
    (batch,) = one_pass(df)
    assert batch[0].tolist() == [["a", "<pad>"], ["ccc", "dd"]]


@pytest.mark.parametrize("values, dtype, expected", [
    ([[], [1, 2]], np.int64, [[0, 0], [1, 2]]),           # an empty value has no dtype to give
    ([[1, 2], [1.5]], np.float64, [[1, 2], [1.5, 0]]),
    ([np.array([1], np.int32), np.array([2 ** 40])], np.int64, [[1], [2 ** 40]]),
])
def test_padded_batch_has_the_common_dtype_in_any_order(values, dtype, expected):
    for order in (1, -1):
        dps = [[v, i] for i, v in enumerate(values)][::order]
        (batch,) = one_pass(BucketBatchData(src(dps), [10], [2, 2], pad_info=PAD))
        assert batch[0].dtype == dtype
        assert batch[0].tolist() == expected[::order]


def test_components_not_in_pad_info_are_padded_with_zeros_when_ragged():
    # as MindSpore's bucket_batch_by_length: with pad_info, every other component is padded to
    # the longest in the batch with 0 (those of one shape are stacked as BatchData does)
    dps = [[np.arange(2), np.ones(2), 7], [np.arange(3), np.ones(3), 8]]
    (batch,) = one_pass(BucketBatchData(src(dps), [10], [2, 2], pad_info={0: (None, -1)}))
    assert batch[0].tolist() == [[0, 1, -1], [0, 1, 2]]
    assert batch[1].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch[2].tolist() == [7, 8] and batch[2].dtype == np.int32


def test_explicit_scalar_pad_shape_with_pad_to_bucket_boundary():
    dps = [[np.zeros(1), 5], [np.zeros(2), 6]]
    df = BucketBatchData(src(dps), [3], [2, 2], pad_info={0: (None, 0), 1: ((), 0)},
                         pad_to_bucket_boundary=True)
    (batch,) = one_pass(df)
    assert batch[0].shape == (2, 2) and batch[1].tolist() == [5, 6]


def test_ragged_component_without_pad_info_names_the_datapoints_of_the_pass():
    dps = [[np.zeros(n), i] for i, n in enumerate([2, 9, 9, 3])]
    df = BucketBatchData(src(dps), [5], [2, 2])
    with pytest.raises(ValueError, match=r"BucketBatchData: cannot batch component 0 of "
                                         r"datapoints \[0, 3\] of this pass without padding "
                                         r"\(give pad_info\)"):
        one_pass(df)


@pytest.mark.parametrize("second, match", [
    ({"x": np.zeros(1)}, r"datapoint 1 of this pass has components \['x'\], datapoint 0 of "
                         r"the same batch \['x', 'y'\]"),
    ({"x": np.zeros(1), "y": 1, "z": 2}, r"datapoint 1 of this pass has components"),
])
def test_datapoints_of_another_structure_name_the_datapoint(second, match):
    dps = [{"x": np.zeros(1), "y": 0}, second]
    df = BucketBatchData(src(dps), [10], [2, 2], pad_info={"x": (None, 0)})
    with pytest.raises(ValueError, match=match):
        one_pass(df)


def test_error_in_the_length_function_names_the_datapoint():
    df = BucketBatchData(src(seqs([1, 2])), [10], [2, 2],
                         element_length_function=lambda dp: {0: 1}[dp[1]])
    with pytest.raises(KeyError) as info:
        one_pass(df)
    # in __notes__ on 3.10 too (printed from 3.11 on)
    assert "element_length_function of datapoint 1 of this pass" in str(info.value.__notes__)


def test_pad_info_names_a_missing_component():
    df = BucketBatchData(src(seqs([1])), [10], [2, 2], pad_info={"tokens": (None, 0)})
    with pytest.raises(ValueError, match=r"pad_info names component 'tokens', which datapoint 0 "
                                         r"of this pass does not have \(it has \[0, 1\]\)"):
        one_pass(df)


def test_ragged_value_cannot_be_padded():
    dps = [[[[1, 2], [3]], 0]]
    df = BucketBatchData(src(dps), [10], [1, 1], pad_info={0: (None, 0)})
    with pytest.raises(ValueError, match="cannot pad component 0: a value is not an array"):
        one_pass(df)
