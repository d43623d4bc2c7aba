"""Prints the requirements an installed distribution declares, one a line, less those whose name matches a
pattern: the install scripts install a server `--no-deps`, then these, its GPU-only packages left out.
Extras and foreign platforms are left out by their markers.

Run with the venv's own python: `python scripts/requirements_less.py DISTRIBUTION PATTERN`.
"""

import re
import sys
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement  # the venv has pip; nothing else to install


def main(dist: str, pattern: str) -> None:
    skip = re.compile(pattern, re.I)
    for line in requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if not skip.match(req.name):
            print(str(req).split(";")[0].strip())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
