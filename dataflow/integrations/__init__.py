"""Adapters between dataflows and other libraries.

Each adapter lives in its own submodule and imports its library only when that submodule is
imported, so ``import dataflow`` (or ``import dataflow.integrations``) never imports them:

* :mod:`dataflow.integrations.torch`: :func:`~dataflow.integrations.torch.as_iterable_dataset`
  turns a dataflow into a ``torch.utils.data.IterableDataset`` (needs PyTorch).
"""
