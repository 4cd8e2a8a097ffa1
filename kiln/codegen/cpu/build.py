"""The cpu target's build: fused groups -> C kernels (:mod:`kiln.codegen.c`) -> one C source with its plan
runner (``targets.cpu``, docs/package-format.md).

The source holds every kernel (``<name>(pointers..., begin, end)`` over tiles ``[begin, end)``), then
``kiln_step`` (plan step ``s`` over a tile range, its buffers at fixed offsets of the arena) and
``kiln_run(arena, first, last, threads, dims)`` (:data:`RUNNER`): steps ``[first, last)`` on ``threads`` POSIX
threads of a pool kept between runs, each step's tiles split into contiguous ranges, a barrier between steps. The groups, memory plan
and buffers are the ones every target of the package shares; only the schedules
(:func:`kiln.codegen.cpu_schedule.cpu_schedule` for :data:`~kiln.codegen.cpu.vector.LANES` lanes) and the code
differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.codegen import c
from kiln.codegen.c_kernels import CKernel, CStep, build_c_kernels
from kiln.codegen.cpu.vector import PRELUDE, vector_body_native
from kiln.package import arena
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule

#: the C source's path inside a package
SOURCE = "kernels/kiln-cpu.c"
#: byte alignment of every buffer in the arena (a cache line; the widest vector loads stay aligned)
ALIGN = 64
#: free bytes before the first and after the last buffer (whole-vector loads may read past a buffer's end)
SLACK = 64
#: the most threads one run starts
MAX_THREADS = 256

#: the plan runner: a pool of POSIX threads started on the first run that needs them and kept (they spin briefly
#: for the next run, then sleep on a condition variable), a spinning barrier between steps, runs serialised
RUNNER = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#define KILN_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define KILN_PAUSE() __asm__ volatile("yield")
#else
#define KILN_PAUSE()
#endif
#define KILN_MAX_THREADS %(max_threads)d
#define KILN_SPINS 1000

typedef struct {
    pthread_mutex_t run;           // one run at a time
    pthread_mutex_t mu;            // guards sleeping and waking
    pthread_cond_t wake;
    pthread_t tids[KILN_MAX_THREADS];
    int born[KILN_MAX_THREADS];    // the epoch before the run that started each worker
    int started;                   // worker threads alive: ids 1 .. started
    atomic_int epoch;              // incremented for every run
    atomic_int count, generation;  // the barrier
    int threads, first, last;      // the current run
    unsigned char* m;
} kiln_pool_t;

static kiln_pool_t kiln_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static void kiln_barrier(kiln_pool_t* p) {
    int gen = atomic_load_explicit(&p->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->count, 1, memory_order_acq_rel) == p->threads - 1) {
        atomic_store_explicit(&p->count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
        return;
    }
    for (int spins = 0; atomic_load_explicit(&p->generation, memory_order_acquire) == gen; spins++) {
        if (spins < KILN_SPINS) KILN_PAUSE(); else sched_yield();
    }
}

// thread `id` of the run's `threads`: its range of every step's tiles, a barrier after each step
static void kiln_work(kiln_pool_t* p, int id) {
    // (read once: a thread leaving this run's last barrier late must not see the next run's range)
    const int n = p->threads, first = p->first, last = p->last;
    for (int s = first; s < last; s++) {
        const long long total = kiln_tiles(s);
        const int b = (int)(total * id / n), e = (int)(total * (id + 1) / n);
        if (b < e) kiln_step(p->m, s, b, e);
        if (n > 1) kiln_barrier(p);
    }
}

static void* kiln_worker(void* arg) {
    kiln_pool_t* p = &kiln_pool;
    const int id = (int)(long)arg;
    int seen = p->born[id];  // (not the epoch now: the run that started this thread may have begun already)
    for (;;) {
        int spins = 0, now;
        while ((now = atomic_load_explicit(&p->epoch, memory_order_acquire)) == seen && spins < KILN_SPINS) {
            KILN_PAUSE();
            spins++;
        }
        if (now == seen) {  // idle: sleep until the next run
            pthread_mutex_lock(&p->mu);
            while ((now = atomic_load_explicit(&p->epoch, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = now;
        if (id < p->threads) kiln_work(p, id);
    }
    return 0;
}

// a forked child has none of the workers: start afresh
static void kiln_after_fork(void) {
    kiln_pool.started = 0;
    pthread_mutex_init(&kiln_pool.run, 0);
    pthread_mutex_init(&kiln_pool.mu, 0);
    pthread_cond_init(&kiln_pool.wake, 0);
}
__attribute__((constructor)) static void kiln_init(void) { pthread_atfork(0, 0, kiln_after_fork); }

// plan steps [first, last) on `threads` threads, the kernels reading run-time dims `dims` (KILN_MAX_DIMS words), the
// buffers at byte `offsets` (one per buffer; read only in a package with growable buffers); returns the threads used
// (fewer when some could not start)
KILN_EXPORT("kiln_run") int kiln_run(unsigned char* m, int first, int last, int threads, const int* dims,
                                     const long long* offsets) {
    kiln_pool_t* p = &kiln_pool;
    if (first >= last) return 0;  // (no epoch for an empty run: a worker waking late would run the next one twice)
    if (threads < 1) threads = 1;
    if (threads > KILN_MAX_THREADS) threads = KILN_MAX_THREADS;
    pthread_mutex_lock(&p->run);
    for (int i = 0; i < KILN_MAX_DIMS; i++) kiln_dims[i] = dims[i];  // (under the lock: runs of other dims wait)
#if KILN_GROWS
    for (int i = 0; i < KILN_BUFFERS; i++) kiln_off[i] = offsets[i];  // where the growable buffers are this run
#endif
    while (p->started < threads - 1) {  // start the workers this run needs (kept for later runs)
        p->born[p->started + 1] = atomic_load_explicit(&p->epoch, memory_order_relaxed);
        if (pthread_create(&p->tids[p->started + 1], 0, kiln_worker, (void*)(long)(p->started + 1)) != 0) break;
        p->started++;
    }
    if (threads > p->started + 1) threads = p->started + 1;
    p->m = m;
    p->first = first;
    p->last = last;
    p->threads = threads;
    atomic_store_explicit(&p->count, 0, memory_order_relaxed);
    if (threads > 1) {
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add_explicit(&p->epoch, 1, memory_order_release);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    kiln_work(p, 0);  // the last barrier: every thread has finished every step
    pthread_mutex_unlock(&p->run);
    return threads;
}

KILN_EXPORT("kiln_steps") int kiln_steps(void) { return KILN_STEPS; }
"""


