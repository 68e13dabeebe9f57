"""``python -m oxccl ARGS``: runs the ``oxccl`` command with ARGS."""

import os
import sys

from . import cli_path


def main():
    exe = cli_path()
    if exe is None:
        sys.stderr.write("oxccl: the oxccl executable of this package was not found (reinstall the wheel)\n")
        return 127
    os.execv(exe, [exe] + sys.argv[1:])
    return 127  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
