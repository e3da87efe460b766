"""The benchmark harness's workloads fbresnet, lmdb and lmdb-tiny (issue 19), cheaply: what their
map functions return, that the run's data is written and removed, and which systems run them.
(The measuring itself is `python -m benchmarks`, never a test.)"""
import os

import numpy as np
import pytest

from benchmarks import harness, systems, workloads, zygote  # noqa: E402


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(workloads.DATA_DIR_ENV, str(tmp_path))
    yield tmp_path
    workloads.close_lmdb()


@pytest.mark.parametrize("wid,n", [("lmdb", 3), ("lmdb-tiny", 20)])
def test_lmdb_reader_returns_the_records_written(data_dir, wid, n):
    workloads.write_lmdb(str(data_dir), wid, n)
    wl = workloads.WORKLOADS[wid]
    # the source cycles through the file's records, past the run's reads by the margin
    source = wl.make_source(2 * n)
    assert source == [[k % n] for k in range(2 * n + workloads.LMDB_MARGIN)]
    wl.warm()
    for (k,), want in zip(source, workloads.lmdb_datapoints(wid, n)):
        got = wl.func([k])
        assert wl.check(got)
        np.testing.assert_array_equal(got[0], want[0])     # the uint8 array, or the int
        np.testing.assert_array_equal(got[1], want[1])
    # the consumer reads the arrays' pages, and counts their bytes
    big = workloads.read_lmdb([0]) if wid == "lmdb" else None
    if big is not None:
        assert big[0].dtype == np.uint8 and big[0].ndim == 1
        assert workloads.consume(big) == len(big[0])
        assert workloads.consume((tuple(big[:1]), np.arange(1))) == len(big[0]) + 8


def test_lmdb_reader_names_a_missing_record(data_dir):
    workloads.write_lmdb(str(data_dir), "lmdb-tiny", 2)
    with pytest.raises(KeyError, match="no record 5"):
        workloads.read_lmdb_tiny([5])


def test_fbresnet_map_builds_its_augmentors_once_per_process():
    from benchmarks.decoders import make_jpegs
    dps = [[np.frombuffer(b, np.uint8), k] for k, b in enumerate(make_jpegs(2, seed=3))]
    out = [workloads.map_fbresnet(dp) for dp in dps]
    first = workloads._fbresnet_augmentor_list()
    assert workloads._fbresnet_augmentor_list() is first
    for x, label in out:
        assert x.shape == (224, 224, 3) and x.dtype == np.uint8 and x.flags.c_contiguous
    assert [label for _, label in out] == [0, 1]
    assert workloads._check_fb_batch([np.stack([x for x, _ in out] * 16), np.arange(32)])


def test_fbresnet_thread_pool_control_yields_its_pass_in_batches_in_order(monkeypatch, no_leaks):
    """benchmarks.images' control `threadpool` (ThreadPoolExecutor(2).map over the same map
    function): one pass of FB_REPEAT times the source, in order, in batches; closing it stops
    its threads and gives OpenCV back its thread count."""
    import cv2
    from benchmarks import images
    from benchmarks.decoders import make_jpegs
    monkeypatch.setattr(images, "BATCH", 4)
    source = [[np.frombuffer(b, np.uint8), k] for k, b in enumerate(make_jpegs(4, seed=3))]
    before = cv2.getNumThreads()
    stream, closer, executor = images._open("fbresnet", "threadpool", source)
    try:
        batches = [next(stream) for _ in range(images.FB_REPEAT)]
        with pytest.raises(StopIteration):
            next(stream)
    finally:
        closer.close()
    assert executor == "2 threads" and cv2.getNumThreads() == before
    for x, labels in batches:
        assert x.shape == (4, 224, 224, 3) and x.dtype == np.uint8
        assert labels.tolist() == [0, 1, 2, 3]