@dataclass
class CpuProgram:
    """Everything the package's ``targets.cpu`` is written from."""

    source: str
    offsets: list[int]
    bytes: int
    kernels: list[CKernel]
    steps: list[CStep]

    def section(self) -> tuple[dict[str, Any], dict[str, str | bytes]]:
        """The manifest entry (``targets.cpu``) and files (the C source)."""
        entry = {
            "source": SOURCE,
            "sha256": hashlib.sha256(self.source.encode()).hexdigest(),
            "bytes": len(self.source.encode()),
            "memory": {"bytes": self.bytes, "align": ALIGN, "slack": SLACK, "offsets": self.offsets},
            "kernels": [{"name": k.name, "ops": k.ops, "schedule": k.schedule, "vectorized": k.vectorized}
                        for k in self.kernels],
            "plan": [s.to_json() for s in self.steps],
        }
        return entry, {SOURCE: self.source}


def _plan_source(kernels: list[CKernel], steps: list[CStep], offsets: list[int], grows: list[bool]) -> str:
    lines = ["", f"#define KILN_BUFFERS {max(len(offsets), 1)}", f"#define KILN_GROWS {int(any(grows))}",
             "// where each buffer is in the arena this run (a package with growable buffers)",
             "static long long kiln_off[KILN_BUFFERS];",
             "// the plan: step s over tiles [b, e)",
             "static void kiln_step(unsigned char* m, int s, int b, int e) {", "    switch (s) {"]
    for i, s in enumerate(steps):
        k = kernels[s.kernel]
        args = ", ".join(f"({'const ' if ro else ''}{ctype}*)(m + {f'kiln_off[{b}]' if grows[b] else offsets[b]})"
                         for (ctype, ro), b in zip(k.params, s.buffers))
        call = f"{k.name}({args}, b, e); return;"
        for v in s.variants:  # (a variant's kernel has the same parameters)
            call = f"if ({v.condition()}) {{ {kernels[v.kernel].name}({args}, b, e); return; }} " + call
        lines.append(f"    case {i}: {call}")
    lines += ["    }", "}", f"#define KILN_STEPS {len(steps)}",
              "// the tiles of step s (a size expression of run-time dims in a package that has them)",
              "static int kiln_tiles(int s) {", "    switch (s) {"]
    for i, s in enumerate(steps):
        tiles = c.size_text(s.total)
        for v in s.variants:
            tiles = f"({v.condition()}) ? {c.size_text(v.total)} : {tiles}"
        lines.append(f"    case {i}: return {tiles};")
    lines += ["    }", "    return 0;", "}"]
    return "\n".join(lines) + "\n" + RUNNER % {"max_threads": MAX_THREADS}


def build_cpu(groups: list[Group], plan: MemoryPlan, schedule: Callable[[Tensor], Schedule],
              progress: bool = False) -> CpuProgram:
    """The C kernels of ``groups`` under ``schedule`` (:func:`kiln.codegen.c_kernels.build_c_kernels`, vectors of
    :data:`~kiln.codegen.cpu.vector.LANES` lanes) and the plan runner, in one source.

    Raises:
        KilnError: a group the kernels do not support.
    """
    kernels, steps = build_c_kernels(groups, plan, schedule, vector_body_native, "cpu", progress)
    grows = [b.grow is not None for b in plan.buffers]
    offsets, nbytes = arena.layout([b.nbytes for b in plan.buffers], grows, SLACK, ALIGN, SLACK)
    header = "// Kiln kernels for the CPU; generated from tensor expressions, do not edit.\n"
    source = (header + c.PRELUDE + PRELUDE + "\n" + "\n".join(k.source for k in kernels)
              + _plan_source(kernels, steps, offsets, grows))
    return CpuProgram(source, offsets, nbytes, kernels, steps)
