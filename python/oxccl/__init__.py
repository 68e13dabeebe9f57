"""oxccl: NCCL's C API (``libnccl.so.2``) in Rust, and the ``oxccl`` CLI.

The package holds the library, its header and, when the wheel was built
with them, GPU kernels compiled ahead of time::

    import oxccl
    oxccl.library_path()   # .../site-packages/oxccl/lib/libnccl.so.2
    oxccl.include_dir()    # .../site-packages/oxccl/include (nccl.h)

Use the library with ``oxccl run -- CMD`` (it preloads it for CMD and its
children), or ``LD_PRELOAD=$(python -c 'import oxccl; print(oxccl.library_path())')``.
``python -m oxccl ARGS`` is the ``oxccl`` command.
"""

import os
import shutil
import sys
import sysconfig

try:
    from importlib.metadata import PackageNotFoundError, version as _version
except ImportError:  # Python < 3.8 has no importlib.metadata
    _version = None

_HERE = os.path.dirname(os.path.abspath(__file__))


def _package_version():
    if _version is None:
        return "unknown"
    try:
        return _version("oxccl")
    except PackageNotFoundError:
        return "unknown"


__version__ = _package_version()


def library_path():
    """The path of oxccl's ``libnccl.so.2`` in this package."""
    return os.path.join(_HERE, "lib", "libnccl.so.2")


def lib_dir():
    """The folder holding ``libnccl.so.2`` and ``libnccl.so`` (for ``-L``)."""
    return os.path.join(_HERE, "lib")


def include_dir():
    """The folder holding ``nccl.h`` (for ``-I``)."""
    return os.path.join(_HERE, "include")


def cli_path():
    """The ``oxccl`` executable pip installed with this package, or None."""
    schemes = [None]
    if sys.platform.startswith("linux"):
        schemes.append("posix_user")
    for scheme in schemes:
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        p = os.path.join(d, "oxccl")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("oxccl")
