"""`python -m inflight.bench`: the benchmark the book and the README quote (see `__main__`)."""
