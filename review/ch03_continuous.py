"""Chapter 3: continuous batching step()."""
from collections import deque

from _harness import run

from inflight.exercises.scheduling import check_continuous_scheduler


class Base:
    def __init__(self, max_batch_size):
        self.max_batch_size = max_batch_size
        self.waiting = deque()
        self.active = {}

    def add_request(self, request_id, num_tokens):
        self.waiting.append((request_id, num_tokens))


class Correct(Base):
    def step(self):
        free = self.max_batch_size - len(self.active)
        for _ in range(min(free, len(self.waiting))):
            rid, n = self.waiting.popleft()
            self.active[rid] = n
        out = []
        for rid in list(self.active):
            out.append(rid)
            self.active[rid] -= 1
            if not self.active[rid]:
                self.active.pop(rid)
        return sorted(out)


class W1OnePerStep(Base):
    # `if` instead of `while`: admits at most one request per step
    def step(self):
        if self.waiting and len(self.active) < self.max_batch_size:
            rid, n = self.waiting.popleft()
            self.active[rid] = n
        out = sorted(self.active)
        for rid in out:
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return out


class W2FinishedMissing(Base):
    # returns the survivors: the ids that finished this step are not in the result
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n = self.waiting.popleft()
            self.active[rid] = n
        for rid in list(self.active):
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return sorted(self.active)


class W3EmptyQueue(Base):
    # fills every free slot without checking the queue: pops from an empty deque
    def step(self):
        for _ in range(self.max_batch_size - len(self.active)):
            rid, n = self.waiting.popleft()
            self.active[rid] = n
        out = sorted(self.active)
        for rid in out:
            self.active[rid] -= 1
            if self.active[rid] == 0:
                del self.active[rid]
        return out


ANSWERS = [
    ("correct", None, Correct),
    ("w1", "admits at most one request per step (if instead of while)", W1OnePerStep),
    ("w2", "returns survivors only: finished ids missing from the step's result", W2FinishedMissing),
    ("w3", "admission loop pops without checking the queue is non-empty (IndexError)", W3EmptyQueue),
]

if __name__ == "__main__":
    run("ch03", ANSWERS, check_continuous_scheduler)
