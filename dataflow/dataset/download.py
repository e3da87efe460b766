"""Where datasets live and how they are fetched.

* :func:`get_dataset_path` joins its arguments under the dataset directory: ``$DATAFLOW_DATASET``
  if set, else ``$TENSORPACK_DATASET`` (tensorpack's variable, so an existing tree is found),
  else ``~/tensorpack_data``. The base directory is created if missing.
* :func:`download` fetches a URL with a progress bar (tqdm, when installed) to a temporary name
  beside the target and renames it only when the byte count matches both the server's
  ``Content-Length`` and the expected size, and a ``.gz`` file decompresses whole (its CRC
  checked); otherwise it raises ``IOError`` and leaves nothing under the final name.
* :func:`dataset_url` gives the URL of a dataset file: the dataset's default base, overridden by
  ``$DATAFLOW_<NAME>_URL`` (for example ``DATAFLOW_MNIST_URL``), or by ``$DATAFLOW_DATASET_URL``
  for every dataset at once, in which case the file is looked up under ``<url>/<name>/``
  (``<name>`` in lower case: ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``,
  ``ilsvrc_metadata``, ``bsds500``, ``svhn``, ``caltech101``).
"""
import contextlib
import gzip
import os
import shutil
import tarfile
import tempfile
import zlib

from .._helpers import progress_bar

__all__ = ["get_dataset_path", "download", "dataset_url", "extract_tar"]

CHUNK = 1 << 20
TIMEOUT = 60        # seconds without progress before a download fails


def get_dataset_path(*args):
    """The path ``args`` under the dataset directory (see the module doc)."""
    # ~ expanded in a variable's value too ("~/datasets" set in a .env file or a Dockerfile's
    # ENV, where no shell expands it, made a folder named "~" in the working directory)
    base = os.path.expanduser(os.environ.get("DATAFLOW_DATASET")
                              or os.environ.get("TENSORPACK_DATASET") or "~/tensorpack_data")
    os.makedirs(base, exist_ok=True)
    return os.path.join(base, *args)


def dataset_url(name, default_base, filename):
    """The URL of ``filename`` of dataset ``name`` (see the module doc)."""
    base = os.environ.get(f"DATAFLOW_{name.upper()}_URL")
    if not base and os.environ.get("DATAFLOW_DATASET_URL"):
        base = os.environ["DATAFLOW_DATASET_URL"].rstrip("/") + "/" + name.lower()
    base = base or default_base
    return base.rstrip("/") + "/" + filename


def download(url, dir, filename=None, expect_size=None):
    """Download ``url`` into ``dir`` (created if missing) as ``filename`` (default: the last
    part of the URL) and return the path. A file already there with the expected size (or any
    size when none is expected) is kept. Raises ``IOError`` naming the URL if the transfer fails
    or delivers a wrong number of bytes."""
    os.makedirs(dir, exist_ok=True)
    filename = filename or url.rstrip("/").rsplit("/", 1)[-1]
    path = os.path.join(dir, filename)
    if os.path.isfile(path) and (expect_size is None or os.path.getsize(path) == expect_size):
        return path
    fd, tmp = tempfile.mkstemp(dir=dir, prefix="." + filename + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            got, announced = _fetch(url, out, filename)
        if announced is not None and got != announced:
            raise IOError(f"download of {url} stopped after {got} of {announced} bytes")
        if expect_size is not None and got != expect_size:
            raise IOError(f"download of {url} gave {got} bytes, expected {expect_size}: "
                          "wrong file or truncated transfer (check the mirror)")
        if got == 0:
            raise IOError(f"download of {url} gave an empty file")
        if filename.endswith(".gz"):
            _check_gzip(tmp, url)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)       # (mkstemp made it private to this user)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        import http.client      # (urllib's; not at import: ssl and email come with it)
        if isinstance(e, (OSError, http.client.HTTPException)) and \
                not str(e).startswith("download of"):
            raise IOError(f"download of {url} failed: {type(e).__name__}: {e}") from e
        raise
    return path


def _check_gzip(path, url):
    """A ``.gz`` download must be a whole gzip stream (its CRC checked): without an expected size
    or a ``Content-Length``, a connection dropped halfway or an HTML error page would otherwise
    be kept under the final name."""
    try:
        with gzip.open(path, "rb") as f:
            while f.read(CHUNK):
                pass
    except (OSError, EOFError, zlib.error) as e:
        raise IOError(f"download of {url} is not a whole gzip file ({type(e).__name__}: {e}): "
                      "truncated transfer, or the server sent something else (check the "
                      "mirror)") from None


def _fetch(url, out, label):
    import urllib.request       # not at import: it costs more than the rest of the package
    with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
        length = resp.headers.get("Content-Length")
        announced = int(length) if length and length.isdigit() else None
        bar = progress_bar(total=announced, unit="B", unit_scale=True, unit_divisor=1024,
                           desc=label, leave=False)
        got = 0
        try:
            while True:
                chunk = resp.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                got += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
    return got, announced


def extract_tar(archive, dir):
    """Extract ``archive`` into ``dir``: into a temporary folder first, then each top-level
    entry is renamed into ``dir``, so an interrupted extraction leaves no partial tree under
    the names the readers look for. Entries outside the archive's root are refused."""
    tmp = tempfile.mkdtemp(dir=dir, prefix=".extract.")
    try:
        try:
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, filter="data")
                else:               # Python < 3.10.12 / 3.11.4: check the names ourselves
                    for m in tar.getmembers():
                        if m.name.startswith("/") or ".." in m.name.split("/") or m.islnk() \
                                or m.issym():
                            raise tarfile.TarError(f"unsafe member {m.name!r}")
                    tar.extractall(tmp)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise IOError(f"{archive}: cannot extract (truncated or corrupted?): {e}") from e
        for name in os.listdir(tmp):
            target = os.path.join(dir, name)
            if os.path.exists(target):
                shutil.rmtree(target) if os.path.isdir(target) else os.unlink(target)
            os.replace(os.path.join(tmp, name), target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
