/* Host emulation of the CUDA runtime / cuBLAS subset declared in cuda_emu.h. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <deque>
#include <map>
#include <new>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace {

const size_t kDefaultSmemLimit = 48 * 1024;
const size_t kOptinSmemLimit = 163 * 1024; /* sm_80, the smallest of the architectures we build for */
const unsigned kMaxThreads = 1024;
const size_t kStackBytes = 256 * 1024;

[[noreturn]] void emu_abort(const char *what) {
    fprintf(stderr, "cuda_emu: %s\n", what);
    abort();
}

/* ---- fibers: one per CUDA thread of the running block, scheduled cooperatively ---- */

enum FiberState { READY, WAIT_BLOCK, WAIT_WARP, DONE };

struct Fiber {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t ctx;
#endif
    unsigned char *stack; /* kStackBytes, with a guard page below */
    FiberState state;
    uint3 tid; /* threadIdx of this fiber in the current launch */
};

struct Emu {
    Fiber fibers[kMaxThreads];
    unsigned n_stacks = 0;
    unsigned current = 0;
#if defined(__x86_64__)
    void *scheduler_sp = nullptr;
#else
    ucontext_t scheduler_ctx;
#endif
    const std::function<void()> *body = nullptr;
    double slots[kMaxThreads];
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    bool in_launch = false;
};
Emu emu;
cudaError_t last_error = cudaSuccess;
std::map<const void *, size_t> smem_limits;
int inject_countdown[CUDA_EMU_FAULTS]; /* cuda_emu_inject: calls left until the failing one; 0: none */

/* Whether this call of the kind is the one cuda_emu_inject chose to fail. */
bool injected(enum cuda_emu_fault kind) {
    return inject_countdown[kind] > 0 && --inject_countdown[kind] == 0;
}

#if defined(__x86_64__)
/* emu_switch(save, to): saves the callee-saved registers on the current stack,
 * stores the stack pointer in *save, and resumes the context whose stack pointer is `to`. */
extern "C" void emu_switch(void **save, void *to);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

void to_scheduler(void) {
    Fiber &f = emu.fibers[emu.current];
#if defined(__x86_64__)
    emu_switch(&f.sp, emu.scheduler_sp);
#else
    swapcontext(&f.ctx, &emu.scheduler_ctx);
#endif
}

void fiber_main(void) {
    (*emu.body)();
    emu.fibers[emu.current].state = DONE;
    to_scheduler();
    emu_abort("finished fiber resumed");
}

void prepare_fiber(unsigned i) {
    Fiber &f = emu.fibers[i];
    while (emu.n_stacks <= i) {
        void *m = mmap(nullptr, kStackBytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) emu_abort("cannot map a fiber stack");
        mprotect(m, 4096, PROT_NONE); /* guard page: a stack overflow faults instead of corrupting */
        emu.fibers[emu.n_stacks++].stack = (unsigned char *)m + 4096;
    }
    f.state = READY;
#if defined(__x86_64__)
    /* Initial frame: six zeroed registers for emu_switch to pop, then fiber_main as the
     * return address, then a dummy return address so fiber_main starts with the ABI's alignment. */
    uintptr_t top = ((uintptr_t)f.stack + kStackBytes) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;
    *--sp = (void *)&fiber_main;
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}

void resume_fiber(unsigned i) {
    emu.current = i;
    threadIdx = emu.fibers[i].tid;
#if defined(__x86_64__)
    emu_switch(&emu.scheduler_sp, emu.fibers[i].sp);
#else
    swapcontext(&emu.scheduler_ctx, &emu.fibers[i].ctx);
#endif
}

/* Runs one block to completion.  Warps run one at a time, each as far as it
 * can go (through its shuffles) until all its threads wait at __syncthreads or
 * have exited; then the next warp; then the block barrier is released and the
 * warps run again, in the opposite order.  Running warps far apart from each
 * other is what exposes a missing __syncthreads (a warp reads shared memory
 * another warp has not written yet, or overwrites what another still needs);
 * lanes within a warp also alternate their order. */
