"""dataflow.dataset: every reader on a small fake dataset in tensorpack's on-disk layout, and
the download code against a local HTTP server on 127.0.0.1."""
import functools
import gzip
import http.server
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tarfile
import threading

import numpy as np
import pytest

import dataflow as D
from dataflow import dataset
from dataflow.dataset.download import get_dataset_path
from dataflow.dataset import download as dl

import cv2  # noqa: E402
import scipy.io as sio  # noqa: E402


def read_all(df):
    df.reset_state()
    return list(df)


@pytest.fixture
def dataset_dir(tmp_path, monkeypatch):
    root = tmp_path / "datasets"
    monkeypatch.setenv("DATAFLOW_DATASET", str(root))
    monkeypatch.delenv("TENSORPACK_DATASET", raising=False)
    for var in [v for v in os.environ if v.startswith("DATAFLOW_") and v.endswith("_URL")]:
        monkeypatch.delenv(var)
    return root


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Truncating(_Quiet):
    """Announces the file's length, sends half of it, closes."""

    def do_GET(self):
        path = self.translate_path(self.path)
        data = open(path, "rb").read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.close_connection = True


class _ChunkedTruncating(_Quiet):
    """Sends the file in chunked encoding, stops after a first chunk of half of it, closes."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        data = open(self.translate_path(self.path), "rb").read()
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        half = data[: len(data) // 2]
        self.wfile.write(b"%x\r\n" % len(data) + half)
        self.wfile.flush()
        self.close_connection = True


def _serve(root, handler):
    server = http.server.HTTPServer(("127.0.0.1", 0), functools.partial(handler,
                                                                        directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="test-http", daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def http_root(tmp_path):
    """(served directory, base URL) of an HTTP server on 127.0.0.1, stopped after the test."""
    root = tmp_path / "served"
    root.mkdir()
    server, thread = _serve(root, _Quiet)
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


# ----------------------------------------------------------------------------------- MNIST

def write_idx(path, magic, arr):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def fake_mnist(folder, n=5, seed=0):
    os.makedirs(folder, exist_ok=True)
    rs = np.random.RandomState(seed)
    images = rs.randint(0, 256, (n, 28, 28)).astype(np.uint8)
    labels = rs.randint(0, 10, n).astype(np.uint8)
    for split in ("train", "t10k"):
        write_idx(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"), 2051, images)
        write_idx(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"), 2049, labels)
    return images, labels


@pytest.mark.parametrize("cls", [dataset.Mnist, dataset.FashionMnist])
def test_mnist_reads_idx_as_float_images_and_uint8_labels(tmp_path, cls):
    images, labels = fake_mnist(tmp_path)
    df = cls("train", shuffle=False, dir=str(tmp_path))
    out = read_all(df)
    assert len(df) == 5 and len(out) == 5
    for (img, label), ei, el in zip(out, images, labels):
        assert img.dtype == np.float32 and img.shape == (28, 28)
        np.testing.assert_allclose(img, ei / 255.0, rtol=1e-6)
        assert isinstance(label, np.uint8) and label == el
    assert df.images.shape == (5, 28, 28, 1)           # tensorpack's attribute (SimilarityLearning)


def test_fashion_mnist_label_names():
    assert len(dataset.FashionMnist.get_label_names(None)) == 10


def test_mnist_shuffles_and_needs_reset_state(tmp_path):
    fake_mnist(tmp_path, n=40)
    df = dataset.Mnist("test", dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="reset_state"):
        next(iter(df))
    out = [int(lab) for _, lab in read_all(df)]
    ordered = [int(lab) for _, lab in read_all(dataset.Mnist("test", False, str(tmp_path)))]
    assert sorted(out) == sorted(ordered)


def test_mnist_bad_files_raise_naming_the_file(tmp_path):
    fake_mnist(tmp_path)
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    write_idx(path, 2051, np.zeros((5, 1, 1)))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte\.gz: invalid magic number"):
        dataset.Mnist("train", dir=str(tmp_path))
    data = (tmp_path / "train-images-idx3-ubyte.gz").read_bytes()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: not a readable gzip"):
        dataset.Mnist("train", dir=str(tmp_path))


def test_mnist_ignores_bytes_after_the_data(tmp_path):
    # tensorpack reads the announced count and ignores the rest; only a short file is an error
    images, labels = fake_mnist(tmp_path, n=2)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        with gzip.open(tmp_path / name, "rb") as f:
            data = f.read()
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(data + b"\x07" * 10)
    out = read_all(dataset.Mnist("test", shuffle=False, dir=str(tmp_path)))
    assert [int(lab) for _, lab in out] == labels.tolist()
    np.testing.assert_allclose(out[1][0], images[1] / 255.0, rtol=1e-6)


def test_mnist_downloads_missing_files_from_the_mirror(no_leaks, dataset_dir, http_root,
                                                       monkeypatch):
    root, url = http_root
    images, labels = fake_mnist(root / "mnist")
    monkeypatch.setenv("DATAFLOW_DATASET_URL", url)
    df = dataset.Mnist("test", shuffle=False)
    target = dataset_dir / "mnist_data"
    assert sorted(os.listdir(target)) == ["t10k-images-idx3-ubyte.gz",
                                          "t10k-labels-idx1-ubyte.gz"]
    assert [int(lab) for _, lab in read_all(df)] == labels.tolist()


def test_per_dataset_url_variable_wins(no_leaks, dataset_dir, http_root, monkeypatch):
    root, url = http_root
    fake_mnist(root / "fm")
    monkeypatch.setenv("DATAFLOW_DATASET_URL", url + "/nothing-here")
    monkeypatch.setenv("DATAFLOW_FASHION_MNIST_URL", url + "/fm")
    assert len(dataset.FashionMnist("train")) == 5
    assert os.path.isdir(dataset_dir / "fashion_mnist_data")


# ------------------------------------------------------------------------------- downloads

def test_download_checks_expected_size_and_leaves_nothing(no_leaks, tmp_path, http_root):
    root, url = http_root
    (root / "f.bin").write_bytes(b"x" * 1000)
    with pytest.raises(IOError, match=r"f\.bin gave 1000 bytes, expected 999"):
        dl.download(url + "/f.bin", str(tmp_path / "d"), expect_size=999)
    assert os.listdir(tmp_path / "d") == []
    path = dl.download(url + "/f.bin", str(tmp_path / "d"), expect_size=1000)
    assert open(path, "rb").read() == b"x" * 1000
    assert os.listdir(tmp_path / "d") == ["f.bin"]
    (root / "f.bin").write_bytes(b"y" * 1000)       # a complete file is not fetched again
    assert open(dl.download(url + "/f.bin", str(tmp_path / "d"), expect_size=1000),
                "rb").read() == b"x" * 1000


def test_download_of_missing_file_raises_naming_the_url(no_leaks, tmp_path, http_root):
    _, url = http_root
    with pytest.raises(IOError, match=r"download of .*/nope\.bin failed"):
        dl.download(url + "/nope.bin", str(tmp_path / "d"))
    assert os.listdir(tmp_path / "d") == []


@pytest.mark.parametrize("handler,message", [
    (_Truncating, r"f\.bin"),                        # a Content-Length, then half of it
    (_ChunkedTruncating, r"download of .*f\.bin failed: IncompleteRead"),   # a broken chunk
])
def test_download_detects_a_truncated_transfer(no_leaks, tmp_path, handler, message):
    root = tmp_path / "served"
    root.mkdir()
    (root / "f.bin").write_bytes(b"z" * 100000)
    server, thread = _serve(root, handler)
    try:
        with pytest.raises(IOError, match=message):
            dl.download(f"http://127.0.0.1:{server.server_address[1]}/f.bin",
                        str(tmp_path / "d"))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert os.listdir(tmp_path / "d") == []


def test_a_gz_download_must_decompress_whole_and_is_readable_by_others(no_leaks, tmp_path,
                                                                       http_root):
    # no expected size, and a server that sends no length (or an HTML page): the gzip stream
    # itself is checked before the file takes its final name
    root, url = http_root
    whole = gzip.compress(b"d" * 50000)
    (root / "cut.gz").write_bytes(whole[: len(whole) // 2])
    (root / "page.gz").write_bytes(b"<html>not found</html>")
    for name in ("cut.gz", "page.gz"):
        with pytest.raises(IOError, match=name.replace(".", r"\.") + " is not a whole gzip"):
            dl.download(f"{url}/{name}", str(tmp_path / "d"))
    assert os.listdir(tmp_path / "d") == []
    (root / "ok.gz").write_bytes(whole)
    path = dl.download(f"{url}/ok.gz", str(tmp_path / "d"))
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask      # not mkstemp's 0600


def test_dataset_path_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPACK_DATASET", str(tmp_path / "tp"))
    monkeypatch.delenv("DATAFLOW_DATASET", raising=False)
    assert dl.get_dataset_path("mnist_data") == str(tmp_path / "tp" / "mnist_data")
    monkeypatch.setenv("DATAFLOW_DATASET", str(tmp_path / "ours"))
    assert dl.get_dataset_path("x") == str(tmp_path / "ours" / "x")
    assert os.path.isdir(tmp_path / "ours")


# ----------------------------------------------------------------------------------- CIFAR

def fake_cifar(folder, classnum, per_file=3):
    """The extracted archive layout with ``per_file`` rows per batch; returns {split: (images
    as HWC RGB, labels)}."""
    rs = np.random.RandomState(classnum)
    sub, train, test, key, meta, meta_key = {
        10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
             b"labels", "batches.meta", "label_names"),
        100: ("cifar-100-python", ["train"], ["test"], b"fine_labels", "meta",
              "fine_label_names")}[classnum]
    os.makedirs(os.path.join(folder, sub), exist_ok=True)
    out = {}
    for split, files in (("train", train), ("test", test)):
        imgs, labs = [], []
        for f in files:
            data = rs.randint(0, 256, (per_file, 3072)).astype(np.uint8)
            labels = rs.randint(0, classnum, per_file).tolist()
            with open(os.path.join(folder, sub, f), "wb") as fh:
                pickle.dump({b"data": data, key: labels}, fh, protocol=2)
            imgs.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labs += labels
        out[split] = (np.concatenate(imgs), labs)
    with open(os.path.join(folder, sub, meta), "wb") as fh:
        pickle.dump({meta_key: [f"class{i}" for i in range(classnum)]}, fh, protocol=2)
    return out


@pytest.mark.parametrize("cls, classnum", [(dataset.Cifar10, 10), (dataset.Cifar100, 100)])
def test_cifar_reads_rgb_images_and_int_labels(tmp_path, cls, classnum):
    # a directory name containing "train" broke tensorpack's CIFAR-100 test split
    folder = tmp_path / "train_here"
    expected = fake_cifar(folder, classnum)
    for split, n in (("train", 15 if classnum == 10 else 3), ("test", 3)):
        df = cls(split, shuffle=False, dir=str(folder))
        out = read_all(df)
        assert len(df) == n == len(out)
        for (img, label), ei, el in zip(out, *expected[split]):
            assert img.dtype == np.uint8 and img.shape == (32, 32, 3)
            np.testing.assert_array_equal(img, ei)     # plane 0 of the file is channel 0 (R)
            assert type(label) is int and label == el
    df = cls("train", dir=str(folder))
    assert df.shuffle and not cls("test", dir=str(folder)).shuffle
    assert df.get_label_names() == [f"class{i}" for i in range(classnum)]
    everything = np.concatenate([expected["train"][0], expected["test"][0]])
    np.testing.assert_allclose(df.get_per_pixel_mean(), everything.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(df.get_per_channel_mean(), everything.mean(axis=(0, 1, 2)),
                               rtol=1e-5)
    # tensorpack's attribute: the split's batch files
    assert [os.path.basename(f) for f in df.fs] == \
        (["data_batch_%d" % k for k in range(1, 6)] if classnum == 10 else ["train"])
    for names in (("val",), (), "train"):     # tensorpack: AssertionError / nan / AssertionError
        with pytest.raises(ValueError, match="names must be a non-empty sequence"):
            df.get_per_pixel_mean(names)


def test_cifar_missing_or_corrupt_batch_is_named(tmp_path):
    fake_cifar(tmp_path, 10)
    os.unlink(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(ValueError, match=r"Failed to find file: .*data_batch_3"):
        dataset.Cifar10("train", dir=str(tmp_path))
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02}q")
    with pytest.raises(ValueError, match=r"test_batch: not a CIFAR batch"):
        dataset.Cifar10("test", dir=str(tmp_path))


def test_cifar_corrupt_meta_file_is_named(tmp_path):
    # a bare EOFError / UnpicklingError, far from the reader's construction
    fake_cifar(tmp_path, 10)
    df = dataset.Cifar10("train", dir=str(tmp_path))
    (tmp_path / "cifar-10-batches-py" / "batches.meta").write_bytes(b"\x80\x02}q")
    with pytest.raises(ValueError, match=r"batches\.meta: not a CIFAR meta file"):
        df.get_label_names()


def test_cifar_downloads_and_extracts_the_archive(no_leaks, dataset_dir, http_root,
                                                  monkeypatch, tmp_path):
    from dataflow.dataset import cifar
    root, url = http_root
    expected = fake_cifar(tmp_path / "src", 10)
    (root / "cifar10").mkdir()
    archive = root / "cifar10" / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setenv("DATAFLOW_DATASET_URL", url)
    # the real archive's size is checked: this small one is refused and nothing is kept
    with pytest.raises(IOError, match=r"expected 170498071"):
        dataset.Cifar10("test")
    assert os.listdir(dataset_dir / "cifar10_data") == []
    layout = list(cifar._LAYOUT[10])
    layout[2] = archive.stat().st_size
    monkeypatch.setitem(cifar._LAYOUT, 10, tuple(layout))
    df = dataset.Cifar10("test", shuffle=False)
    assert [lab for _, lab in read_all(df)] == expected["test"][1]
    assert sorted(os.listdir(dataset_dir / "cifar10_data")) == ["cifar-10-batches-py",
                                                                 "cifar-10-python.tar.gz"]


# ---------------------------------------------------------------------- ImageNet family

def blob_proto(arr):
    """Encode a (C, H, W) float array as a Caffe BlobProto (legacy dims, packed data)."""
    def varint(n):
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            if n:
                out += bytes([b | 0x80])
            else:
                return out + bytes([b])
    msg = b""
    for field, value in zip((1, 2, 3, 4), (1,) + arr.shape):
        msg += varint(field << 3) + varint(value)
    data = arr.astype("<f4").tobytes()
    return msg + varint(5 << 3 | 2) + varint(len(data)) + data


def write_image(path, bgr):
    """A lossless PNG (whatever the file extension: OpenCV decodes by content)."""
    ok, buf = cv2.imencode(".png", bgr)
    assert ok
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buf.tobytes())


def color(i):
    return (i * 40 % 256, 255 - i * 30 % 256, 7 * i % 256)       # B, G, R


@pytest.fixture
def imagenet(tmp_path):
    meta, data = tmp_path / "meta", tmp_path / "ilsvrc"
    meta.mkdir()
    wnids = ["n01440764", "n01443537", "n01484850"]
    (meta / "synsets.txt").write_text("".join(w + "\n" for w in wnids))
    (meta / "synset_words.txt").write_text("".join(f"{w} thing {i}\n"
                                                   for i, w in enumerate(wnids)))
    train, val = [], []
    for i in range(6):
        cls = i % 3
        train.append((f"{wnids[cls]}/{wnids[cls]}_{i}.JPEG", cls))
        val.append((f"ILSVRC2012_val_{i:08d}.JPEG", cls))
        write_image(str(data / "train" / train[-1][0]), np.full((5, 7, 3), color(i), np.uint8))
        write_image(str(data / "val" / val[-1][0]), np.full((4, 4, 3), color(i), np.uint8))
        write_image(str(data / "val_by_class" / "val" / wnids[cls] / val[-1][0]),
                    np.full((4, 4, 3), color(i), np.uint8))
    for name, lst in (("train", train), ("val", val)):
        (meta / f"{name}.txt").write_text("".join(f"{f} {c}\n" for f, c in lst))
    mean = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    (meta / "imagenet_mean.binaryproto").write_bytes(blob_proto(mean))
    return meta, data, wnids, train, val, mean


def test_ilsvrc_meta(imagenet):
    meta_dir, _, wnids, train, val, mean = imagenet
    meta = dataset.ILSVRCMeta(str(meta_dir))
    assert meta.get_synset_1000() == dict(enumerate(wnids))
    assert meta.get_synset_words_1000()[1] == "n01443537 thing 1"
    assert meta.get_image_list("train") == train
    assert meta.get_image_list("val") == val
    assert meta.get_image_list("val", "train") == [(f"{wnids[c]}/{f}", c) for f, c in val]
    got = meta.get_per_pixel_mean()
    assert got.dtype == np.float32 and got.shape == (4, 5, 3)
    np.testing.assert_array_equal(got, mean.transpose(1, 2, 0))
    assert meta.get_per_pixel_mean((8, 10)).shape == (8, 10, 3)


def test_ilsvrc_meta_class_index_is_the_line_number(tmp_path):
    # as tensorpack: lines are stripped, and a blank line still takes its index (a later
    # line keeps its class number); image lists skip blank lines
    (tmp_path / "synsets.txt").write_text("n01440764\n\nn01484850  \n")
    (tmp_path / "synset_words.txt").write_text("n01440764 tench  \n\n n01484850 shark\n")
    (tmp_path / "val.txt").write_text("a.JPEG 2\n\nb.JPEG 0\n")
    meta = dataset.ILSVRCMeta(str(tmp_path))
    assert meta.get_synset_1000() == {0: "n01440764", 1: "", 2: "n01484850"}
    assert meta.get_synset_words_1000() == {0: "n01440764 tench", 1: "",
                                            2: "n01484850 shark"}
    assert meta.get_image_list("val", "train") == [("n01484850/a.JPEG", 2),
                                                   ("n01440764/b.JPEG", 0)]


def test_directories_given_with_a_tilde_are_expanded(imagenet, tmp_path, monkeypatch):
    # tensorpack expands ~ in ILSVRCMeta, ILSVRC12(Files), TinyImageNet and Places365Standard
    meta_dir, data, _, _, val, _ = imagenet
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dataset.ILSVRCMeta("~/meta").dir == str(meta_dir)
    files = dataset.ILSVRC12Files("~/ilsvrc", "val", meta_dir="~/meta", shuffle=False)
    assert read_all(files) == [[os.path.join(str(data), "val", f), c] for f, c in val]
    assert len(read_all(dataset.ILSVRC12("~/ilsvrc", "val", meta_dir=str(meta_dir)))) == 6
    write_image(str(tmp_path / "places" / "val" / "zoo" / "1.jpg"),
                np.full((6, 6, 3), color(1), np.uint8))
    (tmp_path / "places" / "val.txt").write_text("val/zoo/1.jpg\n")
    [(im, label)] = read_all(dataset.Places365Standard("~/places", "val"))
    assert tuple(im[0, 0]) == color(1) and label == 0
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "wnids.txt").write_text("".join(f"n{i:08d}\n" for i in range(200)))
    write_image(str(tiny / "val" / "images" / "v.JPEG"), np.full((64, 64, 3), color(2), np.uint8))
    (tiny / "val" / "val_annotations.txt").write_text("v.JPEG\tn00000009\t0\t0\t9\t9\n")
    [(im, label)] = read_all(dataset.TinyImageNet("~/tiny", "val"))
    assert tuple(im[0, 0]) == color(2) and label == 9


def test_ilsvrc12_files_and_images_are_bgr(imagenet):
    meta_dir, data, wnids, train, val, _ = imagenet
    files = dataset.ILSVRC12Files(str(data), "train", meta_dir=str(meta_dir), shuffle=False)
    assert read_all(files) == [[os.path.join(str(data), "train", f), c] for f, c in train]
    imgs = dataset.ILSVRC12(str(data), "val", meta_dir=str(meta_dir))
    assert not imgs.shuffle
    for i, (im, label) in enumerate(read_all(imgs)):
        assert im.dtype == np.uint8 and im.shape == (4, 4, 3)
        assert tuple(im[0, 0]) == color(i) and label == val[i][1]      # B, G, R as written
    by_class = dataset.ILSVRC12(str(data / "val_by_class"), "val", meta_dir=str(meta_dir))
    assert [lab for _, lab in read_all(by_class)] == [c for _, c in val]
    assert dataset.ILSVRCMeta.guess_dir_structure(str(data / "val_by_class" / "val")) == "train"
    assert dataset.ILSVRCMeta.guess_dir_structure(str(data / "val")) == "original"


def test_ilsvrc12_meta_dir_must_exist(imagenet, tmp_path):
    # tensorpack asserts it; ILSVRCMeta would create the folder and download into it
    _, data, *_ = imagenet
    typo = tmp_path / "typo_meta"
    for cls in (dataset.ILSVRC12Files, dataset.ILSVRC12):
        with pytest.raises(FileNotFoundError, match="meta_dir .*typo_meta.*: no such directory"):
            cls(str(data), "val", meta_dir=str(typo))
    assert not typo.exists()


def test_ilsvrc12_missing_image_is_named(imagenet):
    meta_dir, data, _, _, val, _ = imagenet
    os.unlink(data / "val" / val[2][0])
    with pytest.raises(FileNotFoundError, match=val[2][0]):
        dataset.ILSVRC12Files(str(data), "val", meta_dir=str(meta_dir))


def test_ilsvrc12_training_bbox(tmp_path):
    (tmp_path / "n01").mkdir()
    (tmp_path / "n01" / "a.xml").write_text(
        "<annotation><size><width>10</width><height>8</height></size><object><name>n01</name>"
        "<bndbox><xmin>1</xmin><ymin>2</ymin><xmax>5</xmax><ymax>7</ymax></bndbox></object>"
        "</annotation>")
    boxes = dataset.ILSVRC12.get_training_bbox(str(tmp_path), [("n01/a.JPEG", 0),
                                                               ("n01/b.JPEG", 0)])
    np.testing.assert_array_equal(boxes[0], [1, 2, 5, 7])
    assert boxes[0].dtype == np.float32 and boxes[1] is None


def test_tiny_imagenet(tmp_path):
    wnids = [f"n{i:08d}" for i in range(200)]
    (tmp_path / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        (tmp_path / "train" / w / "images").mkdir(parents=True)
    write_image(str(tmp_path / "train" / wnids[7] / "images" / "a.JPEG"),
                np.full((64, 64, 3), color(1), np.uint8))
    write_image(str(tmp_path / "val" / "images" / "val_0.JPEG"),
                np.full((64, 64, 3), color(2), np.uint8))
    (tmp_path / "val" / "val_annotations.txt").write_text(f"val_0.JPEG\t{wnids[150]}\t0\t0\t9\t9\n")
    train = dataset.TinyImageNet(str(tmp_path), "train")
    assert train.shuffle and len(train) == 1
    [(im, label)] = read_all(train)
    assert im.shape == (64, 64, 3) and tuple(im[0, 0]) == color(1) and label == 7
    val = dataset.TinyImageNet(str(tmp_path), "val")
    [(im, label)] = read_all(val)
    assert tuple(im[0, 0]) == color(2) and label == 150
    assert val.full_dir == tmp_path / "val"           # tensorpack's attribute, a Path
    # a wnid twice (200 lines, 199 classes): one class read twice, a label never used
    (tmp_path / "wnids.txt").write_text("\n".join(wnids[:199] + wnids[:1]) + "\n")
    with pytest.raises(ValueError, match=r"wnids\.txt: 199 distinct wnids in 200 lines, "
                                         r"expected 200"):
        dataset.TinyImageNet(str(tmp_path), "train")


def test_a_dataset_directory_variable_with_a_tilde_is_expanded(tmp_path, monkeypatch):
    # "~/datasets" from a .env file or a Dockerfile's ENV made a folder named "~" here
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for var in ("DATAFLOW_DATASET", "TENSORPACK_DATASET"):
        monkeypatch.delenv("DATAFLOW_DATASET", raising=False)
        monkeypatch.setenv(var, "~/datasets")
        assert get_dataset_path("mnist_data") == str(tmp_path / "datasets" / "mnist_data")
        assert not (tmp_path / "~").exists()


def test_places365_labels_are_sorted_class_names(tmp_path):
    lines = ["val/zoo/1.jpg", "val/airfield/2.jpg", "val/zoo/3.jpg"]
    for i, rel in enumerate(lines):
        write_image(str(tmp_path / rel), np.full((6, 6, 3), color(i), np.uint8))
    (tmp_path / "val.txt").write_text("\n".join(lines) + "\n")
    df = dataset.Places365Standard(str(tmp_path), "val")
    assert df.get_label_names() == ["airfield", "zoo"]
    out = read_all(df)
    assert [lab for _, lab in out] == [1, 0, 1]
    assert [tuple(im[0, 0]) for im, _ in out] == [color(i) for i in range(3)]


def write_jpeg(path, shape, seed=0):
    """A real (lossy) JPEG file of random pixels; returns its bytes."""
    bgr = (np.random.RandomState(seed).rand(*shape, 3) * 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", bgr)
    assert ok
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buf.tobytes())
    return buf.tobytes()


def _ilsvrc12_tree(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "synsets.txt").write_text("n01440764\n")
    (tmp_path / "meta" / "val.txt").write_text("a.JPEG 0\n")
    path = str(tmp_path / "ilsvrc" / "val" / "a.JPEG")
    return path, (64, 80), lambda: read_all(dataset.ILSVRC12(
        str(tmp_path / "ilsvrc"), "val", meta_dir=str(tmp_path / "meta"),
        dir_structure="original"))


def _tiny_imagenet_tree(tmp_path):
    (tmp_path / "wnids.txt").write_text("".join(f"n{i:08d}\n" for i in range(200)))
    (tmp_path / "val" / "images").mkdir(parents=True)
    (tmp_path / "val" / "val_annotations.txt").write_text("v.JPEG\tn00000003\t0\t0\t9\t9\n")
    path = str(tmp_path / "val" / "images" / "v.JPEG")
    return path, (64, 64), lambda: read_all(dataset.TinyImageNet(str(tmp_path), "val"))


def _places365_tree(tmp_path):
    (tmp_path / "val.txt").write_text("val/zoo/1.jpg\n")
    path = str(tmp_path / "val" / "zoo" / "1.jpg")
    return path, (64, 80), lambda: read_all(dataset.Places365Standard(str(tmp_path), "val"))


def _bsds500_tree(tmp_path):
    base = tmp_path / "BSR" / "BSDS500" / "data"
    write_bsds500_ground_truth(base, "val", "1")
    path = str(base / "images" / "val" / "1.jpg")
    return path, (321, 481), lambda: read_all(dataset.BSDS500("val", data_dir=str(tmp_path)))


@pytest.mark.parametrize("tree", [_ilsvrc12_tree, _tiny_imagenet_tree, _places365_tree,
                                  _bsds500_tree],
                         ids=["ILSVRC12", "TinyImageNet", "Places365Standard", "BSDS500"])
def test_image_readers_refuse_a_truncated_jpeg_naming_it(tmp_path, tree):
    # OpenCV decoded a JPEG cut short with a grey bottom, printing only "Premature end of JPEG
    # file" on stderr: the readers gave a damaged image silently. ImageFromFile's check now
    # applies to them too: a ValueError naming the file
    path, shape, read = tree(tmp_path)
    data = write_jpeg(path, shape)
    [(im, _)] = read()
    assert im.shape == shape + (3,) and im.dtype == np.uint8          # the whole file reads
    with open(path, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    assert cv2.imread(path) is not None              # OpenCV still decodes it, partly blank
    with pytest.raises(ValueError, match=re.escape(path) + ": a truncated JPEG file"):
        read()


@pytest.mark.parametrize("name, user", [
    ("synsets.txt", lambda meta: dataset.ILSVRCMeta(meta).get_synset_1000()),
    ("synset_words.txt", lambda meta: dataset.ILSVRCMeta(meta).get_synset_words_1000()),
    ("val.txt", lambda meta: dataset.ILSVRCMeta(meta).get_image_list("val")),
    ("train.txt", lambda meta: dataset.ILSVRCMeta(meta).get_image_list("train")),
], ids=["synsets", "synset_words", "val", "train"])
def test_ilsvrc_meta_undecodable_line_is_named(imagenet, name, user):
    # a stray non-UTF-8 byte gave a bare UnicodeDecodeError naming neither file nor line
    meta_dir = imagenet[0]
    path = meta_dir / name
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b"\x81" + lines[2]
    path.write_bytes(b"".join(lines))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ", line 3: not (?i:utf-8) text"):
        user(str(meta_dir))


def test_ilsvrc12_undecodable_image_list_is_named_at_construction(imagenet):
    meta_dir, data, *_ = imagenet
    with open(meta_dir / "val.txt", "ab") as f:
        f.write(b"b\xe9.JPEG 0\n")                  # latin-1, line 7
    for cls in (dataset.ILSVRC12Files, dataset.ILSVRC12):
        with pytest.raises(ValueError, match=r"val\.txt, line 7: not (?i:utf-8) text"):
            cls(str(data), "val", meta_dir=str(meta_dir))


@pytest.mark.parametrize("listing, make", [
    ("wnids.txt", lambda d: dataset.TinyImageNet(d, "val")),
    ("val/val_annotations.txt", lambda d: dataset.TinyImageNet(d, "val")),
    ("val.txt", lambda d: dataset.Places365Standard(d, "val")),
], ids=["tiny_wnids", "tiny_val_annotations", "places_val"])
def test_tiny_imagenet_and_places_undecodable_line_is_named(tmp_path, listing, make):
    _tiny_imagenet_tree(tmp_path)
    _places365_tree(tmp_path)
    path = tmp_path / listing
    path.write_bytes(path.read_bytes() + b"\xff\n")
    line = len(path.read_bytes().splitlines())
    with pytest.raises(ValueError, match=re.escape(str(path)) + f", line {line}: not (?i:utf-8)"):
        make(str(tmp_path))


# --------------------------------------------------------------------- .mat-based datasets

def test_bsds500_transposes_portraits_and_averages_boundaries(tmp_path):
    base = tmp_path / "BSR" / "BSDS500" / "data"
    rs = np.random.RandomState(0)
    expected = []
    for i, shape in enumerate([(321, 481), (481, 321)]):
        write_image(str(base / "images" / "val" / f"{i}.jpg"),
                    np.full(shape + (3,), color(i), np.uint8))
        maps = [(rs.rand(*shape) > 0.5).astype(np.uint8) for _ in range(3)]
        cell = np.empty((1, 3), dtype=object)
        for k, m in enumerate(maps):
            cell[0, k] = {"Boundaries": m, "Segmentation": m.astype(np.uint16)}
        (base / "groundTruth" / "val").mkdir(parents=True, exist_ok=True)
        sio.savemat(str(base / "groundTruth" / "val" / f"{i}.mat"), {"groundTruth": cell})
        mean = np.mean(maps, axis=0)
        expected.append(mean if shape[0] < shape[1] else mean.T)
    df = dataset.BSDS500("val", data_dir=str(tmp_path), shuffle=False)
    assert df.data_root == str(base)                   # as tensorpack's attribute
    out = read_all(df)
    assert len(df) == 2
    for (im, edge), e, i in zip(out, expected, range(2)):
        assert im.shape == (321, 481, 3) and im.dtype == np.uint8
        assert tuple(im[10, 10]) == color(i)
        assert edge.dtype == np.float32 and edge.shape == (321, 481)
        np.testing.assert_allclose(edge, e, rtol=1e-6)


def test_bsds500_edge_map_is_bitwise_tensorpacks(tmp_path):
    # tensorpack sums the boundary maps and multiplies by 1/n in float32; dividing by n
    # instead differs in the last bit for n = 7 (3/7, 6/7)
    base = tmp_path / "BSR" / "BSDS500" / "data"
    write_image(str(base / "images" / "test" / "1.jpg"), np.zeros((321, 481, 3), np.uint8))
    cell = np.empty((1, 7), dtype=object)
    for k in range(7):
        m = np.zeros((321, 481), np.uint8)
        m[0, k + 1:] = 1                        # pixel (0, j) is marked by min(j, 7) annotators
        cell[0, k] = {"Boundaries": m}
    (base / "groundTruth" / "test").mkdir(parents=True)
    sio.savemat(str(base / "groundTruth" / "test" / "1.mat"), {"groundTruth": cell})
    [(_, edge)] = read_all(dataset.BSDS500("test", data_dir=str(tmp_path), shuffle=False))
    expected = np.array([0.0, 0.14285715, 0.2857143, 0.42857146, 0.5714286, 0.71428573,
                         0.8571429, 1.0], np.float32)       # tensorpack 0.11's values
    assert edge.dtype == np.float32
    np.testing.assert_array_equal(edge[0, :8], expected)


def write_bsds500_ground_truth(base, name, stem, shape=(321, 481), seed=0):
    """``groundTruth/<name>/<stem>.mat`` with two annotators' random boundary maps."""
    rs = np.random.RandomState(seed)
    cell = np.empty((1, 2), dtype=object)
    for k in range(2):
        cell[0, k] = {"Boundaries": (rs.rand(*shape) > 0.5).astype(np.uint8)}
    (base / "groundTruth" / name).mkdir(parents=True, exist_ok=True)
    sio.savemat(str(base / "groundTruth" / name / f"{stem}.mat"), {"groundTruth": cell})


