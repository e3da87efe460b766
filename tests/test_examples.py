"""The examples run, end to end, as a user runs them: ``python examples/X.py ...`` in a fresh
process, with their generated data in a temporary cache (``DATAFLOW_CACHE``)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name, *args, cache, extra_path=None, timeout=110):
    """Run ``examples/<name>`` with ``args``; returns its stdout after checking it exited 0."""
    path = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env = dict(os.environ, DATAFLOW_CACHE=str(cache),
               PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit code {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def load_example(name):
    """Import ``examples/<name>`` as a module (for tests of its helpers)."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image_cache(tmp_path_factory):
    """One cache for the image examples, so the synthetic images are generated once."""
    return tmp_path_factory.mktemp("dataflow-cache")


def without(tmp_path, module):
    """A folder that, put first on PYTHONPATH, makes ``import <module>`` fail."""
    d = tmp_path / f"no-{module}"
    d.mkdir()
    (d / f"{module}.py").write_text(f"raise ImportError('{module} is hidden by the test')\n")
    return d


# --- image_pipeline.py ---------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor, runs_in", [("auto", "thread"), ("serial", "serial"),
                                               ("thread", "thread"), ("process", "process")])
def test_image_pipeline(image_cache, executor, runs_in):
    out = run_example("image_pipeline.py", "--limit", 40, "--batch-size", 16, "--epochs", 2,
                      "--executor", executor, cache=image_cache)
    assert "40 images, 4 classes" in out
    assert "first batch: images float32 (16, 3, 224, 224), labels int32 (16,)" in out
    assert "throughput:" in out and "images/s" in out and "batches/s" in out
    assert f"executor={runs_in}" in out
    assert len(list((image_cache / "images").glob("*/*.jpg"))) == 512


@pytest.mark.timeout(120)
def test_image_pipeline_generates_once(tmp_path):
    first = run_example("image_pipeline.py", "--limit", 8, "--epochs", 1, cache=tmp_path)
    assert "writing 512 synthetic images" in first
    second = run_example("image_pipeline.py", "--limit", 8, "--epochs", 1, cache=tmp_path)
    assert "writing" not in second and "throughput:" in second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


@pytest.mark.timeout(120)
def test_image_pipeline_interrupted_generation_leaves_nothing(tmp_path, monkeypatch):
    example = load_example("image_pipeline.py")
    calls = []

    def draw_then_fail(rng, label):
        calls.append(label)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return draw(rng, label)

    draw = example._draw_image
    monkeypatch.setattr(example, "_draw_image", draw_then_fail)
    with pytest.raises(KeyboardInterrupt):
        example.make_synthetic_dataset(tmp_path / "images", num_images=20)
    assert list(tmp_path.iterdir()) == []           # no half dataset, no temporary folder
    monkeypatch.setattr(example, "_draw_image", draw)
    root = example.make_synthetic_dataset(tmp_path / "images", num_images=8)
    assert len(list(root.glob("*/*.jpg"))) == 8


@pytest.mark.timeout(120)
def test_image_pipeline_on_a_folder_without_tqdm(tmp_path):
    """--data with images of other sizes and modes (a small grayscale PNG too), and the plain
    progress lines when tqdm is missing."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for cls, (h, w), mode in [("cat", (300, 400), "RGB"), ("cat", (120, 90), "L"),
                              ("dog", (500, 260), "RGB"), ("dog", (224, 224), "RGBA")]:
        (tmp_path / "data" / cls).mkdir(parents=True, exist_ok=True)
        channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
        arr = rng.integers(0, 256, (h, w, channels), dtype=np.uint8).squeeze()
        Image.fromarray(arr, mode).save(tmp_path / "data" / cls / f"{h}x{w}.png")
    (tmp_path / "data" / "dog" / "notes.txt").write_text("not an image")
    out = run_example("image_pipeline.py", "--data", tmp_path / "data", "--batch-size", 3,
                      "--epochs", 1, cache=tmp_path / "cache",
                      extra_path=without(tmp_path, "tqdm"))
    assert "4 images, 2 classes" in out
    assert "epoch 1/1: 2/2 batches" in out            # the plain progress line
    assert "throughput:" in out
    assert not (tmp_path / "cache").exists()          # --data generates nothing


# --- torch_training.py ---------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.timeout(120)
def test_torch_training(image_cache):
    out = run_example("torch_training.py", "--limit", 32, "--batch-size", 8, "--epochs", 2,
                      cache=image_cache)
    assert "epoch 1/2: loss" in out and "epoch 2/2: loss" in out
    assert "throughput:" in out and "images/s" in out


@pytest.mark.timeout(120)
def test_torch_training_without_torch(tmp_path):
    out = run_example("torch_training.py", "--limit", 8, cache=tmp_path,
                      extra_path=without(tmp_path, "torch"))
    assert "needs PyTorch" in out


# --- text_pipeline.py ----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_text_pipeline(tmp_path):
    out = run_example("text_pipeline.py", "--limit", 400, "--epochs", 2, cache=tmp_path)
    assert "400 lines from" in out
    assert "executor chosen by the table: process" in out
    assert "batch 0: ids int32 (" in out
    assert "throughput:" in out and "sentences/s" in out and "tokens/s" in out
    assert (tmp_path / "corpus.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


@pytest.mark.timeout(120)
def test_text_pipeline_on_a_file(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("Hello, world!\n\nThe cat sat on the mat.\n" * 30)
    out = run_example("text_pipeline.py", "--data", text, "--epochs", 1,
                      cache=tmp_path / "cache")
    assert "90 lines from" in out and "throughput:" in out
    assert "60 sentences in" in out                  # the empty lines are dropped
    assert not (tmp_path / "cache").exists()


def test_text_tokenizer():
    example = load_example("text_pipeline.py")
    lines = ["The cat, the hat.", "A cat!"]
    vocab = example.build_vocab(lines)
    assert vocab["<pad>"] == example.PAD and vocab["<unk>"] == example.UNK
    assert set(vocab) == {"<pad>", "<unk>", "the", "cat"}    # min_count=2
    ids, n = example.Tokenizer(vocab)(["THE cat sat."])
    assert ids.dtype == np.int32 and n == 4
    assert ids.tolist() == [vocab["the"], vocab["cat"], example.UNK, example.UNK]
    assert example.Tokenizer(vocab)(["   "]) is None


# --- resume_training.py --------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2])
def test_resume_training_consumes_what_an_uninterrupted_run_does(tmp_path, seed):
    out = run_example("resume_training.py", "--seed", seed, cache=tmp_path)
    assert "killed with SIGKILL after step" in out
    assert "consumed the same datapoints, in the same order" in out
    assert "weights equal: True" in out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, what", [("image_pipeline.py", "folder"),
                                        ("imagenet_pipeline.py", "folder"),
                                        ("text_pipeline.py", "file")])
def test_a_missing_data_path_is_a_usage_error(tmp_path, name, what):
    # it ended in a FileNotFoundError traceback
    env = dict(os.environ, DATAFLOW_CACHE=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(EXAMPLES / name), "--data", str(tmp_path / "none")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"--data {tmp_path / 'none'}: no such {what}" in r.stderr, r.stderr