void run_block(const char *name, unsigned threads) {
    for (unsigned i = 0; i < threads; i++) prepare_fiber(i);
    const unsigned warps = (threads + 31) / 32;
    unsigned done = 0, at_block = 0;
    char msg[200];
    for (unsigned epoch = 0;; epoch++) {
        for (unsigned wi = 0; wi < warps; wi++) {
            const unsigned w = epoch & 1 ? warps - 1 - wi : wi;
            const unsigned lo = w * 32, size = threads - lo < 32 ? threads - lo : 32;
            for (unsigned pass = 0;; pass++) {
                unsigned waiting = 0, exited = 0;
                for (unsigned k = 0; k < size; k++) {
                    const unsigned i = lo + ((pass + epoch) & 1 ? size - 1 - k : k);
                    if (emu.fibers[i].state == READY) {
                        resume_fiber(i);
                        if (emu.fibers[i].state == READY) emu_abort("fiber yielded without waiting");
                        if (emu.fibers[i].state == DONE) done++;
                        if (emu.fibers[i].state == WAIT_BLOCK) at_block++;
                    }
                    waiting += emu.fibers[i].state == WAIT_WARP;
                    exited += emu.fibers[i].state == DONE;
                }
                if (!waiting) break; /* the warp is at __syncthreads or finished */
                if (waiting != size) {
                    snprintf(msg, sizeof msg,
                             "%s: warp %u: %u lanes wait at a shuffle while %u exited / %u wait at __syncthreads",
                             name, w, waiting, exited, size - waiting - exited);
                    emu_abort(msg);
                }
                for (unsigned i = lo; i < lo + size; i++) emu.fibers[i].state = READY;
            }
        }
        if (done == threads) return;
        if (at_block + done != threads) emu_abort("scheduler: a thread neither waits nor finished");
        if (done) {
            snprintf(msg, sizeof msg, "%s: __syncthreads reached by %u threads while %u have exited", name, at_block,
                     done);
            emu_abort(msg);
        }
        for (unsigned i = 0; i < threads; i++) emu.fibers[i].state = READY;
        at_block = 0;
    }
}

bool launch_error(const char *name, const char *why, cudaError_t err) {
    fprintf(stderr, "cuda_emu: launch of %s rejected: %s\n", name, why);
    last_error = err;
    return false;
}

bool check_launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem) {
    const unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (threads == 0 || threads > kMaxThreads || block.z > 64)
        return launch_error(name, "block size", cudaErrorInvalidConfiguration);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        return launch_error(name, "grid size", cudaErrorInvalidConfiguration);
    auto it = smem_limits.find(kernel);
    const size_t limit = it == smem_limits.end() ? kDefaultSmemLimit : it->second;
    if (smem > limit)
        return launch_error(name, "dynamic shared memory above the kernel's limit", cudaErrorInvalidValue);
    return true;
}

/* A shuffle is an exchange between the warp's 32 threads: write, wait for all,
 * read the partner's value, wait again (so nobody overwrites a slot still to be read). */
template <typename T>
T shuffle_xor(unsigned mask, T v, int lane_mask) {
    if (mask != 0xffffffffu) emu_abort("only full-warp shuffles are emulated");
    const unsigned tid = emu.current, warp = tid / 32, lane = tid % 32;
    const unsigned src = warp * 32 + (lane ^ (unsigned)lane_mask);
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    if ((unsigned)lane_mask >= 32 || src >= threads) emu_abort("shuffle source lane outside the block");
    emu.slots[tid] = (double)v; /* float and double both round-trip exactly */
    emu.fibers[tid].state = WAIT_WARP;
    to_scheduler();
    const T r = (T)emu.slots[src];
    emu.fibers[tid].state = WAIT_WARP;
    to_scheduler();
    return r;
}