def test_bsds500_missing_image_of_a_ground_truth_is_named(tmp_path):
    # the images are found by a glob: a deleted image whose groundTruth .mat was still there
    # silently gave one datapoint fewer
    base = tmp_path / "BSR" / "BSDS500" / "data"
    for i in range(3):
        write_image(str(base / "images" / "val" / f"{i}.jpg"),
                    np.full((321, 481, 3), color(i), np.uint8))
        write_bsds500_ground_truth(base, "val", str(i), seed=i)
    whole = read_all(dataset.BSDS500("val", data_dir=str(tmp_path), shuffle=False))
    assert [tuple(im[0, 0]) for im, _ in whole] == [color(i) for i in range(3)]  # name order
    os.unlink(base / "images" / "val" / "1.jpg")
    image, mat = base / "images" / "val" / "1.jpg", base / "groundTruth" / "val" / "1.mat"
    with pytest.raises(FileNotFoundError, match=re.escape(f"{image}: missing, but its ground "
                                                          f"truth {mat} is there")):
        dataset.BSDS500("val", data_dir=str(tmp_path))


def test_svhn_maps_label_10_to_0_and_keeps_rgb(tmp_path):
    rs = np.random.RandomState(0)
    X = rs.randint(0, 256, (32, 32, 3, 4)).astype(np.uint8)
    y = np.array([[10], [1], [9], [10]], dtype=np.uint8)
    sio.savemat(str(tmp_path / "test_32x32.mat"), {"X": X, "y": y})
    out = read_all(dataset.SVHNDigit("test", data_dir=str(tmp_path), shuffle=False))
    assert [int(lab) for _, lab in out] == [0, 1, 9, 0]
    assert all(isinstance(lab, np.uint8) for _, lab in out)
    for k, (im, _) in enumerate(out):
        np.testing.assert_array_equal(im, X[..., k])
    # a second directory gets its own data (tensorpack's cache returned the first one's)
    other = tmp_path / "other"
    other.mkdir()
    sio.savemat(str(other / "test_32x32.mat"), {"X": X[..., :1], "y": y[:1]})
    assert len(dataset.SVHNDigit("test", data_dir=str(other))) == 1


