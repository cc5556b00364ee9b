/* The C kernels' own team of threads, whose idle members spin or sleep as the engine says, step by step.
 *
 * Why not OpenMP: torch's wheel ships GNU OpenMP, and a C library built with -fopenmp shares that one
 * runtime (same soname), whose idle threads either spin for a few milliseconds (its default) or sleep
 * at once (OMP_WAIT_POLICY=PASSIVE) -- chosen once, when torch loads, by whoever imported first. A
 * decode step runs twenty-odd short parallel regions; sleeping threads make each one pay for waking
 * a thread, spinning ones collapse when another program holds a core (every region waits at its
 * barrier for a descheduled thread while the spinners burn the time it needs). Here the spin is a
 * number the caller sets before each step: a bounded spin while the machine is quiet, none while
 * other programs want the cores.
 *
 * inflight_pool_for(n, threads, chunk, fn, ctx) runs fn(ctx, begin, end, tid) over [0, n) on up to
 * `threads` threads, the caller being thread 0: pieces of an even split (chunk 0: `threads` pieces) or
 * chunks of `chunk` items. Every piece is *claimed*: each thread takes the next unclaimed one until none
 * is left, and the caller waits only for pieces someone has claimed. So a worker that is late -- still
 * waking, or descheduled because another program holds its core -- costs nothing: the caller takes its
 * piece too, and the job runs at one thread's speed instead of stalling until the worker runs (with a
 * fixed split the caller had to wait for it, a scheduler time slice when the machine is busy). Which
 * thread takes a piece never changes what an item computes, so the kernels' results don't depend on
 * the thread count or on who was late. One job at a time: the engine calls it from one thread (a
 * second caller while a job runs gets the work done on its own thread). Workers start on first use and
 * live until the process ends; a forked child starts its own.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#define INFLIGHT_POOL_ITSELF  /* the typedefs only */
#include "parallel.h"

#define MAX_THREADS 256

/* Sleeping and waking on a word: a futex on Linux (what GNU OpenMP uses), a condition variable elsewhere. */
#ifdef __linux__
static void os_wait(atomic_uint *word, unsigned old) {
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
}
static void os_wake(atomic_uint *word) { syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0); }
static void os_forget(void) {}
#else
static pthread_mutex_t os_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t os_cond = PTHREAD_COND_INITIALIZER;
static void os_wait(atomic_uint *word, unsigned old) {
    pthread_mutex_lock(&os_lock);
    while (atomic_load(word) == old) pthread_cond_wait(&os_cond, &os_lock);
    pthread_mutex_unlock(&os_lock);
}
static void os_wake(atomic_uint *word) {
    (void)word;
    pthread_mutex_lock(&os_lock);
    pthread_cond_broadcast(&os_cond);
    pthread_mutex_unlock(&os_lock);
}
static void os_forget(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    os_lock = m, os_cond = c;
}
#endif

struct job {
    inflight_task fn;
    void *ctx;
    int64_t n, chunk;  /* chunk 0: an even split into `pieces` */
    int64_t pieces;
};

/* what a worker waits on: its own word, on its own cache line, set to the job's number when it is in
 * the team; `asleep` tells the caller that a wake-up is needed */
struct slot {
    atomic_uint go;
    atomic_int asleep;
    char pad[64 - sizeof(atomic_uint) - sizeof(atomic_int)];
};

static struct {
    struct job job;            /* written before the team's go words, read only by the team */
    struct slot slot[MAX_THREADS];
    unsigned generation;       /* the current job's number (only the caller writes it) */
    /* the job's number (high 32 bits) and its next unclaimed piece (low 32): a claim is a compare-and-swap
     * that fails once the job has changed, so a worker that read an old job's description runs nothing */
    atomic_ullong claim;
    atomic_uint done;          /* pieces of the current job finished */
    atomic_int caller_asleep;  /* the caller sleeps until `done` reaches the job's pieces */
    atomic_int busy;           /* a job is running (a second caller runs its work alone) */
    atomic_llong spin_ns;      /* how long a waiting thread spins before it sleeps */
    int started;               /* threads running, the caller's included (workers are 1..started-1) */
    atomic_ullong jobs, wakeups, pieces, taken_by_caller;
} pool = {.spin_ns = 200000};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* spin while *word == old (want_change) or while *word != target (!want_change), for at most the spin
 * time; 1 if the wait is over */
static int spin(atomic_uint *word, unsigned old, int want_change) {
    int64_t limit = atomic_load_explicit(&pool.spin_ns, memory_order_relaxed), end = 0;
    for (int64_t rounds = 0;; rounds++) {
        for (int i = 0; i < 64; i++) {
            unsigned v = atomic_load_explicit(word, memory_order_acquire);
            if (want_change ? v != old : v == old) return 1;
            relax();
        }
        if (limit <= 0) return 0;
        if (rounds == 0) end = now_ns() + limit;
        else if (now_ns() >= end) return 0;
    }
}

/* claim the next piece of job `gen`: its index, or -1 when none is left or the job is over */
static int64_t claim_piece(unsigned gen, int64_t pieces) {
    unsigned long long v = atomic_load(&pool.claim);
    for (;;) {
        if ((unsigned)(v >> 32) != gen || (int64_t)(v & 0xffffffffu) >= pieces) return -1;
        if (atomic_compare_exchange_weak(&pool.claim, &v, v + 1)) return (int64_t)(v & 0xffffffffu);
    }
}

