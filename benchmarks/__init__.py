"""Side-by-side benchmarks of ``dataflow`` against its peers (tensorpack, torch).

Run ``python -m benchmarks --help``; see ``benchmarks/README.md``.

This file deliberately imports nothing: ``python -m benchmarks`` imports the package before
``benchmarks/__main__.py`` runs, and ``__main__`` must pin the BLAS thread count in
``os.environ`` before numpy is first imported.
"""
