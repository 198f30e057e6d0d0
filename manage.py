#!/usr/bin/env python
"""Django's command-line utility; same environment bootstrap as `gpuadmin manage`."""

import sys

from gpuadmin.cli import main

if __name__ == "__main__":
    sys.exit(main(["manage", *sys.argv[1:]]))
