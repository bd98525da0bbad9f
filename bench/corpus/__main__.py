import sys

from bench.corpus.cli import main

sys.exit(main())
