// The CPU emulation of Metal's compute execution model, for running shaders/metal/*.metal on
// Linux against the CPU kernels (test/support/metal-emu.ts builds and drives it).
//
// Each thread of a threadgroup is a fiber on one OS thread. A fiber runs until it reaches a
// collective operation (threadgroup_barrier, a simdgroup reduction or shuffle) or returns; the
// scheduler then resumes the runnable fibers in a fresh random order (seeded per threadgroup), so
// between two synchronisation points the threads of a group run in a different interleaving on
// every seed. A kernel that reads threadgroup memory another thread wrote without a barrier in
// between, or that depends on which thread runs first, gets the stale value (or the NaN the
// memory is poisoned with) on some seed and fails its test. The scheduler also refuses what Metal
// leaves undefined and a GPU might forgive: a barrier not reached by every thread of the group
// (some returned or wait elsewhere), lanes of one simdgroup meeting at different collectives, a
// shuffle from an inactive lane.
//
// simdgroup_matrix operations (load, store, multiply-accumulate) are collectives too: each lane
// holds only its share of an 8×8 matrix, and the operation is done once all 32 lanes of the
// simdgroup wait at it with the same arguments (resolve_matrix); fewer lanes, or lanes apart in
// memory, layout or types, is an error.
//
// Speed, which decides whether a real model fits in a test: a decode step of the default model
// starts ~10 million fibers (the LM head alone is 262,144 rows of one simdgroup each). glibc's
// swapcontext makes a sigprocmask system call on every switch, which was most of the time, so
// fibers switch here with a few instructions of assembly that save only the callee-saved
// registers (x86-64 and AArch64 ELF; ucontext elsewhere). Threadgroups are independent in Metal (no
// order between them is promised), so they are spread over OS threads, each with its own fibers
// and threadgroup memory; each group's interleavings come from a seed of (dispatch seed, group
// index), so a result does not depend on which OS thread ran the group or how many there were.
#ifndef INFER_METAL_EMU_H
#define INFER_METAL_EMU_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#if !(defined(__ELF__) && (defined(__x86_64__) || defined(__aarch64__))) && \
    !defined(INFER_EMU_UCONTEXT)
#define INFER_EMU_UCONTEXT 1
#endif
#ifdef INFER_EMU_UCONTEXT
#include <ucontext.h>
#endif

namespace metal {
namespace emu {

const uint simd_width = 32;
const uint threads_max = 1024;
const size_t stack_bytes = 64 << 10;
const uint workers_max = 64;

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

// The saved stack pointer of a suspended fiber (or of the scheduler while a fiber runs).
#ifdef INFER_EMU_UCONTEXT
typedef ucontext_t Context;
#else
typedef void* Context;
extern "C" void infer_emu_switch(void** save, void* resume);
#endif

struct Fiber {
    Context context;
    Ids ids;
    state st;
    op kind;
    float value;
    uint arg;
    float result;
    MatrixArgs matrix;  // a simdgroup_matrix operation's arguments (kind matrix_*)
};

struct Scheduler {
    Fiber* fibers = nullptr;
    char* stacks = nullptr;
    void* threadgroup_memory = nullptr;
    size_t threadgroup_capacity = 0;
    uint n = 0;
    Context home;
    Fiber* current = nullptr;
    Launcher launch = nullptr;
    void* const* buffers = nullptr;
    uint64_t rng = 1;

