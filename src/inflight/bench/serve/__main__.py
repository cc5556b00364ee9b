"""`python -m inflight.bench.serve`: the load generator (`inflight.bench.serve.loadgen`)."""
import sys

from inflight.bench.serve.loadgen import main

sys.exit(main())
