import sys

from gpuadmin.cli import main

sys.exit(main())