    uint64_t next() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    }
};

// One scheduler per OS thread that runs threadgroups (index 0: the calling thread).
inline Scheduler* schedulers() {
    static Scheduler s[workers_max];
    return s;
}

inline Scheduler*& current_scheduler() {
    static thread_local Scheduler* s = nullptr;
    return s;
}

inline Scheduler& sched() { return *current_scheduler(); }

// The first error of a dispatch, whichever thread found it.
struct ErrorState {
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    volatile int set = 0;
    char text[512] = {0};
};

inline ErrorState& errors() {
    static ErrorState e;
    return e;
}

inline const char* error_text() { return errors().text; }

inline void fail(const char* message, uint group_index) {
    ErrorState& e = errors();
    pthread_mutex_lock(&e.lock);
    if (!e.set) {
        snprintf(e.text, sizeof e.text, "threadgroup %u: %s", group_index, message);
        __atomic_store_n(&e.set, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&e.lock);
}

inline bool failed() { return __atomic_load_n(&errors().set, __ATOMIC_ACQUIRE) != 0; }

inline void to_home(Fiber* f) {
    Scheduler& s = sched();
#ifdef INFER_EMU_UCONTEXT
    swapcontext(&f->context, &s.home);
#else
    infer_emu_switch(&f->context, s.home);
#endif
}

inline void to_fiber(Fiber* f) {
    Scheduler& s = sched();
    s.current = f;
#ifdef INFER_EMU_UCONTEXT
    swapcontext(&s.home, &f->context);
#else
    infer_emu_switch(&s.home, f->context);
#endif
}

inline float collective(op kind, float value, uint arg) {
    Fiber* f = sched().current;
    f->kind = kind;
    f->value = value;
    f->arg = arg;
    f->st = state::waiting;
    to_home(f);
    return f->result;
}

inline void matrix_collective(op kind, const MatrixArgs& m) {
    Fiber* f = sched().current;
    f->matrix = m;
    collective(kind, 0, 0);
}

// Where every fiber starts; it never returns (its last switch goes home for good).
extern "C" inline void infer_emu_fiber_main() {
    Scheduler& s = sched();
    Fiber* f = s.current;
    s.launch(s.buffers, s.threadgroup_memory, f->ids);
    f->st = state::done;
    to_home(f);
    __builtin_trap();
}

#ifndef INFER_EMU_UCONTEXT
// infer_emu_switch(save, resume): pushes the callee-saved registers (and the floating-point
// control words) on the current stack, stores the stack pointer in *save, loads `resume` and
// pops the same frame from there. A new fiber's stack is laid out as such a frame whose return
// address is infer_emu_fiber_main.
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl infer_emu_switch\n"
    ".type infer_emu_switch,@function\n"
    "infer_emu_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    "    stmxcsr (%rsp)\n"
    "    fnstcw 4(%rsp)\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    ldmxcsr (%rsp)\n"
    "    fldcw 4(%rsp)\n"
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size infer_emu_switch, .-infer_emu_switch\n");
const uint frame_words = 9;  // control words, 6 registers, return address, then a fake caller's

inline void* initial_frame(char* stack_top) {
    // infer_emu_fiber_main is entered as if called: rsp + 8 aligned to 16, sp[8] its unused
    // return address.
    uint64_t* sp = (uint64_t*)(stack_top - frame_words * 8);
    uint32_t mxcsr;
    uint16_t fpucw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
    for (uint i = 1; i <= 6; i++) sp[i] = 0;
    sp[7] = (uint64_t)(void*)&infer_emu_fiber_main;
    sp[8] = 0;
    return sp;
}
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl infer_emu_switch\n"
    ".type infer_emu_switch,%function\n"
    "infer_emu_switch:\n"
    "    sub sp, sp, #160\n"
    "    stp x19, x20, [sp, #0]\n"
    "    stp x21, x22, [sp, #16]\n"
    "    stp x23, x24, [sp, #32]\n"
    "    stp x25, x26, [sp, #48]\n"
    "    stp x27, x28, [sp, #64]\n"
    "    stp x29, x30, [sp, #80]\n"
    "    stp d8, d9, [sp, #96]\n"
    "    stp d10, d11, [sp, #112]\n"
    "    stp d12, d13, [sp, #128]\n"
    "    stp d14, d15, [sp, #144]\n"
    "    mov x2, sp\n"
    "    str x2, [x0]\n"
    "    mov sp, x1\n"
    "    ldp x19, x20, [sp, #0]\n"
    "    ldp x21, x22, [sp, #16]\n"
    "    ldp x23, x24, [sp, #32]\n"
    "    ldp x25, x26, [sp, #48]\n"
    "    ldp x27, x28, [sp, #64]\n"
    "    ldp x29, x30, [sp, #80]\n"
    "    ldp d8, d9, [sp, #96]\n"
    "    ldp d10, d11, [sp, #112]\n"
    "    ldp d12, d13, [sp, #128]\n"
    "    ldp d14, d15, [sp, #144]\n"
    "    add sp, sp, #160\n"
    "    ret\n"
    ".size infer_emu_switch, .-infer_emu_switch\n");

inline void* initial_frame(char* stack_top) {
    uint64_t* sp = (uint64_t*)(stack_top - 160);
    for (uint i = 0; i < 20; i++) sp[i] = 0;
    sp[11] = (uint64_t)(void*)&infer_emu_fiber_main;  // x30, the link register
    return sp;
}
#endif
#endif

inline void start_fiber(Scheduler& s, uint i) {
    Fiber& f = s.fibers[i];
    char* stack = s.stacks + size_t(i) * stack_bytes;
#ifdef INFER_EMU_UCONTEXT
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stack;
    f.context.uc_stack.ss_size = stack_bytes;
    f.context.uc_link = &s.home;
    makecontext(&f.context, (void (*)())infer_emu_fiber_main, 0);
#else
    f.context = initial_frame(stack + stack_bytes);
#endif
    f.st = state::runnable;
}

inline bool is_simd(op k) { return k != op::barrier; }
inline bool is_matrix(op k) {
    return k == op::matrix_load || k == op::matrix_store || k == op::matrix_multiply_accumulate;
}

inline float get_elem(const void* p, elem type, ulong i) {
    return type == elem::f32 ? ((const float*)p)[i] : float(((const half*)p)[i]);
}
inline void set_elem(void* p, elem type, ulong i, float v) {
    if (type == elem::f32) ((float*)p)[i] = v;
    else ((half*)p)[i] = half(v);
}

// A simdgroup_matrix operation of all 32 lanes (simdgroup_matrix in metal_stdlib): the whole
// matrices gathered from the lanes' fragments (lane l holds elements 2l and 2l + 1, row-major),
// the operation done once, the result scattered back. Returns false (error set) on a violation.
inline bool resolve_matrix(Fiber* lanes, uint count, uint group_index) {
    const op kind = lanes[0].kind;
    const MatrixArgs& m = lanes[0].matrix;
    if (count != simd_width) {
        fail("a simdgroup_matrix operation in a simdgroup of fewer than 32 threads", group_index);
        return false;
    }
    for (uint i = 0; i < count; i++) {
        const MatrixArgs& o = lanes[i].matrix;
        if (lanes[i].st != state::waiting) {
            fail("a simdgroup_matrix operation not reached by every lane of the simdgroup",
                 group_index);
            return false;
        }
        if (o.memory != m.memory || o.elements_per_row != m.elements_per_row ||
            o.origin_x != m.origin_x || o.origin_y != m.origin_y || o.transpose != m.transpose ||
            o.d_type != m.d_type || o.a_type != m.a_type || o.b_type != m.b_type ||
            o.c_type != m.c_type || (o.c == nullptr) != (m.c == nullptr)) {
            fail("lanes pass different memory or layout (or matrix types) to one simdgroup_matrix "
                 "operation", group_index);
            return false;
        }
    }
    // Where element (r, c) of the matrix lies in memory for a load or a store.
    auto at = [&](uint r, uint c) -> ulong {
        const ulong row = m.transpose ? c : r, col = m.transpose ? r : c;
        return (m.origin_y + row) * m.elements_per_row + m.origin_x + col;
    };
    auto gather = [&](uint which, float* out) {  // which: 0 a, 1 b, 2 c
        const elem type = which == 0 ? m.a_type : which == 1 ? m.b_type : m.c_type;
        for (uint l = 0; l < simd_width; l++) {
            const MatrixArgs& o = lanes[l].matrix;
            const void* frag = which == 0 ? o.a : which == 1 ? o.b : o.c;
            if (!frag) {  // simdgroup_multiply's absent c
                out[2 * l] = out[2 * l + 1] = 0.0f;
                continue;
            }
            if (type == elem::f32) {
                out[2 * l] = ((const float*)frag)[0];
                out[2 * l + 1] = ((const float*)frag)[1];
            } else {
                out[2 * l] = float(((const half*)frag)[0]);
                out[2 * l + 1] = float(((const half*)frag)[1]);
            }
        }
    };
    float d[64];
    if (kind == op::matrix_load) {
        for (uint e = 0; e < 64; e++) d[e] = get_elem(m.memory, m.d_type, at(e / 8, e % 8));
    } else if (kind == op::matrix_store) {
        float a[64];
        gather(0, a);
        for (uint e = 0; e < 64; e++) set_elem(m.memory, m.a_type, at(e / 8, e % 8), a[e]);
    } else {
        float a[64], b[64], c[64];
        gather(0, a);
        gather(1, b);
        gather(2, c);
        for (uint r = 0; r < 8; r++) {
            for (uint col = 0; col < 8; col++) {
                float sum = 0.0f;
                for (uint k = 0; k < 8; k++) sum += a[r * 8 + k] * b[k * 8 + col];
                d[r * 8 + col] = sum + c[r * 8 + col];
            }
        }
    }
    if (kind != op::matrix_store) {
        for (uint e = 0; e < 64; e++) set_elem(lanes[e / 2].matrix.d, m.d_type, e % 2, d[e]);
    }
    for (uint i = 0; i < count; i++) lanes[i].st = state::runnable;
    return true;
}
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
    if (is_matrix(kind)) return resolve_matrix(lanes, count, group_index);
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

// One threadgroup, to completion. Returns false (with the error set) on a violation.
inline bool run_group(Scheduler& s, uint group_index) {
    const uint n = s.n;
    for (uint i = 0; i < n; i++) start_fiber(s, i);
    uint order[threads_max];
    for (;;) {
        // Simdgroups drift apart on a GPU: each round a simdgroup is held back with probability
        // 1/4 (never all of them), so others run ahead of it by several collectives and a
        // missing barrier between one simdgroup's reads and another's overwrite shows.
        const uint n_sg = (n + simd_width - 1) / simd_width;
        bool held[threads_max / simd_width] = {false};
        uint live = 0, kept = 0;
        for (uint g = 0; g < n_sg; g++) {
            bool any = false;
            for (uint i = g * simd_width; i < n && i < (g + 1) * simd_width; i++) {
                any |= s.fibers[i].st == state::runnable;
            }
            if (!any) continue;
            live++;
            held[g] = s.next() % 4 == 0;
            kept += held[g] ? 0 : 1;
        }
        if (live > 0 && kept == 0) {
            for (uint g = 0; g < n_sg; g++) held[g] = false;
        }
        uint runnable = 0;
        bool waiting_held = false;
        for (uint i = 0; i < n; i++) {
            if (s.fibers[i].st != state::runnable) continue;
            if (held[i / simd_width]) waiting_held = true;
            else order[runnable++] = i;
        }
        for (uint i = runnable; i > 1; i--) {  // Fisher-Yates
            const uint j = uint(s.next() % i);
            const uint t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        // A simdgroup whose last lane of the round has stopped completes the collective its lanes
        // wait at there and then, before the threads still to run this round go on: another
        // simdgroup may be behind, as on a GPU, so a simdgroup_load of memory another simdgroup
        // writes without a barrier in between sees it unwritten under some seed.
        uint left[threads_max / simd_width] = {0};
        for (uint i = 0; i < runnable; i++) left[order[i] / simd_width]++;
        bool progress = waiting_held;
        for (uint i = 0; i < runnable; i++) {
            to_fiber(&s.fibers[order[i]]);
            const uint g = order[i] / simd_width;
            if (--left[g] > 0) continue;
            const uint first = g * simd_width;
            const uint count = n - first < simd_width ? n - first : simd_width;
            progress |= resolve_simdgroup(&s.fibers[first], count, group_index);
            if (failed()) return false;
        }
        for (uint first = 0; first < n; first += simd_width) {
            const uint count = n - first < simd_width ? n - first : simd_width;
            progress |= resolve_simdgroup(&s.fibers[first], count, group_index);
        }
        if (failed()) return false;
        uint done = 0, at_barrier = 0;
        for (uint i = 0; i < n; i++) {
            const Fiber& f = s.fibers[i];
            if (f.st == state::done) done++;
            if (f.st == state::waiting && f.kind == op::barrier) at_barrier++;
        }
        if (done == n) return true;
        if (at_barrier > 0 && at_barrier + done == n) {
            if (done > 0) {
                fail("threadgroup_barrier reached by some threads after others returned",
                     group_index);
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

// A dispatch as the OS threads share it: each takes the next group of the shuffled order.
struct Work {
    Launcher launch;
    const uint* grid;
    const uint* tg;
    void* const* buffers;
    uint threadgroup_memory_bytes;
    uint64_t seed;
    const uint* group_order;
    uint n_groups;
    uint next_group;
};

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline void run_groups(Scheduler& s, Work& w) {
    current_scheduler() = &s;
    const uint n = w.tg[0] * w.tg[1] * w.tg[2];
    if (!s.fibers) {
        s.fibers = (Fiber*)calloc(threads_max, sizeof(Fiber));
        s.stacks = (char*)malloc(threads_max * stack_bytes);
    }
    if (s.threadgroup_capacity < w.threadgroup_memory_bytes) {
        free(s.threadgroup_memory);
        s.threadgroup_memory = malloc(w.threadgroup_memory_bytes);
        s.threadgroup_capacity = w.threadgroup_memory_bytes;
    }
    s.n = n;
    s.launch = w.launch;
    s.buffers = w.buffers;
    const uint* grid = w.grid;
    const uint* tg = w.tg;
    while (!failed()) {
        const uint k = __atomic_fetch_add(&w.next_group, 1u, __ATOMIC_RELAXED);
        if (k >= w.n_groups) break;
        const uint g = w.group_order[k];
        s.rng = mix(w.seed * 0x100000001B3ull + g) | 1;
        const uint3 gpos(g % grid[0], (g / grid[0]) % grid[1], g / (grid[0] * grid[1]));
        // Threadgroup memory starts as NaN: a read before any write shows in the result.
        if (w.threadgroup_memory_bytes) {
            memset(s.threadgroup_memory, 0xff, w.threadgroup_memory_bytes);
        }
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
        if (!run_group(s, g)) break;
    }
}

struct WorkerStart {
    Scheduler* s;
    Work* w;
};

inline void* worker_main(void* arg) {
    WorkerStart* start = (WorkerStart*)arg;
    run_groups(*start->s, *start->w);
    return nullptr;
}

// OS threads a dispatch may use (1: everything on the calling thread).
inline uint& worker_count() {
    static uint n = 1;
    return n;
}

// Below this many groups per thread, starting threads costs more than it gains.
const uint groups_per_worker_min = 16;

// Runs grid[0]·grid[1]·grid[2] threadgroups of tg[0]·tg[1]·tg[2] threads.
inline int dispatch(Launcher launch, const uint* grid, const uint* tg, void* const* buffers,
                    uint threadgroup_memory_bytes, uint64_t seed) {
    ErrorState& e = errors();
    e.text[0] = 0;
    e.set = 0;
    const uint n = tg[0] * tg[1] * tg[2];
    if (n == 0 || n > threads_max) {
        snprintf(e.text, sizeof e.text, "threadgroup size %u not in 1..%u", n, threads_max);
        e.set = 1;
        return 1;
    }
    const uint n_groups = grid[0] * grid[1] * grid[2];
    uint* group_order = (uint*)malloc(sizeof(uint) * (n_groups ? n_groups : 1));
    for (uint g = 0; g < n_groups; g++) group_order[g] = g;
    uint64_t rng = mix(seed) | 1;
    for (uint i = n_groups; i > 1; i--) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        const uint j = uint(rng % i);
        const uint t = group_order[i - 1];
        group_order[i - 1] = group_order[j];
        group_order[j] = t;
    }
    Work w = {launch, grid, tg, buffers, threadgroup_memory_bytes, seed, group_order, n_groups, 0};
    uint workers = n_groups / groups_per_worker_min;
    if (workers > worker_count()) workers = worker_count();
    if (workers > workers_max) workers = workers_max;
    if (workers < 1) workers = 1;
    pthread_t threads[workers_max];
    WorkerStart starts[workers_max];
    uint started = 1;
    for (uint i = 1; i < workers; i++) {
        starts[i] = {&schedulers()[i], &w};
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 20);
        const bool ok = pthread_create(&threads[i], &attr, worker_main, &starts[i]) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        started++;
    }
    run_groups(schedulers()[0], w);
    for (uint i = 1; i < started; i++) pthread_join(threads[i], nullptr);
    free(group_order);
    return failed() ? 1 : 0;
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
