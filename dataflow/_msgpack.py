"""msgpack's own ``Packer``, ``Unpacker``, ``packb`` and ``unpackb``, whatever has been patched
into the ``msgpack`` package.

``msgpack_numpy.patch()`` replaces those four names (and the ``dumps``/``loads`` family) in the
``msgpack`` package with msgpack-numpy's, which encode every numpy array and scalar in
msgpack-numpy's layout and, when decoding, turn any map that looks like one of its records back
into an array first, unpickling object arrays. tensorpack calls it when
``tensorpack.dataflow`` is imported, so a training script that still imports tensorpack (for its
models or trainers) beside this library has a patched ``msgpack``. Through the patched names:

* our own wire format (``dataflow.serialize``, the worker protocol) changed with the import, so
  a worker started by spawn or the fork server (which has not imported tensorpack) decoded the
  consumer's arrays as dicts;
* our readers and receivers unpickled object arrays from files and from the network, which
  they refuse unless the user opts in.

So the modules that speak msgpack import this module as ``msgpack``: the implementation's own
classes, taken from where the ``msgpack`` package takes them (its C extension, or its pure-Python
fallback under ``MSGPACK_PUREPYTHON`` or without the extension), which the patch leaves alone.
"""
import os

from msgpack import ExtType, Timestamp

if os.environ.get("MSGPACK_PUREPYTHON"):
    from msgpack.fallback import Packer, Unpacker, unpackb
else:
    try:
        from msgpack._cmsgpack import Packer, Unpacker, unpackb
    except ImportError:
        from msgpack.fallback import Packer, Unpacker, unpackb

__all__ = ["ExtType", "Timestamp", "Packer", "Unpacker", "packb", "unpackb"]


def packb(o, **kwargs):
    """``o`` packed to bytes (``msgpack.packb``: a ``Packer(**kwargs)`` for one object)."""
    return Packer(**kwargs).pack(o)
