// The CPU emulation of Metal's compute execution model, for running shaders/metal/*.metal on
// Linux against the CPU kernels (test/support/metal-emu.ts builds and drives it).
//
// Each thread of a threadgroup is a fiber (ucontext) on one OS thread. A fiber runs until it
// reaches a collective operation (threadgroup_barrier, a simdgroup reduction or shuffle) or
// returns; the scheduler then resumes the runnable fibers in a fresh random order (seeded per
// dispatch), so between two synchronisation points the threads of a group run in a different
// interleaving on every seed. A kernel that reads threadgroup memory another thread wrote without
// a barrier in between, or that depends on which thread runs first, gets the stale value (or the
// NaN the memory is poisoned with) on some seed and fails its test. Threadgroups run one at a time
// in a random order. The scheduler also refuses what Metal leaves undefined and a GPU might
// forgive: a barrier not reached by every thread of the group (some returned or wait elsewhere),
// lanes of one simdgroup meeting at different collectives, a shuffle from an inactive lane.
#ifndef INFER_METAL_EMU_H
#define INFER_METAL_EMU_H

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

namespace metal {
namespace emu {

const uint simd_width = 32;
const uint threads_max = 1024;
const size_t stack_bytes = 64 << 10;

// Every [[attribute]] value a kernel may ask for, per thread.
struct Ids {
    uint3 threadgroup_position_in_grid;
    uint3 thread_position_in_threadgroup;
    uint3 thread_position_in_grid;
    uint3 threads_per_threadgroup;
    uint3 threadgroups_per_grid;
    uint thread_index_in_threadgroup;
    uint thread_index_in_simdgroup;
    uint simdgroup_index_in_threadgroup;
    uint simdgroups_per_threadgroup;
    uint threads_per_simdgroup;
};

typedef void (*Launcher)(void* const* buffers, void* threadgroup_memory, const Ids& ids);

struct KernelEntry {
    const char* name;
    Launcher launch;
};

enum class state { runnable, waiting, done };

struct Fiber {
    ucontext_t context;
    Ids ids;
    state st;
    op kind;
    float value;
    uint arg;
    float result;
};

struct Scheduler {
    Fiber* fibers = nullptr;
    char* stacks = nullptr;
    uint n = 0;
    ucontext_t home;
    Fiber* current = nullptr;
    Launcher launch = nullptr;
    void* const* buffers = nullptr;
    void* threadgroup_memory = nullptr;
    uint64_t rng = 1;
    char error[512] = {0};

