"""Chapter 8: choose_victim(running) -> id to preempt."""
from _harness import run

from inflight.exercises.sharing import check_choose_victim


def correct(running):
    best_i = 0
    for i, (_, prio, arrival) in enumerate(running):
        _, bprio, barrival = running[best_i]
        if (prio, arrival) >= (bprio, barrival):  # >=: on a full tie the later-listed wins
            best_i = i
    return running[best_i][0]


def w1_arrival_first(running):
    # latest arrival first, priority only as a tie-break
    return max(reversed(running), key=lambda r: (r[2], r[1]))[0]


def w2_priority_reversed(running):
    # reads priority as "bigger is more important": evicts the smallest value
    best = running[0]
    for r in running:
        if (-r[1], r[2]) >= (-best[1], best[2]):
            best = r
    return best[0]


def w3_first_of_ties(running):
    # max() keeps the first of equal keys: a full tie picks the earliest listed
    return max(running, key=lambda r: (r[1], r[2]))[0]


def correct_sorted(running):
    # sorts a copy by (priority, arrival, position) and takes the last
    order = sorted(range(len(running)), key=lambda i: (running[i][1], running[i][2], i))
    return running[order[-1]][0]


ANSWERS = [
    ("correct2", None, correct_sorted),
    ("correct", None, correct),
    ("w1", "key (arrival, priority): latest arrival evicted before a lower priority", w1_arrival_first),
    ("w2", "priority direction reversed: smallest priority value evicted", w2_priority_reversed),
    ("w3", "full tie resolved to the first listed (max keeps the first)", w3_first_of_ties),
]

if __name__ == "__main__":
    run("ch08cv", ANSWERS, check_choose_victim)
