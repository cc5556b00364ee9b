"""`python -m inflight.bench`: run the serving benchmark (see `inflight.bench.benchmark`)."""
import sys

from inflight.bench.benchmark import main

sys.exit(main())
