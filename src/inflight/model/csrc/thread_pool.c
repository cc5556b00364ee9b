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
 * `threads` threads, the caller being thread 0: an even split (chunk 0) or chunks of `chunk` items
 * handed out in turn (chunk > 0). Which items a thread gets never changes what an item computes, so
 * the kernels' results don't depend on the thread count. One job at a time: the engine calls it from
 * one thread (a second caller while a job runs gets the work done on its own thread). Workers start on
 * first use and live until the process ends; a forked child starts its own.
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
    int64_t n, chunk;
    int threads;
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
    atomic_uint pending;       /* workers of the current job still running */
    atomic_int caller_asleep;  /* the caller sleeps until `pending` is 0 */
    atomic_int busy;           /* a job is running (a second caller runs its work alone) */
    atomic_llong next;         /* the next chunk to hand out */
    atomic_llong spin_ns;      /* how long a waiting thread spins before it sleeps */
    int started;               /* threads running, the caller's included (workers are 1..started-1) */
    atomic_ullong jobs, wakeups;
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

/* spin while *word == old (want_change) or while *word != 0 (!want_change), for at most the spin time;
 * 1 if the wait is over */
static int spin(atomic_uint *word, unsigned old, int want_change) {
    int64_t limit = atomic_load_explicit(&pool.spin_ns, memory_order_relaxed), end = 0;
    for (int64_t rounds = 0;; rounds++) {
        for (int i = 0; i < 64; i++) {
            unsigned v = atomic_load_explicit(word, memory_order_acquire);
            if (want_change ? v != old : v == 0) return 1;
            relax();
        }
        if (limit <= 0) return 0;
        if (rounds == 0) end = now_ns() + limit;
        else if (now_ns() >= end) return 0;
    }
}

static void run_share(const struct job *j, int tid) {
    if (j->chunk <= 0) {  /* an even split: thread t takes [n t / T, n (t + 1) / T) */
        int64_t b = j->n * tid / j->threads, e = j->n * (tid + 1) / j->threads;
        if (b < e) j->fn(j->ctx, b, e, tid);
        return;
    }
    for (;;) {
        int64_t b = atomic_fetch_add(&pool.next, j->chunk);
        if (b >= j->n) return;
        j->fn(j->ctx, b, b + j->chunk < j->n ? b + j->chunk : j->n, tid);
    }
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
        run_share(&pool.job, (int)(me - pool.slot));  /* the caller doesn't touch the job until the team is done */
        if (atomic_fetch_sub(&pool.pending, 1) == 1 && atomic_load(&pool.caller_asleep)) os_wake(&pool.pending);
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
    if (threads <= 1 || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
        fn(ctx, 0, n, 0);  /* one thread, or a second caller: the work on this thread alone */
        return;
    }
    if (start_workers(threads) < threads) threads = pool.started;
    pool.job = (struct job){fn, ctx, n, chunk, threads};
    atomic_store(&pool.next, 0);
    atomic_store(&pool.pending, (unsigned)(threads - 1));
    atomic_fetch_add(&pool.jobs, 1);
    unsigned gen = ++pool.generation ? pool.generation : ++pool.generation;
    for (int i = 1; i < threads; i++) {  /* spinners start now; sleepers need a wake-up */
        atomic_store(&pool.slot[i].go, gen);
        if (atomic_load(&pool.slot[i].asleep)) {
            atomic_fetch_add(&pool.wakeups, 1);
            os_wake(&pool.slot[i].go);
        }
    }
    run_share(&pool.job, 0);
    if (!spin(&pool.pending, 0, 0)) {  /* wait for the team: spin a while, then sleep */
        for (;;) {
            atomic_store(&pool.caller_asleep, 1);
            unsigned left = atomic_load(&pool.pending);
            if (left == 0) break;
            os_wait(&pool.pending, left);
        }
        atomic_store(&pool.caller_asleep, 0);
    }
    atomic_store(&pool.busy, 0);
}

/* how long waiting threads spin before they sleep, in nanoseconds (0: sleep at once); returns the old value */
int64_t inflight_pool_set_spin(int64_t ns) { return atomic_exchange(&pool.spin_ns, ns < 0 ? 0 : ns); }

/* for tests and benchmarks: jobs run with more than one thread, times sleeping workers were woken,
 * threads started (the caller's included), the spin in force */
void inflight_pool_stats(uint64_t *out) {
    out[0] = atomic_load(&pool.jobs), out[1] = atomic_load(&pool.wakeups), out[2] = (uint64_t)pool.started;
    out[3] = (uint64_t)atomic_load(&pool.spin_ns);
}
