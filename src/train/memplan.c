/* The memory plan (train/memplan.h).  Every figure is a sum of the buffers
 * the code allocates, each at the size the backend really holds (the CPU
 * rounds to 64 bytes, CUDA to 256), so the plan and the backend's counters
 * (olmo_backend_mem_stats) can be compared buffer for buffer:
 *   - olmo_model_create: fp32 weights and gradients, a compute-dtype copy on
 *     bf16 backends;
 *   - olmo_model_reserve: the activation table (model/activations.h): per
 *     layer up to 18 saved activations, the recompute set, the final norm's
 *     input and output, logits (cuda-bf16: a chunk of them and their bf16
 *     gradient), 10 backward work buffers, RoPE tables, token,
 *     target and document ids, summed here from the same table;
 *   - olmo_optimizer_create: two moments over the rank's ZeRO-1 shard
 *     (olmo_dist_shard: rank 0 holds the most);
 *   - the backends' grow-only scratch (cpu_cached_scratch slots, CUDA's
 *     olmo_cuda_scratch), from the ops' own size expressions;
 *   - olmo_measure_peak_flops: three 2048 x 2048 fp32 matrices at start-up.
 * fsdp (train/fsdp.c's buffers) and activation checkpointing (what
 * olmo_model_reserve keeps in each mode, bf16 where the backend multiplies
 * in bf16) are summed the same way; test_memplan.py measures every mode. */
#include "train/memplan.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "util/error.h"

/* What the plan needs to know of a backend without making one (CUDA need not be present). */
enum scratch_kind { SCRATCH_CPU, SCRATCH_CUDA };
struct backend_desc {
    const char *name;
    bool device, bf16_compute; /* bf16_compute: the model keeps a bf16 compute copy */
    bool bf16_attention;       /* CPU attention's products in bf16 */
    bool bf16_gemm_operands;   /* GEMMs round fp32 activation operands into bf16 scratch */
    bool bf16_dlogits;         /* cross_entropy_bf16: the logits' gradient reaches the GEMMs as bf16 */
    bool bf16_act_grads;       /* swiglu_bwd_bf16, rmsnorm_bwd_bf16: the backward's activation gradients reach
                                  the GEMMs as bf16 (dg and du held as bf16) */
    bool cudnn_attention;      /* cuda-bf16's attention through cuDNN (cuda_attention_cudnn.cu), as on a device
                                  that has it: bf16 copies of its operands instead of the kernels' delta */
    enum scratch_kind scratch;
    size_t align;
};

/* cpu-bf16's GEMMs: oneDNN's bf16 matmul (packs non-bf16 operands as bf16) or
 * the fallback (rounds every operand into fp32 scratch), as cpu_backend.c chooses. */
static bool cpu_bf16_uses_matmul(void) {
    const char *path = getenv("OLMOC_CPU_BF16");
    if (path && !strcmp(path, "convert")) return false;
    struct olmo_backend *be = olmo_backend_cpu_create(OLMO_CPU_GEMM_ONEDNN_BF16);
    olmo_backend_destroy(be);
    return be != NULL;
}

static int describe_backend(const char *name, struct backend_desc *d) {
    static const char *const cpu_fp32[] = {"cpu", "cpu-openblas", "cpu-onednn"};
    static const char *const cuda_fp32[] = {"cuda", "cuda-fp32", "cuda-tf32", "cuda-bf16-cublas"};
    *d = (struct backend_desc){.name = name, .scratch = SCRATCH_CPU, .align = 64};
    for (size_t i = 0; i < sizeof cpu_fp32 / sizeof *cpu_fp32; i++)
        if (!strcmp(name, cpu_fp32[i])) return 0;
    if (!strcmp(name, "cpu-bf16")) {
        d->bf16_compute = true;
        d->bf16_attention = olmo_cpu_attention_bf16_products();
        d->bf16_gemm_operands = cpu_bf16_uses_matmul();
        return 0;
    }
    d->scratch = SCRATCH_CUDA;
    d->align = 256;
    d->device = true;
    for (size_t i = 0; i < sizeof cuda_fp32 / sizeof *cuda_fp32; i++)
        if (!strcmp(name, cuda_fp32[i])) return 0;
    if (!strcmp(name, "cuda-bf16")) {
        d->bf16_compute = d->bf16_gemm_operands = d->bf16_dlogits = d->bf16_act_grads = true;
        return 0;
    }
    return olmo_error("unknown backend '%s' for the memory plan (cpu, cpu-openblas, cpu-onednn, cpu-bf16, cuda, "
                      "cuda-tf32, cuda-bf16, cuda-bf16-cublas)",
                      name);
}

