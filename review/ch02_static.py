"""Chapter 2: static batching step()."""
from collections import deque

from _harness import run

from inflight.exercises.scheduling import check_static_scheduler


class Base:
    def __init__(self, max_batch_size):
        self.max_batch_size = max_batch_size
        self.waiting = deque()
        self.active = {}

    def add_request(self, request_id, num_tokens):
        self.waiting.append((request_id, num_tokens))


class Correct(Base):
    def step(self):
        if not self.active:
            while self.waiting and len(self.active) < self.max_batch_size:
                rid, n = self.waiting.popleft()
                self.active[rid] = n
        served = sorted(self.active)
        for rid in served:
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return served


class W1FinishedDropped(Base):
    # returns who is still active after retiring: the finishing token's owner is missing
    def step(self):
        if not self.active:
            while self.waiting and len(self.active) < self.max_batch_size:
                rid, n = self.waiting.popleft()
                self.active[rid] = n
        for rid in list(self.active):
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return sorted(self.active)


class W2OneTooMany(Base):
    # <= instead of <: admits max_batch_size + 1
    def step(self):
        if not self.active:
            while self.waiting and len(self.active) <= self.max_batch_size:
                rid, n = self.waiting.popleft()
                self.active[rid] = n
        served = sorted(self.active)
        for rid in served:
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return served


class W3RetireFirst(Base):
    # retires before processing: each request gets one token too many
    def step(self):
        for rid in list(self.active):
            if self.active[rid] == 0:
                del self.active[rid]
        if not self.active:
            while self.waiting and len(self.active) < self.max_batch_size:
                rid, n = self.waiting.popleft()
                self.active[rid] = n
        served = sorted(self.active)
        for rid in served:
            self.active[rid] -= 1
        return served


class W3KeepsQueue(Base):
    # takes the batch from a copy of the queue but never removes it from the queue:
    # the same requests are admitted again and again
    def step(self):
        if not self.active:
            for rid, n in list(self.waiting)[:self.max_batch_size]:
                self.active[rid] = n
        served = sorted(self.active)
        for rid in served:
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return served


ANSWERS = [
    ("correct", None, Correct),
    ("w1", "returns ids still active after retiring (finished ones missing)", W1FinishedDropped),
    ("w2", "admits while len(active) <= max_batch_size (one slot too many)", W2OneTooMany),
    # my first w3 (retire at the start of the next step) turned out to be behaviourally identical
    # to the rule (the next admission happens after that retirement, in the same step): it is a
    # correct answer in another style, kept as one, and replaced by a real mistake below.
    ("correct2", None, W3RetireFirst),
    ("w3", "copies the batch from the queue but never removes it from the queue (re-admits)", W3KeepsQueue),
]

if __name__ == "__main__":
    run("ch02", ANSWERS, check_static_scheduler)
