"""examples/imagenet_pipeline.py runs end to end, and with --seed gives the same batches in
every executor."""
import re
from pathlib import Path

import pytest

from tests._tensorpack import run_tensorpack
from tests.test_examples import load_example, run_example

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dataflow-cache")


@pytest.mark.timeout(180)
def test_imagenet_pipeline_same_batches_in_every_executor(cache):
    sums = {}
    for executor, runs_in in (("auto", "thread"), ("serial", "serial"), ("process", "process")):
        out = run_example("imagenet_pipeline.py", "--limit", 48, "--batch-size", 16,
                          "--seed", 5, "--executor", executor, cache=cache)
        assert "48 images, 4 classes" in out
        assert f"executor={runs_in}" in out
        assert "first batch: images uint8 (16, 224, 224, 3), labels int" in out
        assert "images/s" in out
        sums[executor] = re.search(r"checksum: (\d+)", out).group(1)
    assert len(set(sums.values())) == 1, sums
    out = run_example("imagenet_pipeline.py", "--limit", 20, "--batch-size", 8, "--val",
                      cache=cache)
    assert "first batch: images uint8 (8, 224, 224, 3)" in out


def test_list_train_images_labels_by_sorted_wnid(tmp_path):
    m = load_example("imagenet_pipeline.py")
    for wnid in ("n02", "n01"):
        (tmp_path / "train" / wnid).mkdir(parents=True)
        (tmp_path / "train" / wnid / "a.JPEG").write_bytes(b"")
    (tmp_path / "train" / "n01" / "notes.txt").write_text("")
    files, wnids = m.list_train_images(tmp_path)
    assert wnids == ["n01", "n02"]
    assert [(f.split("/")[-2], label) for f, label in files] == [("n01", 0), ("n02", 1)]
    with pytest.raises(SystemExit, match="no such directory"):
        m.list_train_images(tmp_path / "missing")


def test_benchmarks_build_the_examples_fbresnet_augmentor_in_either_library():
    # benchmarks.images and benchmarks.imgaug_micro run this one list, with each library's
    # imgaug (tensorpack's in a subprocess: importing it patches msgpack for the whole process)
    from benchmarks import fbresnet
    from dataflow import imgaug
    m = load_example("imagenet_pipeline.py")
    names = {}
    for is_train in (True, False):
        augs = fbresnet.fbresnet_augmentor(imgaug, is_train)
        assert repr(augs) == repr(m.fbresnet_augmentor(is_train))
        names[is_train] = [type(a).__name__ for a in augs]
    out = run_tensorpack("""
        from tensorpack.dataflow import imgaug
        from benchmarks import fbresnet
        for is_train in (True, False):
            augs = fbresnet.fbresnet_augmentor(imgaug, is_train)
            assert all(type(a).__module__.startswith("tensorpack.") for a in augs)
            print(is_train, ",".join(type(a).__name__ for a in augs))
        """, cwd=str(ROOT))
    lines = [line.split() for line in out.splitlines() if line.startswith(("True", "False"))]
    assert lines == [["True", ",".join(names[True])], ["False", ",".join(names[False])]]