def test_svhn_per_pixel_mean_is_float64_as_tensorpacks(tmp_path, monkeypatch):
    X = np.random.RandomState(0).randint(0, 256, (32, 32, 3, 3)).astype(np.uint8)
    (tmp_path / "svhn_data").mkdir()
    sio.savemat(str(tmp_path / "svhn_data" / "train_32x32.mat"), {"X": X, "y": np.ones((3, 1))})
    monkeypatch.setenv("DATAFLOW_DATASET", str(tmp_path))
    mean = dataset.SVHNDigit.get_per_pixel_mean(("train",))
    assert mean.dtype == np.float64 and mean.shape == (32, 32, 3)
    np.testing.assert_array_equal(mean, X.transpose(3, 0, 1, 2).mean(axis=0))


def test_caltech101_silhouettes(tmp_path):
    data = {}
    for name, n in (("train", 4), ("test", 2), ("val", 3)):
        data[name + "_data"] = (np.arange(n * 784).reshape(n, 784) % 2).astype(np.uint8)
        data[name + "_labels"] = np.arange(1, n + 1).reshape(n, 1).astype(np.uint8)
    sio.savemat(str(tmp_path / "caltech101_silhouettes_28_split1.mat"), data)
    out = read_all(dataset.Caltech101Silhouettes("val", shuffle=False, dir=str(tmp_path)))
    assert [int(lab) for _, lab in out] == [0, 1, 2]
    assert out[0][0].shape == (28, 28) and out[0][0].dtype == np.uint8
    np.testing.assert_array_equal(out[1][0], data["val_data"][1].reshape(28, 28))
    whole = dataset.Caltech101Silhouettes("val", dir=str(tmp_path)).data   # tensorpack's: the file
    np.testing.assert_array_equal(whole["train_labels"], data["train_labels"])