double tf32(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0xfffu + ((u >> 13) & 1u); /* round to nearest even, 10 bits */
    u &= 0xffffe000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

double load(const void *p, cudaDataType type, size_t i) {
    if (type == CUDA_R_16BF) return emu_bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

double bf16(double x) { return emu_bfloat162float(__float2bfloat16((float)x)); }

enum OperandRounding { KEEP, TO_TF32, TO_BF16 };

/* op(X) of a column-major X as rows of k doubles, rounded as the compute type says:
 * out[r * k + l] = op(X)(r, l) for r < rows (op(X) is rows x k, or k x rows with `by_column`). */
bool operand_rows(std::vector<double> &out, const void *X, cudaDataType type, int ld, bool transposed, bool by_column,
                  int rows, int k, OperandRounding rounding) {
    try {
        out.resize((size_t)rows * k);
    } catch (const std::bad_alloc &) {
        return false;
    }
    /* element (r, l) of op(A) (by_column false) or (l, r) of op(B) (by_column true): stored at
     * r + l * ld, or at l + r * ld */
    const bool at_rl = transposed == by_column;
    for (int r = 0; r < rows; r++)
        for (int l = 0; l < k; l++) {
            double x = load(X, type, at_rl ? r + (size_t)l * ld : l + (size_t)r * ld);
            if (rounding == TO_TF32) x = tf32(x);
            else if (rounding == TO_BF16) x = bf16(x);
            out[(size_t)r * k + l] = x;
        }
    return true;
}

/* The column-major GEMM of the cuBLAS documentation: C = alpha op(A) op(B) + beta C.  Each element
 * is a double sum over l in order; the operands are loaded and rounded once (operand_rows), not
 * once per product. */
cublasStatus_t gemm_reference(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                              const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb,
                              float beta, float *C, int ldc, OperandRounding rounding) {
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* a[i * k + l] = op(A)(i, l); b[j * k + l] = op(B)(l, j) */
    std::vector<double> a, b;
    if (!operand_rows(a, A, at, lda, ta != CUBLAS_OP_N, false, m, k, rounding) ||
        !operand_rows(b, B, bt, ldb, tb != CUBLAS_OP_N, true, n, k, rounding))
        return CUBLAS_STATUS_ALLOC_FAILED;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const double *ar = a.data() + (size_t)i * k, *bc = b.data() + (size_t)j * k;
            double acc = 0.0;
            for (int l = 0; l < k; l++) acc += ar[l] * bc[l];
            float *c = C + i + (size_t)j * ldc;
            /* beta == 0: C is not read (it may hold NaNs), as in cuBLAS */
            *c = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

struct emu_cublas {
    int unused;
};
static emu_cublas the_handle;

void __syncthreads(void) {
    emu.fibers[emu.current].state = WAIT_BLOCK;
    to_scheduler();
}
float __shfl_xor_sync(unsigned mask, float v, int lane_mask) { return shuffle_xor(mask, v, lane_mask); }
double __shfl_xor_sync(unsigned mask, double v, int lane_mask) { return shuffle_xor(mask, v, lane_mask); }

void *emu_dynamic_smem(void) { return emu.smem; }

void emu_warp_barrier(void) { shuffle_xor(0xffffffffu, 0.0f, 0); }

/* WMMA's documented requirements: 256-bit aligned pointers, ldm a multiple of 16 bytes. */
void emu_wmma_check(const void *p, unsigned ldm, size_t elem_bytes, const char *what) {
    char msg[160];
    if ((uintptr_t)p % 32) {
        snprintf(msg, sizeof msg, "wmma::%s: pointer %p is not 32-byte aligned", what, p);
        emu_abort(msg);
    }
    if ((ldm * elem_bytes) % 16) {
        snprintf(msg, sizeof msg, "wmma::%s: ldm %u is not a multiple of 16 bytes", what, ldm);
        emu_abort(msg);
    }
    emu_warp_barrier();
}

void emu_launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem_bytes,
                const std::function<void()> &body) {
    if (emu.in_launch) emu_abort("nested launch");
    if (!check_launch(kernel, name, grid, block, smem_bytes)) return;
    if (injected(CUDA_EMU_FAIL_LAUNCH)) {
        launch_error(name, "injected failure", cudaErrorLaunchOutOfResources);
        return;
    }
    const unsigned threads = block.x * block.y * block.z;
    emu.in_launch = true;
    if (smem_bytes > emu.smem_bytes) {
        free(emu.smem);
        void *smem = NULL; /* the device's shared window is at least 128-byte aligned */
        if (posix_memalign(&smem, 128, smem_bytes)) emu_abort("out of memory for shared memory");
        emu.smem = (unsigned char *)smem;
        emu.smem_bytes = smem_bytes;
    }
    blockDim = block;
    gridDim = grid;
    emu.body = &body;
    for (unsigned i = 0; i < threads; i++)
        emu.fibers[i].tid = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                if (smem_bytes) memset(emu.smem, 0xff, smem_bytes); /* NaNs: shared memory starts undefined */
                blockIdx = {x, y, z};
                run_block(name, threads);
            }
    emu.in_launch = false;
}

/* ---- streams and events ---- */

/* Ordering, as on the device: work on stream A is ordered after the first n items of stream B when A
 * waited for an event recorded on B after them (directly or through a chain of events), or when the
 * host synchronised with B after them.  A vector clock per stream holds, for every other stream, how
 * many of its items are known to come before what is queued on it now (nullptr: the default stream). */
typedef std::map<cudaStream_t, unsigned long long> emu_clock;
struct emu_stream {
    std::deque<std::function<void()>> queue;
    unsigned long long queued = 0, done = 0; /* work items queued and run so far */
    emu_clock seen;
};
struct emu_event {
    cudaStream_t stream = nullptr; /* where it was last recorded (nullptr: the default stream, complete) */
    unsigned long long upto = 0;   /* complete once stream->done reaches this */
    emu_clock clock;               /* what the recording stream had seen, itself included */
};

namespace {
/* in creation order: every rank runs queued work (its MPI calls included) in the same order */
std::vector<cudaStream_t> streams;
bool is_stream(cudaStream_t s) { return std::find(streams.begin(), streams.end(), s) != streams.end(); }

/* Runs s's queued work until `upto` items have run. */
void run_until(cudaStream_t s, unsigned long long upto) {
    while (s->done < upto && !s->queue.empty()) {
        std::function<void()> fn = std::move(s->queue.front());
        s->queue.pop_front();
        fn();
        s->done++;
    }
}

void run_all_streams() {
    for (cudaStream_t s : streams) run_until(s, s->queued);
}

unsigned long long default_queued = 0; /* items submitted to the default stream (they run at once) */
emu_clock default_seen, host_seen;     /* the default stream's clock; what the host synchronised with */
emu_clock &seen_of(cudaStream_t s) { return s ? s->seen : default_seen; }
void merge(emu_clock &into, const emu_clock &from) {
    for (const auto &kv : from)
        if (into[kv.first] < kv.second) into[kv.first] = kv.second;
}
/* the host waited for everything queued on s so far */
void host_synced(cudaStream_t s) {
    merge(host_seen, seen_of(s));
    unsigned long long &v = host_seen[s];
    v = std::max(v, emu_stream_seq(s));
}
emu_counts_t counts;
} // namespace

unsigned long long emu_stream_seq(cudaStream_t s) { return s ? s->queued : default_queued; }

bool emu_stream_ordered(cudaStream_t s, cudaStream_t other, unsigned long long n) {
    if (s == other || n == 0) return true;
    const emu_clock &c = seen_of(s);
    const emu_clock &host = host_seen;
    auto a = c.find(other), h = host.find(other);
    return (a != c.end() && a->second >= n) || (h != host.end() && h->second >= n);
}

void cuda_emu_get_counts(struct cuda_emu_counts *out) { *out = counts; }

namespace {
void print_counts() {
    fprintf(stderr, "cuda_emu: counts: %llu D2H copies, %llu H2D copies, %llu synchronisations\n", counts.d2h_copies,
            counts.h2d_copies, counts.syncs);
}
struct counts_at_exit {
    counts_at_exit() {
        const char *e = getenv("OLMOC_EMU_COUNTS");
        if (e && !strcmp(e, "1")) atexit(print_counts);
    }
} counts_at_exit_;
} // namespace

void emu_stream_submit(cudaStream_t stream, std::function<void()> fn) {
    if (!stream) {
        default_queued++;
        fn();
        return;
    }
    if (!is_stream(stream)) emu_abort("work queued on a stream that does not exist");
    stream->queue.push_back(std::move(fn));
    stream->queued++;
}

void emu_launch_on(cudaStream_t stream, const void *kernel, const char *name, dim3 grid, dim3 block,
                   size_t smem_bytes, const std::function<void()> &body) {
    if (!stream) {
        emu_launch(kernel, name, grid, block, smem_bytes, body);
        return;
    }
    std::function<void()> copy = body; /* the lambda holds the arguments by value */
    emu_stream_submit(stream, [=]() { emu_launch(kernel, name, grid, block, smem_bytes, copy); });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
    if (flags != cudaStreamNonBlocking) return last_error = cudaErrorInvalidValue; /* only what the backend uses */
    *stream = new emu_stream;
    streams.push_back(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!is_stream(stream)) return last_error = cudaErrorInvalidValue;
    run_until(stream, stream->queued); /* CUDA finishes a destroyed stream's work */
    host_synced(stream);
    streams.erase(std::find(streams.begin(), streams.end(), stream));
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (stream && !is_stream(stream)) return last_error = cudaErrorInvalidValue;
    if (stream) run_until(stream, stream->queued);
    host_synced(stream);
    counts.syncs++;
    return last_error;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags) {
    (void)flags;
    *event = new emu_event;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (stream && !is_stream(stream)) return last_error = cudaErrorInvalidValue;
    event->stream = stream;
    event->upto = stream ? stream->queued : 0;
    event->clock = seen_of(stream);
    event->clock[stream] = emu_stream_seq(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
    if (flags) return last_error = cudaErrorInvalidValue;
    if (stream && !is_stream(stream)) return last_error = cudaErrorInvalidValue;
    cudaStream_t from = event->stream;
    merge(seen_of(stream), event->clock);
    if (!from || from == stream) return cudaSuccess; /* the default stream's work is done; a stream is in order */
    if (!is_stream(from)) return last_error = cudaErrorInvalidValue;
    if (!stream) {
        run_until(from, event->upto); /* the default stream waits: run the side work it waits for */
        return cudaSuccess;
    }
    /* a created stream waiting for another created stream: not used by the backend */
    return last_error = cudaErrorInvalidValue;
}

/* ---- runtime ---- */

bool cuda_emu_injected(enum cuda_emu_fault kind) { return injected(kind); }

void cuda_emu_inject(enum cuda_emu_fault kind, int nth) {
    if ((int)kind < 0 || kind >= CUDA_EMU_FAULTS || nth < 0) emu_abort("cuda_emu_inject: no such fault");
    inject_countdown[kind] = nth;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    /* cudaMalloc aligns to 256 bytes; the exact size keeps ASan's bounds on kernel accesses */
    if (injected(CUDA_EMU_FAIL_MALLOC) || posix_memalign(p, 256, bytes ? bytes : 1)) {
        *p = NULL;
        return last_error = cudaErrorMemoryAllocation;
    }
    memset(*p, 0xff, bytes); /* device memory starts undefined: NaN patterns expose reads before writes */
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    run_all_streams(); /* cudaFree synchronises the device */
    host_synced(nullptr);
    for (cudaStream_t s : streams) host_synced(s);
    free(p);
    return cudaSuccess;
}

/* Page-locked host memory is host memory; cudaHostAlloc fails as cudaMalloc does when injected. */
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    if (injected(CUDA_EMU_FAIL_MALLOC) || !(*p = malloc(bytes ? bytes : 1))) {
        *p = NULL;
        return last_error = cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    run_all_streams(); /* cudaFreeHost synchronises the device */
    free(p);
    return cudaSuccess;
}

static bool overlaps(const void *a, const void *b, size_t n) {
    const char *x = (const char *)a, *y = (const char *)b;
    return n && x < y + n && y < x + n;
}

/* Counted as the host's copies (cudaMemcpyAsync's queued copies come here too, with their kind). */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    if (kind == cudaMemcpyDeviceToHost) {
        counts.d2h_copies++;
        host_synced(nullptr); /* a copy to pageable host memory returns once the default stream is done */
    } else if (kind == cudaMemcpyHostToDevice) {
        counts.h2d_copies++;
    }
    if (overlaps(dst, src, bytes)) emu_abort("cudaMemcpy between overlapping buffers");
    if (bytes) memcpy(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
    if (overlaps(dst, src, bytes)) emu_abort("cudaMemcpyAsync between overlapping buffers");
    emu_stream_submit(stream, [=]() { cudaMemcpy(dst, src, bytes, kind); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    if (bytes) memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
    emu_stream_submit(stream, [=]() { cudaMemset(p, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaDeviceSynchronize(void) {
    run_all_streams();
    host_synced(nullptr);
    for (cudaStream_t s : streams) host_synced(s);
    counts.syncs++;
    return last_error;
}

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    }
    return "unknown error";
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0) return last_error = cudaErrorInvalidValue; /* one emulated device */
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return last_error = cudaErrorInvalidValue;
    const char *name = getenv("OLMOC_EMU_DEVICE_NAME");
    snprintf(prop->name, sizeof prop->name, "%s", name && *name ? name : "emulated CUDA device");
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > kOptinSmemLimit)
        return last_error = cudaErrorInvalidValue;
    smem_limits[func] = (size_t)value;
    return cudaSuccess;
}

/* ---- bf16 ---- */

__nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 h;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) h.bits = 0x7fc0; /* NaN */
    else h.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

float emu_bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- cuBLAS ---- */

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = &the_handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    (void)mode;
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "unknown cuBLAS status";
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (injected(CUDA_EMU_FAIL_BLAS)) return CUBLAS_STATUS_EXECUTION_FAILED;
    return gemm_reference(transa, transb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc,
                          KEEP);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (injected(CUDA_EMU_FAIL_BLAS)) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* the combinations the backend uses (all in cuBLAS's table of supported GemmEx types) */
    const bool f32_in = Atype == CUDA_R_32F && Btype == CUDA_R_32F;
    const bool tf32 = f32_in && compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const bool fast_bf16 = f32_in && compute == CUBLAS_COMPUTE_32F_FAST_16BF;
    const bool bf16_in = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && compute == CUBLAS_COMPUTE_32F;
    if (Ctype != CUDA_R_32F || !(tf32 || fast_bf16 || bf16_in)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm_reference(transa, transb, m, n, k, *(const float *)alpha, A, Atype, lda, B, Btype, ldb,
                          *(const float *)beta, (float *)C, ldc, tf32 ? TO_TF32 : fast_bf16 ? TO_BF16 : KEEP);
}
