"""Chapter 4: memory-aware step()."""
from collections import deque

from _harness import run

from inflight.exercises.scheduling import check_memory_scheduler


class Base:
    def __init__(self, max_batch_size, max_memory=None):
        self.max_batch_size = max_batch_size
        self.max_memory = max_memory
        self.waiting = deque()
        self.active = {}

    def add_request(self, request_id, num_tokens, memory_cost=1):
        self.waiting.append((request_id, num_tokens, memory_cost))

    def memory_in_use(self):
        return sum(cost for _, cost in self.active.values())

    def process(self):
        served = sorted(self.active)
        for rid in served:
            self.active[rid][0] -= 1
            if self.active[rid][0] == 0:
                del self.active[rid]
        return served


class Correct(Base):
    def fits(self, cost):
        return self.max_memory is None or self.memory_in_use() + cost <= self.max_memory

    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size and self.fits(self.waiting[0][2]):
            rid, n, cost = self.waiting.popleft()
            self.active[rid] = [n, cost]
        return self.process()


class W1StrictLess(Base):
    # `<` instead of `<=`: an exact fit is refused
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, cost = self.waiting[0]
            if self.max_memory is not None and self.memory_in_use() + cost >= self.max_memory:
                break
            self.waiting.popleft()
            self.active[rid] = [n, cost]
        return self.process()


class W2OversizeIntoEmpty(Base):
    # "avoid a deadlock": lets the head in when the batch is empty, even if it can never fit
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, cost = self.waiting[0]
            if self.active and self.max_memory is not None and self.memory_in_use() + cost > self.max_memory:
                break
            self.waiting.popleft()
            self.active[rid] = [n, cost]
        return self.process()


class W3StaleUsed(Base):
    # memory in use read once before the loop and never updated as requests are admitted
    def step(self):
        used = self.memory_in_use()
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, cost = self.waiting[0]
            if self.max_memory is not None and used + cost > self.max_memory:
                break
            self.waiting.popleft()
            self.active[rid] = [n, cost]
        return self.process()


ANSWERS = [
    ("correct", None, Correct),
    ("w1", "refuses an exact fit (>= instead of >)", W1StrictLess),
    ("w2", "admits a request larger than max_memory into an empty batch", W2OversizeIntoEmpty),
    ("w3", "memory in use computed once per step, not updated per admission", W3StaleUsed),
]

if __name__ == "__main__":
    run("ch04", ANSWERS, check_memory_scheduler)