static double max2(double a, double b) { return a > b ? a : b; }

/* A buffer from alloc: the bytes the backend holds for it. */
static double buf(const struct backend_desc *d, double bytes) {
    const double a = (double)d->align;
    return bytes <= 0 ? a : ceil(bytes / a) * a;
}

/* A CPU scratch slot of `bytes` (cpu_scratch's size: 64-byte rounding plus 64). */
static double cpu_slot(double bytes) { return bytes <= 0 ? 0 : ceil(bytes / 64) * 64 + 64; }
/* A CUDA scratch slot grown to serve `bytes`: olmo_cuda_scratch allocates 1.25 x the request that
 * outgrew it, so the slot ends between bytes and 1.25 x bytes; the plan takes the upper end. */
static double cuda_slot(double bytes) { return bytes <= 0 ? 0 : floor(bytes * 1.25); }

struct shapes {
    double N, T, B, D, Q, K, F, V, H, HK, hd, L;
};

/* A table tensor's bytes as the backend holds them (olmo_act_group_bytes's rounding). */
static double buf_of(const void *d, double bytes) { return buf(d, bytes); }

/* The GEMM operand slots of a bf16 backend that has seen operands of up to a_max and b_max elements. */
static double gemm_slots(const struct backend_desc *d, double a_max, double b_max, double b_weights) {
    if (!d->bf16_gemm_operands && !(d->bf16_compute && d->scratch == SCRATCH_CPU)) return 0;
    if (d->scratch == SCRATCH_CUDA) return cuda_slot(2 * a_max) + cuda_slot(2 * b_max);
    if (d->bf16_gemm_operands) return cpu_slot(2 * a_max) + cpu_slot(2 * b_max); /* packed as bf16 */
    return cpu_slot(4 * a_max) + cpu_slot(4 * max2(b_max, b_weights)); /* every operand rounded, fp32 */
}

/* The bytes of cpu_rmsnorm_bwd's run sums over n rows of `dim` (cpu_ops.c: NORM_RUN, NORM_PANEL_BYTES): rows
 * of dim rounded up to 16 floats, one a run of 8 rows, as many as 2 MiB holds, at most the runs, at least one. */
static double cpu_norm_runs(double n, double dim) {
    const double ld = dim > 0 ? ceil(dim / 16) * 16 : 16, runs = ceil(n / 8);
    double panel = floor((double)(2 << 20) / (4 * ld));
    if (panel > runs) panel = runs;
    if (panel < 1) panel = 1;
    return 4 * ld * panel;
}

/* The peak FLOP/s probe's GEMM: 2048 x 2048 fp32 operands (run.c: olmo_measure_peak_flops). */
#define PROBE_N 2048.0

/* The backend's grow-only scratch after a training step (the ops' own size expressions); `probe`:
 * the peak FLOP/s probe ran first (its fp32 operands grow a bf16 backend's GEMM slots). */