/* run pieces of job `gen` (described by *j) until none is left; returns how many this thread ran */
static int64_t run_pieces(const struct job *j, unsigned gen, int tid) {
    int64_t ran = 0;
    for (int64_t p; (p = claim_piece(gen, j->pieces)) >= 0; ran++) {
        int64_t b, e;
        if (j->chunk <= 0) b = j->n * p / j->pieces, e = j->n * (p + 1) / j->pieces;
        else b = p * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
        if (b < e) j->fn(j->ctx, b, e, tid);
        /* the caller waits for every claimed piece: the last one wakes it if it sleeps */
        if (atomic_fetch_add(&pool.done, 1) + 1 == (unsigned)j->pieces && atomic_load(&pool.caller_asleep))
            os_wake(&pool.done);
    }
    return ran;
}

static void *worker(void *arg) {
    struct slot *me = &pool.slot[(int)(intptr_t)arg];
    unsigned seen = 0;  /* a worker's word is 0 until its first job (job numbers skip 0) */
    for (;;) {
        if (!spin(&me->go, seen, 1)) {
            for (;;) {  /* say so, look once more, sleep: the caller checks `asleep` after setting `go` */
                atomic_store(&me->asleep, 1);
                if (atomic_load(&me->go) != seen) break;
                os_wait(&me->go, seen);
                if (atomic_load(&me->go) != seen) break;
            }
            atomic_store(&me->asleep, 0);
        }
        seen = atomic_load_explicit(&me->go, memory_order_acquire);
        /* a copy of the job: by the time a late worker reads it the caller may be on the next one, and
         * then every claim fails (the number in `claim` has moved on), so the copy is never used */
        struct job j = pool.job;
        run_pieces(&j, seen, (int)(me - pool.slot));
    }
    return NULL;
}

static void forget_workers(void) {  /* in a forked child: the parent's workers don't exist here */
    os_forget();
    pool.started = 0;
    for (int i = 0; i < MAX_THREADS; i++) atomic_store(&pool.slot[i].go, 0), atomic_store(&pool.slot[i].asleep, 0);
    atomic_store(&pool.busy, 0), atomic_store(&pool.caller_asleep, 0);
}

/* make sure threads 1..want-1 exist; returns how many threads there are */
static int start_workers(int want) {
    static int registered;
    if (!registered) pthread_atfork(NULL, NULL, forget_workers), registered = 1;
    if (pool.started == 0) pool.started = 1;
    while (pool.started < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)pool.started);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.started++;
    }
    return pool.started;
}

void inflight_pool_for(int64_t n, int threads, int64_t chunk, inflight_task fn, void *ctx) {
    if (n <= 0) return;
    int64_t items = chunk > 0 ? (n + chunk - 1) / chunk : n;
    if (threads > items) threads = (int)items;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    int expected = 0;
    if (threads <= 1 || items > 0x7fffffff || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
        fn(ctx, 0, n, 0);  /* one thread, or a second caller: the work on this thread alone */
        return;
    }
    if (start_workers(threads) < threads) threads = pool.started;
    int64_t pieces = chunk > 0 ? items : threads;
    unsigned gen = ++pool.generation ? pool.generation : ++pool.generation;
    pool.job = (struct job){fn, ctx, n, chunk, pieces};
    atomic_store(&pool.done, 0);
    atomic_store(&pool.claim, (unsigned long long)gen << 32);
    atomic_fetch_add(&pool.jobs, 1);
    atomic_fetch_add(&pool.pieces, (unsigned long long)pieces);
    for (int i = 1; i < threads; i++) {  /* spinners start now; sleepers need a wake-up */
        atomic_store(&pool.slot[i].go, gen);
        if (atomic_load(&pool.slot[i].asleep)) {
            atomic_fetch_add(&pool.wakeups, 1);
            os_wake(&pool.slot[i].go);
        }
    }
    struct job j = pool.job;
    int64_t mine = run_pieces(&j, gen, 0);
    /* more than its share: pieces a late worker had not claimed yet */
    int64_t share = (pieces + threads - 1) / threads;
    if (mine > share) atomic_fetch_add(&pool.taken_by_caller, (unsigned long long)(mine - share));
    /* wait for the pieces others claimed: spin a while, then sleep */
    if (!spin(&pool.done, (unsigned)pieces, 0)) {
        for (;;) {
            atomic_store(&pool.caller_asleep, 1);
            unsigned finished = atomic_load(&pool.done);
            if (finished == (unsigned)pieces) break;
            os_wait(&pool.done, finished);
        }
        atomic_store(&pool.caller_asleep, 0);
    }
    atomic_store(&pool.busy, 0);
}

/* how long waiting threads spin before they sleep, in nanoseconds (0: sleep at once); returns the old value */
int64_t inflight_pool_set_spin(int64_t ns) { return atomic_exchange(&pool.spin_ns, ns < 0 ? 0 : ns); }

/* for tests and benchmarks: jobs run with more than one thread, times sleeping workers were woken,
 * threads started (the caller's included), the spin in force, pieces handed out, and pieces the caller
 * ran beyond its share because a worker was late */
void inflight_pool_stats(uint64_t *out) {
    out[0] = atomic_load(&pool.jobs), out[1] = atomic_load(&pool.wakeups), out[2] = (uint64_t)pool.started;
    out[3] = (uint64_t)atomic_load(&pool.spin_ns), out[4] = atomic_load(&pool.pieces);
    out[5] = atomic_load(&pool.taken_by_caller);
}
