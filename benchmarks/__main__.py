"""Entry point of ``python -m benchmarks``."""
# Workload 5 is defined with BLAS pinned to one thread. This must happen before numpy is imported
# anywhere in this process or in the fork servers it starts (they inherit this environment).
import os

_BLAS_PINS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_PREVIOUS_PINS = {name: os.environ.get(name) for name in _BLAS_PINS}
for _name in _BLAS_PINS:
    os.environ[_name] = "1"

import sys  # noqa: E402

from .harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(previous_pins=_PREVIOUS_PINS))