static double scratch(const struct backend_desc *d, const struct shapes *s, enum olmo_act_ckpt mode, bool probe,
                      int threads) {
    const double N = s->N, B = s->B, T = s->T, H = s->H, HK = s->HK, hd = s->hd;
    /* GEMM operands: A is [tokens x max(V, F, D, Q)] at most (the logits' gradient in the LM head's
     * backward; [tokens x max(F, D, Q)] where that gradient is bf16 already: dg, du, s; where every
     * activation gradient is bf16 too, the forward's fp32 A operands: att [N x Q], the final norm's
     * output and a block-checkpointed layer's x and h [N x D], a checkpointed layer's s [N x F]);
     * an activation B operand is a weight gradient's (model.c's backward) and the weights are the bf16
     * compute copy.  Rounding every operand (the CPU fallback), the widest B is [tokens x max(D, F, Q)];
     * packing only the fp32 ones (oneDNN's bf16 matmul, cuda-bf16), the bf16 saved s, h and x are read
     * as they are: the fp32 B operands are att [N x Q] always, and what a checkpointed layer
     * recomputes into the shared fp32 set: s [N x F] (feed_forward, block), h and x [N x D] (block). */
    double a_max = N * max2(max2(d->bf16_dlogits ? 0 : s->V, s->F), max2(s->D, s->Q)),
           b_max = N * max2(s->F, max2(s->D, s->Q));
    if (d->bf16_act_grads) a_max = N * max2(max2(s->Q, s->D), mode != OLMO_ACT_CKPT_NONE ? s->F : 0);
    if (d->bf16_gemm_operands)
        b_max = N * max2(s->Q, max2(mode == OLMO_ACT_CKPT_BLOCK ? s->D : 0, mode != OLMO_ACT_CKPT_NONE ? s->F : 0));
    if (probe) {
        a_max = max2(a_max, PROBE_N * PROBE_N);
        b_max = max2(b_max, PROBE_N * PROBE_N);
    }
    const double b_weights = max2(s->V * s->D, s->D * max2(s->F, s->Q));
    if (d->scratch == SCRATCH_CUDA) {
        const double rows = ceil(N / ceil(N / 256)); /* rmsnorm backward's chunks */
        /* attention backward's delta (the kernels), or cuDNN's workspace (the emulated one's size: its
         * rowsum(dO * O); a device's cuDNN chooses its own) and its bf16 q, k, v, o, dO, dq, dk, dv */
        double total = cuda_slot(4 * B * T * H) + (d->cudnn_attention ? cuda_slot(2 * N * (4 * s->Q + 4 * s->K)) : 0)
                       + cuda_slot(max2(16 * N, 1024 * 8)) + cuda_slot(16) /* loss rows / sum of squares, result */
                       + cuda_slot(8 * rows * max2(s->D, max2(s->Q, s->K)))  /* rmsnorm dw partials */
                       + cuda_slot(4 * (N + 2 * fmin(N, s->V) + 1));       /* embedding backward's index */
        return total + gemm_slots(d, a_max, b_max, b_weights);
    }
    const double ld = floor((T + 15) / 16) * 16 + 16; /* cpu_attention.c: transposed_ld */
    const bool bf16 = d->bf16_attention && (int)hd % 2 == 0;
    const double pairs = floor((T + 1) / 2), kblocks = ceil(T / 64);
    /* the backward's dq copies: one per extra run of key blocks of a (sequence, kv head) pair, by
     * shape alone (cpu_attention_kernels.h: attn_bwd_segments, ATT_BWD_TASKS = 8, ATT_KB = 64) */
    const double kv_pairs = B * HK;
    double segs = kv_pairs >= 8 ? 1 : ceil(8 / kv_pairs);
    if (segs > kblocks) segs = kblocks > 0 ? kblocks : 1;
    /* rmsnorm_bwd's run sums: the slot grows to the largest of its three dims' */
    const double norm_runs = max2(cpu_norm_runs(N, s->D), max2(cpu_norm_runs(N, s->Q), cpu_norm_runs(N, s->K)));
    /* bf16: K and V transposed per head as pairs; fp32: each OpenMP thread's K^T blocks and V rows of a
     * sequence (the forward's, cpu_attention_kernels.h: ATT_KTB = 64 keys a block) */
    double total = (bf16 ? 2 * cpu_slot(4 * B * ld * HK * hd / 2) : cpu_slot(4 * threads * 2 * kblocks * 64 * hd))
                   + cpu_slot(4 * B * H * T)                                  /* delta */
                   + (segs > 1 ? cpu_slot(4 * N * s->Q * (segs - 1)) : 0)     /* dq copies of the runs after the first */
                   + cpu_slot(norm_runs);                                     /* rmsnorm_bwd's run sums */
    if (bf16)
        total += 2 * cpu_slot(2 * N * s->Q)                                     /* Q and dO as bf16 rows */
                 + 2 * cpu_slot(4 * B * pairs * s->Q) + 2 * cpu_slot(4 * B * pairs * s->K); /* position pairs */
    else
        total += cpu_slot(4 * threads * 2 * (H / HK) * T * hd); /* each thread's Q and dO rows of a sequence, per
                                                                   * head of a group (the backward's) */
    /* cpu-bf16: oneDNN's bf16 matmul packs fp32 operands as bf16; the fallback rounds every
     * operand, the weights too, into fp32 scratch */
    return total + gemm_slots(d, a_max, b_max, b_weights);
}