    uint64_t next() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    }
};

inline Scheduler& sched() {
    static Scheduler s;
    return s;
}

inline void fail(const char* message, uint group_index) {
    Scheduler& s = sched();
    if (s.error[0] == 0) snprintf(s.error, sizeof s.error, "threadgroup %u: %s", group_index, message);
}

inline float collective(op kind, float value, uint arg) {
    Scheduler& s = sched();
    Fiber* f = s.current;
    f->kind = kind;
    f->value = value;
    f->arg = arg;
    f->st = state::waiting;
    swapcontext(&f->context, &s.home);
    return f->result;
}

inline void fiber_main() {
    Scheduler& s = sched();
    Fiber* f = s.current;
    s.launch(s.buffers, s.threadgroup_memory, f->ids);
    f->st = state::done;
    // returning resumes uc_link (the scheduler)
}

inline bool is_simd(op k) { return k != op::barrier; }

// Completes the collective the lanes [first, first + count) of one simdgroup wait at, if every
// lane still running waits there. Returns whether it released any lane.
inline bool resolve_simdgroup(Fiber* lanes, uint count, uint group_index) {
    Fiber* first_waiting = nullptr;
    for (uint i = 0; i < count; i++) {
        if (lanes[i].st == state::runnable) return false;
        if (lanes[i].st == state::waiting) {
            if (!is_simd(lanes[i].kind)) return false;
            if (!first_waiting) first_waiting = &lanes[i];
        }
    }
    if (!first_waiting) return false;
    const op kind = first_waiting->kind;
    for (uint i = 0; i < count; i++) {
        if (lanes[i].st != state::waiting) continue;
        if (lanes[i].kind != kind || lanes[i].arg != first_waiting->arg) {
            fail("lanes of one simdgroup meet at different simdgroup operations", group_index);
            return false;
        }
    }
    float acc = kind == op::simd_max ? -__builtin_inff() : kind == op::simd_min ? __builtin_inff() : 0;
    // Sums in lane order: a fixed order, so a result does not depend on the schedule.
    for (uint i = 0; i < count; i++) {
        if (lanes[i].st != state::waiting) continue;
        const float v = lanes[i].value;
        if (kind == op::simd_sum) acc += v;
        if (kind == op::simd_max) acc = acc > v ? acc : v;
        if (kind == op::simd_min) acc = acc < v ? acc : v;
    }
    for (uint i = 0; i < count; i++) {
        Fiber& f = lanes[i];
        if (f.st != state::waiting) continue;
        uint source = i;
        if (kind == op::shuffle_down) source = i + f.arg;
        if (kind == op::shuffle_xor) source = i ^ f.arg;
        if (kind == op::broadcast) source = f.arg;
        switch (kind) {
            case op::simd_sum: case op::simd_max: case op::simd_min: f.result = acc; break;
            case op::shuffle_down: case op::shuffle_xor: case op::broadcast:
                // Reading a lane that is absent or has returned is undefined: NaN makes it show.
                f.result = source < count && lanes[source].st == state::waiting
                    ? lanes[source].value : __builtin_nanf("");
                break;
            default: f.result = 0;
        }
    }
    for (uint i = 0; i < count; i++) {
        if (lanes[i].st == state::waiting) lanes[i].st = state::runnable;
    }
    return true;
}

// One threadgroup, to completion. Returns false (with sched().error set) on a violation.
inline bool run_group(uint group_index) {
    Scheduler& s = sched();
    const uint n = s.n;
    for (uint i = 0; i < n; i++) {
        Fiber& f = s.fibers[i];
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = s.stacks + i * stack_bytes;
        f.context.uc_stack.ss_size = stack_bytes;
        f.context.uc_link = &s.home;
        makecontext(&f.context, fiber_main, 0);
        f.st = state::runnable;
    }
    uint order[threads_max];
    for (;;) {
        uint runnable = 0;
        for (uint i = 0; i < n; i++) {
            if (s.fibers[i].st == state::runnable) order[runnable++] = i;
        }
        for (uint i = runnable; i > 1; i--) {  // Fisher-Yates
            const uint j = uint(s.next() % i);
            const uint t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        for (uint i = 0; i < runnable; i++) {
            s.current = &s.fibers[order[i]];
            swapcontext(&s.home, &s.current->context);
        }
        bool progress = false;
        for (uint first = 0; first < n; first += simd_width) {
            const uint count = n - first < simd_width ? n - first : simd_width;
            progress |= resolve_simdgroup(&s.fibers[first], count, group_index);
        }
        if (s.error[0]) return false;
        uint done = 0, at_barrier = 0;
        for (uint i = 0; i < n; i++) {
            const Fiber& f = s.fibers[i];
            if (f.st == state::done) done++;
            if (f.st == state::waiting && f.kind == op::barrier) at_barrier++;
        }
        if (done == n) return true;
        if (at_barrier > 0 && at_barrier + done == n) {
            if (done > 0) {
                fail("threadgroup_barrier reached by some threads after others returned", group_index);
                return false;
            }
            for (uint i = 0; i < n; i++) s.fibers[i].st = state::runnable;
            progress = true;
        }
        if (!progress) {
            fail("deadlock: threads wait at collectives that can never complete "
                 "(a barrier or simdgroup operation not reached by every thread)", group_index);
            return false;
        }
    }
}

// Runs grid[0]·grid[1]·grid[2] threadgroups of tg[0]·tg[1]·tg[2] threads.
inline int dispatch(Launcher launch, const uint* grid, const uint* tg, void* const* buffers,
                    uint threadgroup_memory_bytes, uint64_t seed) {
    Scheduler& s = sched();
    s.error[0] = 0;
    const uint n = tg[0] * tg[1] * tg[2];
    if (n == 0 || n > threads_max) {
        snprintf(s.error, sizeof s.error, "threadgroup size %u not in 1..%u", n, threads_max);
        return 1;
    }
    if (!s.fibers) {
        s.fibers = (Fiber*)calloc(threads_max, sizeof(Fiber));
        s.stacks = (char*)malloc(threads_max * stack_bytes);
    }
    s.n = n;
    s.launch = launch;
    s.buffers = buffers;
    s.rng = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    void* tg_memory = threadgroup_memory_bytes ? malloc(threadgroup_memory_bytes) : nullptr;
    s.threadgroup_memory = tg_memory;
    const uint n_groups = grid[0] * grid[1] * grid[2];
    uint* group_order = (uint*)malloc(sizeof(uint) * (n_groups ? n_groups : 1));
    for (uint g = 0; g < n_groups; g++) group_order[g] = g;
    for (uint i = n_groups; i > 1; i--) {
        const uint j = uint(s.next() % i);
        const uint t = group_order[i - 1];
        group_order[i - 1] = group_order[j];
        group_order[j] = t;
    }
    int rc = 0;
    for (uint k = 0; k < n_groups && rc == 0; k++) {
        const uint g = group_order[k];
        const uint3 gpos(g % grid[0], (g / grid[0]) % grid[1], g / (grid[0] * grid[1]));
        // Threadgroup memory starts as NaN: a read before any write shows in the result.
        if (tg_memory) memset(tg_memory, 0xff, threadgroup_memory_bytes);
        for (uint i = 0; i < n; i++) {
            Ids& ids = s.fibers[i].ids;
            const uint3 t(i % tg[0], (i / tg[0]) % tg[1], i / (tg[0] * tg[1]));
            ids.threadgroup_position_in_grid = gpos;
            ids.thread_position_in_threadgroup = t;
            ids.thread_position_in_grid = uint3(gpos.x * tg[0] + t.x, gpos.y * tg[1] + t.y,
                                                gpos.z * tg[2] + t.z);
            ids.threads_per_threadgroup = uint3(tg[0], tg[1], tg[2]);
            ids.threadgroups_per_grid = uint3(grid[0], grid[1], grid[2]);
            ids.thread_index_in_threadgroup = i;
            ids.thread_index_in_simdgroup = i % simd_width;
            ids.simdgroup_index_in_threadgroup = i / simd_width;
            ids.simdgroups_per_threadgroup = (n + simd_width - 1) / simd_width;
            ids.threads_per_simdgroup = simd_width;
        }
        if (!run_group(g)) rc = 1;
    }
    free(group_order);
    free(tg_memory);
    return rc;
}

// An attribute value as the parameter's declared type: a scalar takes .x, as Metal allows.
template <typename T>
struct id_as {
    static T get(uint3 v) { return T(v.x); }
    static T get(uint v) { return T(v); }
};
template <typename U>
struct id_as<vec3<U>> {
    static vec3<U> get(uint3 v) { return vec3<U>(v); }
};

}  // namespace emu
}  // namespace metal

#endif