def test_svhn_corrupt_file_is_named(tmp_path):
    (tmp_path / "extra_32x32.mat").write_bytes(b"MATLAB 5.0 garbage")
    with pytest.raises(ValueError, match=r"extra_32x32\.mat: not an SVHN \.mat file"):
        dataset.SVHNDigit("extra", data_dir=str(tmp_path))


# ----------------------------------------------------------------------------- dependencies

@pytest.mark.parametrize("make, module", [
    (lambda d: dataset.TinyImageNet(d, "train"), "cv2"),
    (lambda d: dataset.ILSVRC12(d, "train"), "cv2"),
    (lambda d: dataset.Places365Standard(d, "val"), "cv2"),
    (lambda d: dataset.BSDS500("val", data_dir=d), "cv2"),
    (lambda d: dataset.SVHNDigit("test", data_dir=d), "scipy"),
    (lambda d: dataset.Caltech101Silhouettes("val", dir=d), "scipy"),
])
def test_missing_dependency_names_the_extra(tmp_path, monkeypatch, make, module):
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r"dataflow-rt\[datasets\]"):
        make(str(tmp_path))


def test_dataset_subpackage_imports_without_optional_dependencies():
    code = ("import sys; from dataflow import dataset; import dataflow; "
            "assert dataflow.dataset is dataset; dataset.Cifar10; "
            "print([m for m in ('cv2', 'scipy', 'tqdm', 'h5py') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


def _resumed_second_pass(build, k):
    """(an uninterrupted second pass, the same pass taken as k datapoints, a state_dict()
    through JSON, and the rest from a freshly built reader) as label lists."""
    D.set_seed(7)
    df = build()
    df.reset_state()
    list(df)
    whole = [int(dp[1]) for dp in df]
    D.set_seed(7)
    df = build()
    df.reset_state()
    list(df)
    it = iter(df)
    got = [int(next(it)[1]) for _ in range(k)]
    state = json.loads(json.dumps(df.state_dict()))
    D.set_seed(7)
    again = build()
    again.load_state_dict(state)
    again.reset_state()
    got += [int(dp[1]) for dp in again]
    return whole, got


def test_a_shuffled_reader_resumes_exactly_mid_pass(tmp_path):
    # its state_dict() raised NotImplementedError, and a replay resume reused pass 0's order
    fake_mnist(tmp_path, n=30)
    for k in (0, 1, 13, 29, 30):
        whole, got = _resumed_second_pass(lambda: dataset.Mnist("train", dir=str(tmp_path)), k)
        assert got == whole, k