const char *olmo_mem_item_name(enum olmo_mem_item item) {
    static const char *const names[OLMO_MEM_ITEMS] = {
        "weights (fp32 master)",    "gradients (fp32)",          "optimizer state (AdamW m, v)",
        "compute copy of weights",  "gathered compute weights",  "saved activations",
        "logits",                   "backward work, ids, RoPE",  "backend scratch",
        "communication buffers"};
    return (unsigned)item < OLMO_MEM_ITEMS ? names[item] : "?";
}

/* fsdp: rank 0's slices of n units, ceil(unit / S) each, summed; *max_slice raised to the largest. */
static double unit_slices(const double *units, int n, double S, double *max_slice) {
    double sum = 0;
    for (int u = 0; u < n; u++) {
        sum += ceil(units[u] / S);
        *max_slice = max2(*max_slice, ceil(units[u] / S));
    }
    return sum;
}

int olmo_mem_plan(const struct olmo_config *cfg, const struct olmo_mem_plan_options *o, struct olmo_mem_plan *p) {
    memset(p, 0, sizeof *p);
    struct backend_desc d;
    if (describe_backend(o->backend, &d)) return -1;
    if (o->ranks < 1) return olmo_error("--ranks must be >= 1 (got %d)", o->ranks);
    const struct olmo_train_config *t = &cfg->train;
    const int degree = o->shard_degree >= 0 ? o->shard_degree : t->shard_degree;
    if (degree < 0 || degree > o->ranks || (degree && o->ranks % degree))
        return olmo_error("shard degree %d: must divide the %d ranks (0 = all ranks)", degree, o->ranks);
    const struct olmo_model_config *c = &cfg->model;
    snprintf(p->backend, sizeof p->backend, "%s", o->backend);
    p->device = d.device;
    p->ranks = o->ranks;
    p->shard_degree = t->sharding == OLMO_SHARDING_FSDP ? (degree ? degree : o->ranks) : 0;
    p->rank = 0;
    p->threads = d.device ? 0 : o->threads > 1 ? o->threads : 1;
    const double hd = (double)(c->d_model / c->n_heads);
    const struct shapes s = {.N = (double)t->micro_batch * t->seq_len, .T = t->seq_len, .B = t->micro_batch,
                             .D = c->d_model, .Q = c->n_heads * hd, .K = c->n_kv_heads * hd, .F = c->mlp_hidden,
                             .V = c->vocab_size, .H = c->n_heads, .HK = c->n_kv_heads, .hd = hd, .L = c->n_layers};
    d.cudnn_attention = !strcmp(d.name, "cuda-bf16") && !t->intra_doc_masking && (int)hd % 16 == 0 && hd <= 128;
    const double n = (double)olmo_model_count_params(c, true); /* the flat parameter buffer's floats */
    const double cbytes = d.bf16_compute ? 2 : 4;
    double *b = p->bytes;
    if (t->sharding == OLMO_SHARDING_ZERO1) {
        const double shard = ceil(n / o->ranks); /* olmo_dist_shard: rank 0 has the remainder's extra float */
        b[OLMO_MEM_WEIGHTS] = buf(&d, 4 * n);
        b[OLMO_MEM_GRADS] = buf(&d, 4 * n);
        b[OLMO_MEM_OPTIM] = 2 * buf(&d, 4 * shard);
        b[OLMO_MEM_COMPUTE] = d.bf16_compute ? buf(&d, 2 * n) : 0;
    } else {
        /* train/fsdp.c: regions = the embedding, each block, the final norm with the LM head; a rank
         * keeps its slice (1/S of every unit, within a group of S ranks) of the fp32 master weights,
         * gradients and moments; the root regions (embedding, final norm + LM head) stay gathered in
         * fp32 with their gradients (and their compute copy on bf16 backends); a block is gathered
         * into a block buffer (fp32, plus its compute copy), two of them on a device (CUDA prefetches
         * the next block on a second stream), and as many block gradient buffers (CUDA reduce-scatters
         * the last block's gradients on a third stream while the next block's backward pass runs);
         * the reduce-scatter's output is one unit's slice.  Each region buffer has S spare floats. */
        const double S = p->shard_degree, per_layer = (n - 2 * s.V * s.D - s.D) / s.L;
        const double emb = s.V * s.D + S, head = s.V * s.D + s.D + S, block = per_layer + S;
        /* a region is cut into units, runs of its tensors of one kind (fsdp.c: on a bf16 backend the
         * GEMM matrices, gathered in bf16, apart from the fp32 norm weights; the input embedding is
         * fp32); rank 0 owns the first ceil(unit / S) of each, and the reduce-scatter's output holds
         * the largest such slice */
        double layer_units[4] = {per_layer, 0, 0, 0}, root_units[3] = {s.V * s.D, s.D + s.V * s.D, 0};
        if (d.bf16_compute) {
            layer_units[0] = s.D * (2 * s.Q + 2 * s.K); /* q, k, v, o projections */
            layer_units[1] = s.Q + s.K;                 /* q and k norms */
            layer_units[2] = 3 * s.D * s.F;             /* gate, up, down projections */
            layer_units[3] = 2 * s.D;                   /* the two post-norms */
            root_units[1] = s.D, root_units[2] = s.V * s.D; /* the final norm, the LM head */
        }
        double max_slice = 0;
        const double shard =
            s.L * unit_slices(layer_units, 4, S, &max_slice) + unit_slices(root_units, 3, S, &max_slice);
        b[OLMO_MEM_WEIGHTS] = buf(&d, 4 * shard) + buf(&d, 4 * emb) + buf(&d, 4 * head);
        b[OLMO_MEM_GRADS] =
            buf(&d, 4 * shard) + buf(&d, 4 * emb) + buf(&d, 4 * head) + (d.device ? 2 : 1) * buf(&d, 4 * block);
        b[OLMO_MEM_OPTIM] = 2 * buf(&d, 4 * shard);
        b[OLMO_MEM_COMPUTE] = d.bf16_compute ? buf(&d, cbytes * emb) + buf(&d, cbytes * head) : 0;
        b[OLMO_MEM_GATHERED] = (d.device ? 2 : 1) * (buf(&d, 4 * block) + (d.bf16_compute ? buf(&d, cbytes * block) : 0));
        b[OLMO_MEM_COMM] = buf(&d, 4 * max_slice);
    }
    const bool all16 = t->saved_activations == OLMO_SAVED_ACTS_BF16;
    if (all16 && !d.bf16_compute)
        return olmo_error("train.saved_activations: bf16 needs a backend that multiplies in bf16 (cpu-bf16, "
                          "cuda-bf16); backend '%s' computes in fp32",
                          o->backend);
    /* the saved activations, logits and backward work buffers: model/activations.h's table, which
     * olmo_model_reserve allocates (on a backend that multiplies in bf16 the GEMM operands are saved as bf16) */
    struct olmo_act_layout lo;
    olmo_act_layout_init(&lo, c, t->micro_batch, t->seq_len, t->activation_checkpointing, t->block_every,
                         d.bf16_compute, all16,
                         d.bf16_dlogits ? olmo_act_logits_chunk(c->vocab_size, t->micro_batch, t->seq_len) : 0);
    lo.grads16 = d.bf16_act_grads;
    b[OLMO_MEM_ACTIVATIONS] = olmo_act_group_bytes(&lo, OLMO_ACT_SAVED, buf_of, &d);
    b[OLMO_MEM_LOGITS] = olmo_act_group_bytes(&lo, OLMO_ACT_OUTPUT, buf_of, &d);
    b[OLMO_MEM_WORK] = olmo_act_group_bytes(&lo, OLMO_ACT_WORK, buf_of, &d);
    const bool probe = t->peak_flops <= 0;
    b[OLMO_MEM_SCRATCH] = scratch(&d, &s, t->activation_checkpointing, probe, p->threads);
    for (int i = 0; i < OLMO_MEM_ITEMS; i++) p->total += b[i];
    if (probe) {
        /* after the model, the optimizer and the activations, before the first step: three
         * matrices and the GEMM slots the probe grows */
        p->probe = 3 * buf(&d, 4.0 * PROBE_N * PROBE_N) + gemm_slots(&d, PROBE_N * PROBE_N, PROBE_N * PROBE_N, 0);
        p->peak = max2(p->total, p->total - b[OLMO_MEM_SCRATCH] + p->probe);
    } else {
        p->peak = p->total;
    }
    /* Not seen by the counters on a device: the CUDA context (~0.5 GiB on Hopper), cuBLAS's workspace,
     * NCCL's buffers, cudaMalloc's 2 MiB granularity: an allowance, not a measurement. */
    p->runtime = d.device ? 2.0 * 1024 * 1024 * 1024 : 0;
    p->need = p->peak + p->runtime;
    return 0;
}

