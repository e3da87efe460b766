"""Run code against tensorpack 0.11 in a subprocess.

tensorpack reads ``TENSORPACK_SERIALIZE`` once, at import, so each encoding needs its own
interpreter; a subprocess also keeps tensorpack's monkey-patching of msgpack out of ours."""
import os
import subprocess
import sys
import textwrap

PRELUDE = """
import numpy as np
np.object = object      # removed in numpy 1.24; tensorpack 0.11's NumpySerializer still uses it
"""


def run_tensorpack(code, serialize="pickle", timeout=60, cwd=None):
    """Run ``code`` (a script; tensorpack not yet imported) with ``TENSORPACK_SERIALIZE`` set to
    ``serialize``; return its stdout. Raises AssertionError with stderr if it fails."""
    env = dict(os.environ, TENSORPACK_SERIALIZE=serialize, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"tensorpack subprocess failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def start_tensorpack(code, serialize="pickle", cwd=None):
    """Start ``code`` in a tensorpack subprocess and return the ``Popen`` (the caller stops it).
    Its output is discarded: a long-running sender's progress bar would fill a pipe."""
    env = dict(os.environ, TENSORPACK_SERIALIZE=serialize, PYTHONWARNINGS="ignore")
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