def test_prepared_data_is_written_then_removed(monkeypatch, no_leaks):
    monkeypatch.delenv(workloads.DATA_DIR_ENV, raising=False)
    monkeypatch.delenv("TENSORPACK_SERIALIZE", raising=False)
    args = harness.parse_args(["--quick", "--workloads", "lmdb-tiny"])
    with harness.prepared_data(args) as notes:
        d = os.environ[workloads.DATA_DIR_ENV]
        assert os.path.exists(os.path.join(d, "lmdb-tiny.mdb")), notes
        assert os.environ["TENSORPACK_SERIALIZE"] == "msgpack"
        assert workloads.lmdb_records("lmdb-tiny") == harness.LMDB_RECORDS["lmdb-tiny"]
    assert not os.path.exists(d)
    assert workloads.DATA_DIR_ENV not in os.environ
    assert "TENSORPACK_SERIALIZE" not in os.environ


def test_prepared_data_is_removed_on_error(monkeypatch):
    monkeypatch.delenv(workloads.DATA_DIR_ENV, raising=False)
    made = []
    real_mkdtemp = harness.tempfile.mkdtemp

    def mkdtemp(**kw):
        made.append(real_mkdtemp(**kw))
        return made[-1]

    def run(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(harness.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(harness.subprocess, "run", run)
    args = harness.parse_args(["--quick", "--workloads", "fbresnet"])
    with pytest.raises(RuntimeError, match="boom"):
        with harness.prepared_data(args):
            pass
    assert len(made) == 1 and not os.path.exists(made[0])
    assert workloads.DATA_DIR_ENV not in os.environ


def test_every_family_runs_the_new_workloads():
    args = harness.parse_args(["--workloads", "all"])
    assert {"fbresnet", "lmdb", "lmdb-tiny"} <= set(args.workloads)
    families = {systems.SYSTEMS[s][0] for s in args.systems}
    for w in ("fbresnet", "lmdb", "lmdb-tiny"):
        assert {systems.SYSTEMS[s][0] for s in args.systems if systems.applies(s, w)} == families
        assert harness.COUNTS[w][1] < harness.COUNTS[w][0]
    assert systems.applies("dataflow-table", "fbresnet")
    assert not systems.applies("dataflow-table", "lmdb")
    for batching in systems.BATCHING:      # batches of 32 where stacking makes one array
        assert not systems.applies(batching, "fbresnet")
        assert not systems.applies(batching, "lmdb")
        assert systems.applies(batching, "lmdb-tiny") and systems.applies(batching, 1)
    assert systems.SYSTEMS["torch-batch32"][2] == "dataflow-batch32"
    # dataflow's batcher takes list datapoints: a bare array result (workloads 2, 3) is wrapped
    as_components = systems._AsComponents(workloads.map_image)
    out = as_components([7])
    assert type(out) is list and len(out) == 1 and out[0].shape == (224, 224, 3)
    assert systems._AsComponents(workloads.map_python)([7])[0] == 7
    assert "LMDBSerializer.load" in systems.description("dataflow-serial", "lmdb")
    assert "read_lmdb_tiny" in systems.description("grain-serial", "lmdb-tiny")
    # torch's collate keeps a batch's byte strings in a tuple
    assert zygote._check_batch([(b"a",) * 32, np.arange(32)], 32)
    assert not zygote._check_batch([(b"a",) * 31, np.arange(32)], 32)


def test_measured_window_lasts_the_minimum_time_and_count(monkeypatch):
    """A run reads at least the count and, with min_s, goes on to the first clock read past
    min_s (at most the limit); without min_s it stops at the count. fbresnet and the LMDB
    workloads never go past their count (one pass of their source)."""
    monkeypatch.setattr(zygote, "send", lambda tag, payload: None)
    family = systems.Family("dataflow")
    cmd = {"system": "dataflow-serial", "workload": 1, "count": 100, "limit": 10 ** 6,
           "min_s": 0.05, "max_s": 5.0}
    rec = zygote.measure(family, cmd)
    assert rec["measure_s"] >= 0.05 and 100 < rec["count"] < 10 ** 6
    assert rec["count"] % zygote.CHECK_EVERY == 0          # stopped at a clock read
    rec = zygote.measure(family, dict(cmd, limit=300, min_s=5.0))
    assert rec["count"] == 300 and rec["measure_s"] < 5.0  # the limit ends it first
    rec = zygote.measure(family, dict(cmd, min_s=0.0))
    assert rec["count"] == 100
    for w in harness.ONE_PASS:
        assert harness.count_limit(w) == harness.COUNTS[w][0]
    assert harness.count_limit(1) == harness.COUNTS[1][0] * harness.EXTEND_LIMIT
    assert harness.count_limit(1, quick=True) == harness.COUNTS[1][1]


def test_systems_run_in_alternating_directions_repeat_by_repeat():
    plan = harness.run_plan([1, 2], 3, ["dataflow-serial", "tensorpack-serial", "torch-serial"],
                            [2])
    order = [(w, r, s) for w, r, s, _ in plan]
    forward = ["dataflow-serial", "tensorpack-serial", "torch-serial"]
    expected = [(w, r, s) for w in (1, 2) for r in range(3)
                for s in (forward if r % 2 == 0 else forward[::-1])]
    assert order == expected
    # no system always follows the same one within a workload
    for w in (1, 2):
        runs = [s for ww, _, s in order if ww == w]
        before = {}
        for prev, cur in zip(runs, runs[1:]):
            before.setdefault(cur, set()).add(prev)
        assert all(len(p) > 1 for p in before.values()), before


def test_img_map_functions_make_the_same_batch_items():
    """Workload img's map function (dataflow's ops, the same in every library) and the
    numpy/Pillow one of benchmarks.images give float32 CHW crops of the same image, normalised
    the same way: with the crop at the corner and no flip, equal up to the decoders' rounding."""
    from PIL import Image
    import io
    dp = workloads.jpeg_source()[0]
    a, label = workloads.img_pipeline_ops(list(dp))
    assert a.shape == (3, 224, 224) and a.dtype == np.float32 and label == dp[1]
    chain = workloads._img_ops[os.getpid()]           # built once per process
    workloads.img_pipeline_ops(list(dp))
    assert workloads._img_ops == {os.getpid(): chain}
    state = np.random.get_state()
    try:
        # randint(0, 33) twice, then random_sample(): crop at (top, left), flip if < 0.5
        np.random.seed(0)
        top, left, flip = np.random.randint(0, 33), np.random.randint(0, 97), \
            np.random.random_sample() < 0.5
        np.random.seed(0)
        b, _ = workloads.img_pipeline_numpy(list(dp))
    finally:
        np.random.set_state(state)
    x = np.asarray(Image.open(io.BytesIO(dp[0])).convert("RGB"), np.float32)
    x = x[top:top + 224, left:left + 224]
    if flip:
        x = x[:, ::-1]
    want = ((x - np.float32(workloads.IMG_MEAN)) / np.float32(workloads.IMG_STD)).transpose(2, 0, 1)
    assert b.shape == (3, 224, 224) and b.dtype == np.float32 and b.flags.c_contiguous
    np.testing.assert_allclose(b, want, rtol=1e-6, atol=1e-6)
    assert workloads._check_img_batch([np.stack([a, b] * 16), np.arange(32)])


@pytest.mark.parametrize("bad", ["0", "-5", "nan"])
def test_a_timeout_that_is_no_time_is_a_usage_error(bad, capsys):
    # 0 or -5 were taken, and every run then read "hung: the fork server stopped answering"
    with pytest.raises(SystemExit) as info:
        harness.parse_args(["--timeout", bad])
    assert info.value.code == 2
    assert "--timeout must be a number of seconds > 0" in capsys.readouterr().err