/* GiB and GB for a plan of a GiB or more, MiB otherwise. */
static bool g_small;
static void amount(char *out, size_t n, double bytes) {
    if (g_small) snprintf(out, n, "%10.2f MiB %9.2f MB", bytes / (1024.0 * 1024), bytes / 1e6);
    else snprintf(out, n, "%10.2f GiB %9.2f GB", bytes / (1024.0 * 1024 * 1024), bytes / 1e9);
}

void olmo_mem_plan_print(const struct olmo_mem_plan *p, FILE *f, double have, const char *have_what) {
    char a[64];
    g_small = p->need < 1024.0 * 1024 * 1024;
    fprintf(f, "# memory plan for rank %d of %d, backend %s (%s memory)", p->rank, p->ranks, p->backend,
            p->device ? "device" : "host");
    if (p->shard_degree) fprintf(f, ", fsdp shard degree %d", p->shard_degree);
    else fprintf(f, ", zero1");
    if (p->threads) fprintf(f, ", %d OpenMP thread%s", p->threads, p->threads > 1 ? "s" : "");
    fprintf(f, ":\n");
    for (int i = 0; i < OLMO_MEM_ITEMS; i++) {
        amount(a, sizeof a, p->bytes[i]);
        fprintf(f, "#   %-32s %s\n", olmo_mem_item_name((enum olmo_mem_item)i), a);
    }
    amount(a, sizeof a, p->total);
    fprintf(f, "#   %-32s %s  (the backend's counters during training)\n", "total", a);
    if (p->probe > 0) {
        amount(a, sizeof a, p->probe);
        fprintf(f, "#   %-32s %s  (start-up only; train.peak_flops skips it)\n", "peak FLOP/s probe", a);
    }
    if (p->runtime > 0) {
        amount(a, sizeof a, p->runtime);
        fprintf(f, "#   %-32s %s  (CUDA context, cuBLAS, NCCL: an allowance, not counted)\n", "runtime allowance", a);
    }
    amount(a, sizeof a, p->need);
    fprintf(f, "#   %-32s %s\n", "need", a);
    if (!p->device && p->ranks > 1) {
        amount(a, sizeof a, p->need * p->ranks);
        fprintf(f, "#   %-32s %s  (if they share one machine's memory)\n", "all ranks", a);
    }
    fprintf(f, "# plan bytes: total %.0f peak %.0f need %.0f\n", p->total, p->peak, p->need);
    if (p->estimate) fprintf(f, "# estimate: %s\n", p->estimate);
    if (have <= 0) {
        fprintf(f, "# fits: not judged (give --device-memory)\n");
        return;
    }
    char need[32], hv[32];
    snprintf(need, sizeof need, "%.2f GiB", p->need / (1024.0 * 1024 * 1024));
    snprintf(hv, sizeof hv, "%.2f GiB", have / (1024.0 * 1024 * 1024));
    if (p->need <= have)
        fprintf(f, "# fits: need %s of %s (%s), %.0f%%\n", need, hv, have_what, 100.0 * p->need / have);
    else
        fprintf(f, "# does not fit: need %s, have %s (%s)\n", need, hv, have_what);
}

int olmo_parse_bytes(const char *s, double *out) {
    char *end;
    const double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0) return olmo_error("'%s' is not a memory size (e.g. 141GB, 131.6GiB)", s);
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"B", 1},          {"KB", 1e3},        {"MB", 1e6},
                 {"GB", 1e9},    {"TB", 1e12},      {"KiB", 1024.0},    {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    if (!*end) /* a bare number: 141 bytes is never what was meant */
        return olmo_error("'%s' has no unit: write e.g. %sGB or %sGiB (B, KB, MB, GB, TB = powers of 10; KiB, MiB, "
                          "GiB, TiB = of 2)", s, s, s);
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(end, units[i].unit)) {
            *out = v * units[i].scale;
            return 0;
        }
    return olmo_error("'%s': unknown unit '%s' (B, KB, MB, GB, TB = powers of 10; KiB, MiB, GiB, TiB = of 2)", s, end);
}
