#include "train/fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define TRY(call)                   \
    do {                            \
        if ((call) != 0) return -1; \
    } while (0)

static size_t elem_size(const struct olmo_backend *be) { return olmo_float_type_size(be->compute_dtype); }

static bool has_compute_copy(const struct olmo_backend *be) { return be->compute_dtype != OLMO_F32; }

/* The three collectives on shard buffers, through MPI or the backend's communicators. */
static int group_allgather(struct olmo_fsdp *fs, void *buf, size_t bytes) {
    if (fs->shard_group.world == 1 && !fs->shard_comm) return 0;
    return fs->device ? fs->m->be->comm_group_allgather(fs->m->be, fs->shard_comm, buf, bytes)
                      : olmo_dist_allgather_equal_bytes(&fs->shard_group, buf, bytes);
}

static int group_reduce_scatter(struct olmo_fsdp *fs, const float *in, float *out, size_t n) {
    if (fs->shard_group.world == 1 && !fs->rs_comm) return fs->m->be->copy(fs->m->be, out, in, n * sizeof(float));
    return fs->device ? fs->m->be->comm_group_reduce_scatter(fs->m->be, fs->rs_comm, in, out, n)
                      : olmo_dist_reduce_scatter_f32(&fs->shard_group, in, out, n);
}

static int replica_allreduce(struct olmo_fsdp *fs, float *buf, size_t n) {
    if (fs->replica_group.world == 1 || !n) return 0;
    return fs->device ? fs->m->be->comm_group_allreduce_sum(fs->m->be, fs->replica_comm, buf, n)
                      : olmo_dist_allreduce_f32(&fs->replica_group, buf, n);
}

/* Gathers unit u into its region's buffers w (fp32) and c (compute copy, bf16 backends), whose element 0
 * is the region's first parameter.  A matrix unit on a bf16 backend travels in bf16 (each rank converts
 * its piece first: the same values as converting after an fp32 gather); every other unit in fp32, then
 * converted where there is a compute copy.  The padding of the last rank's piece spills into the next
 * unit's place (or the region buffer's spare G elements): units are gathered in order, so the next one
 * overwrites it. */
static int gather(struct olmo_fsdp *fs, int u, float *w, void *c) {
    const struct olmo_backend *be = fs->m->be;
    const struct olmo_fsdp_unit *un = &fs->units[u];
    const size_t off = un->start - fs->regions[un->region].start, r = (size_t)fs->shard_group.rank;
    if (un->low) {
        const size_t es = olmo_float_type_size(be->compute_dtype);
        char *base = (char *)c + off * es, *mine = base + r * un->shard * es;
        if (un->my_len)
            TRY(be->convert(be, mine, be->compute_dtype, fs->master + un->local, OLMO_F32, un->my_len));
        if (un->my_len < un->shard) TRY(be->zero(be, mine + un->my_len * es, (un->shard - un->my_len) * es));
        return group_allgather(fs, base, un->shard * es);
    }
    float *base = w + off, *mine = base + r * un->shard;
    if (un->my_len) TRY(be->copy(be, mine, fs->master + un->local, un->my_len * sizeof(float)));
    if (un->my_len < un->shard) TRY(be->zero(be, mine + un->my_len, (un->shard - un->my_len) * sizeof(float)));
    TRY(group_allgather(fs, base, un->shard * sizeof(float)));
    if (c)
        TRY(be->convert(be, (char *)c + off * olmo_float_type_size(be->compute_dtype), be->compute_dtype, base,
                        OLMO_F32, un->len));
    return 0;
}

static int gather_region(struct olmo_fsdp *fs, int region, float *w, void *c) {
    const struct olmo_fsdp_region *rg = &fs->regions[region];
    for (int u = rg->first; u < rg->first + rg->n_units; u++) TRY(gather(fs, u, w, c));
    return 0;
}

/* Reduce-scatters the gradients of a region's units (g: the region's gradient buffer, summed over the
 * group; a unit's padding reads the next unit's gradients or the buffer's zeroed spare, which land past
 * the last rank's piece and are dropped) and adds this rank's pieces to its gradient shard. */
static int reduce_scatter_units(struct olmo_fsdp *fs, int region, const float *g) {
    const struct olmo_backend *be = fs->m->be;
    const struct olmo_fsdp_region *rg = &fs->regions[region];
    for (int u = rg->first; u < rg->first + rg->n_units; u++) {
        const struct olmo_fsdp_unit *un = &fs->units[u];
        TRY(group_reduce_scatter(fs, g + (un->start - rg->start), fs->rs_out, un->shard));
        if (un->my_len) TRY(be->add(be, fs->grad + un->local, fs->grad + un->local, fs->rs_out, un->my_len));
    }
    return 0;
}

/* The same on the gradient queue where there is one, after everything queued so far; the work is marked
 * `slot` (grad_wait(slot) orders the main queue after it). */
static int reduce_scatter_region(struct olmo_fsdp *fs, int region, const float *g, int slot) {
    const struct olmo_backend *be = fs->m->be;
    if (!fs->grad_queue) return reduce_scatter_units(fs, region, g);
    TRY(be->grad_begin(be));
    fs->grad_pending[slot] = true; /* queued work may read blk_g[slot] from here on, even if a call fails */
    const int rc = reduce_scatter_units(fs, region, g);
    TRY(be->grad_end(be, slot)); /* back on the main queue even when a call failed */
    return rc;
}

/* The main queue waits for the gradient-queue work marked `slot` (it reads blk_g[slot]). */
static int grads_settle(struct olmo_fsdp *fs, int slot) {
    if (!fs->grad_pending[slot]) return 0;
    fs->grad_pending[slot] = false;
    return fs->m->be->grad_wait(fs->m->be, slot);
}

/* ... and for all of it: the gradient shard is complete. */
static int grads_settle_all(struct olmo_fsdp *fs) {
    for (int i = 0; i < 2; i++) TRY(grads_settle(fs, i));
    return 0;
}

/* A region's buffers hold its parameters and G spare elements (the last unit's padding). */
static size_t region_alloc(const struct olmo_fsdp *fs, int region) {
    return fs->regions[region].len + (size_t)fs->shard_group.world;
}

static void set_window(struct olmo_model *m, int i, const float *w, size_t n, const void *c) {
    m->win[i] = (struct olmo_weight_window){.w = w, .n = n, .compute = c};
    if (m->n_win <= i) m->n_win = i + 1;
}

/* The buffer that holds `block` gathered from the current master weights, or -1. */
static int slot_holding(const struct olmo_fsdp *fs, int block) {
    for (int s = 0; s < fs->n_slots; s++)
        if (fs->slot[s].block == block && fs->slot[s].version == fs->version) return s;
    return -1;
}

/* Buffer s's side-queue gather, if any, is done before the main queue touches it. */
static int settle(struct olmo_fsdp *fs, int s) {
    if (!fs->slot[s].pending) return 0;
    fs->slot[s].pending = false;
    return fs->m->be->side_wait(fs->m->be, s);
}

/* The master weights change (an optimizer step, a load): no buffer holds the current weights. */
static int weights_changed(struct olmo_fsdp *fs) {
    for (int s = 0; s < fs->n_slots; s++) TRY(settle(fs, s)); /* no side gather still reads the old ones */
    fs->version++;
    fs->root_valid = false;
    return 0;
}

/* Gathers `block` into buffer s: on the main queue, or (side) on the side queue, to be waited for by
 * settle(s) before use.  The buffer holds nothing while the gather is under way, so a failed one leaves
 * no stale claim. */
static int fill_slot(struct olmo_fsdp *fs, int s, int block, bool side) {
    const struct olmo_backend *be = fs->m->be;
    struct olmo_fsdp_slot *sl = &fs->slot[s];
    TRY(settle(fs, s));
    sl->block = -1;
    if (side) {
        TRY(be->side_begin(be));
        sl->pending = true; /* side work may be queued from here on, even if the gather fails */
    }
    const int rc = gather_region(fs, 1 + block, sl->w, sl->c);
    if (side) TRY(be->side_end(be, s)); /* back on the main queue even when the gather failed */
    TRY(rc);
    sl->block = block;
    sl->version = fs->version;
    if (side) fs->prefetches++;
    else fs->gathers++;
    return 0;
}

static int acquire(void *ctx, struct olmo_model *m, int unit, bool backward) {
    struct olmo_fsdp *fs = ctx;
    const struct olmo_backend *be = m->be;
    const int last = fs->n_regions - 1;
    if (unit == OLMO_UNIT_ROOT) {
        if (!fs->root_valid) {
            TRY(gather_region(fs, 0, fs->root_w[0], fs->root_c[0]));
            TRY(gather_region(fs, last, fs->root_w[1], fs->root_c[1]));
            fs->root_valid = true;
        }
        const size_t tail = fs->regions[last].start;
        const struct olmo_param *norm = &m->params[m->n_tensors - 2], *head = &m->params[m->n_tensors - 1];
        m->embed = fs->root_w[0];
        m->final_norm = fs->root_w[1] + (norm->offset - tail);
        m->lm_head = fs->root_w[1] + (head->offset - tail);
        m->d_embed = fs->root_g[0];
        m->d_final_norm = fs->root_g[1] + (norm->offset - tail);
        m->d_lm_head = fs->root_g[1] + (head->offset - tail);
        set_window(m, 0, fs->root_w[0], fs->regions[0].len, fs->root_c[0]);
        set_window(m, 1, fs->root_w[1], fs->regions[last].len, fs->root_c[1]);
        if (backward) {
            TRY(grads_settle_all(fs)); /* the previous backward pass's reduce-scatters read root_g */
            TRY(be->zero(be, fs->root_g[0], region_alloc(fs, 0) * sizeof(float)));
            TRY(be->zero(be, fs->root_g[1], region_alloc(fs, last) * sizeof(float)));
        }
        return 0;
    }
    const int L = fs->n_regions - 2;
    int s = slot_holding(fs, unit);
    if (s >= 0) {
        TRY(settle(fs, s));
    } else { /* not held: gather it now, on the main queue */
        s = fs->next_slot;
        TRY(fill_slot(fs, s, unit, false));
    }
    fs->next_slot = (s + 1) % fs->n_slots; /* the other buffer: the one not in use */
    struct olmo_fsdp_slot *sl = &fs->slot[s];
    float *g = NULL;
    if (backward) { /* a gradient buffer no reduce-scatter still reads: the one not used by the last block */
        fs->grad_buf = (fs->grad_buf + 1) % fs->n_grad_bufs;
        TRY(grads_settle(fs, fs->grad_buf));
        g = fs->blk_g[fs->grad_buf];
        TRY(be->zero(be, g, region_alloc(fs, 1 + unit) * sizeof(float)));
    }
    olmo_model_bind_layer(m, unit, sl->w, backward ? g : fs->blk_g[fs->grad_buf]);
    set_window(m, 2, sl->w, fs->regions[1 + unit].len, sl->c);
    /* the block this pass needs next, into the other buffer on the side queue: it is gathered while
     * this one computes (the side queue starts after everything queued so far, the last use of that
     * buffer included) */
    const int next = backward ? unit - 1 : unit + 1;
    if (fs->n_slots == 2 && next >= 0 && next < L && slot_holding(fs, next) < 0)
        TRY(fill_slot(fs, fs->next_slot, next, true));
    return 0;
}

static int release(void *ctx, struct olmo_model *m, int unit, bool backward) {
    struct olmo_fsdp *fs = ctx;
    if (unit == OLMO_UNIT_ROOT) { /* stays gathered (until the next optimizer step) */
        if (backward) { /* the end of the backward pass: the gradient shard is complete after these */
            TRY(reduce_scatter_region(fs, 0, fs->root_g[0], 0));
            TRY(reduce_scatter_region(fs, fs->n_regions - 1, fs->root_g[1], 1));
            TRY(grads_settle_all(fs));
        }
        return 0;
    }
    if (backward) TRY(reduce_scatter_region(fs, 1 + unit, fs->blk_g[fs->grad_buf], fs->grad_buf));
    /* the buffer belongs to the next block now: nothing may reach this one through stale pointers */
    olmo_model_bind_layer(m, unit, NULL, NULL);
    m->win[2] = (struct olmo_weight_window){0};
    return 0;
}

static size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

/* A matrix read by the GEMMs through its compute copy travels in the compute type; the embeddings (read
 * by the lookup in fp32) and norm weights in fp32. */
static bool gathered_low(const struct olmo_backend *be, const struct olmo_param *p) {
    return be->compute_dtype != OLMO_F32 && p->cols > 1 && !p->is_embedding;
}

int olmo_fsdp_create(struct olmo_fsdp *fs, struct olmo_model *m, struct olmo_optimizer *opt,
                     const struct olmo_dist *dist, int shard_degree) {
    memset(fs, 0, sizeof *fs);
    fs->shard_group.world = fs->replica_group.world = 1;
    fs->m = m;
    const struct olmo_backend *be = m->be;
    const int world = dist ? dist->world : 1, rank = dist ? dist->rank : 0;
    if (!m->sharded) return olmo_error("fully sharded training needs a model created with olmo_model_create_sharded");
    fs->device = !be->host_memory;
    if (world > 1 && fs->device && !be->comm_group_create)
        return olmo_error("backend '%s' keeps its buffers on the device and this build has no collective library "
                          "for it (NCCL): it cannot train fully sharded over %d ranks",
                          be->name, world);
    const int G = shard_degree ? shard_degree : world;
    if (G > world || world % G)
        return olmo_error("train.shard_degree %d must divide the number of ranks (%d)", shard_degree, world);
    if (dist) {
        /* shard groups: consecutive ranks; replica groups: the same position in every shard group */
        TRY(olmo_dist_split(dist, rank / G, rank, &fs->shard_group));
        TRY(olmo_dist_split(dist, rank % G, rank, &fs->replica_group));
    }
    /* every rank creates its shard group's communicators, then its replica group's (group sizes are
     * the same on every rank, so all skip or all create).  OLMOC_FSDP_COMM=1: a group of one rank gets
     * them too, so one GPU runs the collectives (NCCL with one rank) instead of skipping them */
    const char *force = getenv("OLMOC_FSDP_COMM");
    const bool one = force && !strcmp(force, "1") && fs->device && be->comm_group_create;
    if (fs->device && (fs->shard_group.world > 1 || one) &&
        (!(fs->shard_comm = be->comm_group_create(be, &fs->shard_group)) ||
         !(fs->rs_comm = be->comm_group_create(be, &fs->shard_group))))
        return olmo_error_context("the shard group's communicators");
    if (fs->device && fs->replica_group.world > 1 &&
        !(fs->replica_comm = be->comm_group_create(be, &fs->replica_group)))
        return olmo_error_context("the replica group's communicator");
    const int g = fs->shard_group.rank;
    const int L = m->cfg.n_layers;
    /* regions: the embeddings, each block, the final norm + LM head; each cut into units of one kind */
    fs->n_regions = L + 2;
    fs->regions = olmo_calloc((size_t)fs->n_regions, sizeof *fs->regions, "shard regions");
    fs->units = olmo_calloc((size_t)m->n_tensors, sizeof *fs->units, "shard units");
    opt->ranges = olmo_calloc((size_t)m->n_tensors, sizeof *opt->ranges, "shard ranges");
    if (!fs->regions || !fs->units || !opt->ranges) return -1;
    const struct olmo_param *norm = &m->params[m->n_tensors - 2];
    fs->regions[0] = (struct olmo_fsdp_region){.start = 0, .len = m->params[0].numel};
    for (int l = 0; l < L; l++) olmo_model_layer_span(m, l, &fs->regions[1 + l].start, &fs->regions[1 + l].len);
    fs->regions[L + 1] = (struct olmo_fsdp_region){.start = norm->offset, .len = m->n_floats - norm->offset};
    int region = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct olmo_param *p = &m->params[i];
        while (p->offset >= fs->regions[region].start + fs->regions[region].len) region++;
        struct olmo_fsdp_region *rg = &fs->regions[region];
        struct olmo_fsdp_unit *prev = fs->n_units ? &fs->units[fs->n_units - 1] : NULL;
        const bool low = gathered_low(be, p);
        if (prev && prev->region == region && prev->low == low) {
            prev->len += p->numel;
            continue;
        }
        if (!rg->n_units) rg->first = fs->n_units;
        rg->n_units++;
        fs->units[fs->n_units++] = (struct olmo_fsdp_unit){.start = p->offset, .len = p->numel, .region = region,
                                                           .low = low};
    }
    size_t max_shard = 0, max_block = 0;
    opt->n_ranges = 0;
    for (int u = 0; u < fs->n_units; u++) {
        struct olmo_fsdp_unit *un = &fs->units[u];
        un->shard = div_up(un->len, (size_t)G);
        un->my_lo = (size_t)g * un->shard;
        un->my_len = un->my_lo >= un->len ? 0 : (un->len - un->my_lo < un->shard ? un->len - un->my_lo : un->shard);
        un->local = fs->n_local;
        fs->n_local += un->my_len;
        if (un->my_len)
            opt->ranges[opt->n_ranges++] =
                (struct olmo_shard_range){.global = un->start + un->my_lo, .local = un->local, .len = un->my_len};
        if (un->shard > max_shard) max_shard = un->shard;
    }
    for (int l = 0; l < L; l++)
        if (region_alloc(fs, 1 + l) > max_block) max_block = region_alloc(fs, 1 + l);
    opt->n_local = fs->n_local;
    opt->lo = opt->hi = 0; /* no single slice: see opt->ranges */
    opt->primary = fs->replica_group.rank == 0;
    const size_t n_alloc = fs->n_local ? fs->n_local : 1;
    fs->master = be->alloc(be, n_alloc * sizeof(float));
    fs->grad = be->alloc(be, n_alloc * sizeof(float));
    opt->m = be->alloc(be, n_alloc * sizeof(float));
    opt->v = be->alloc(be, n_alloc * sizeof(float));
    if (!max_block) max_block = 1;
    fs->rs_out = be->alloc(be, max_shard * sizeof(float));
    /* two block-gradient buffers where the backend can reduce-scatter on a gradient queue */
    fs->grad_queue = be->grad_begin && be->grad_end && be->grad_wait;
    fs->n_grad_bufs = fs->grad_queue ? 2 : 1;
    for (int i = 0; i < fs->n_grad_bufs; i++)
        if (!(fs->blk_g[i] = be->alloc(be, max_block * sizeof(float)))) return olmo_error_context("block gradients");
    if (!fs->master || !fs->grad || !opt->m || !opt->v || !fs->rs_out)
        return olmo_error_context("fully sharded buffers");
    /* two block buffers where the backend can gather the next block on a side queue */
    fs->n_slots = be->side_begin && be->side_end && be->side_wait ? 2 : 1;
    for (int s = 0; s < fs->n_slots; s++) {
        fs->slot[s].block = -1;
        if (!(fs->slot[s].w = be->alloc(be, max_block * sizeof(float))))
            return olmo_error_context("gathered block");
        if (has_compute_copy(be) && !(fs->slot[s].c = be->alloc(be, max_block * elem_size(be))))
            return olmo_error_context("gathered block (compute copy)");
    }
    if (be->zero(be, opt->m, n_alloc * sizeof(float)) || be->zero(be, opt->v, n_alloc * sizeof(float)) ||
        be->zero(be, fs->master, n_alloc * sizeof(float)))
        return -1;
    for (int i = 0; i < 2; i++) {
        const size_t n = region_alloc(fs, i ? L + 1 : 0);
        fs->root_w[i] = be->alloc(be, n * sizeof(float));
        fs->root_g[i] = be->alloc(be, n * sizeof(float));
        if (!fs->root_w[i] || !fs->root_g[i]) return olmo_error_context("gathered root weights");
        if (has_compute_copy(be) && !(fs->root_c[i] = be->alloc(be, n * elem_size(be))))
            return olmo_error_context("gathered root weights (compute copy)");
    }
    opt->master = fs->master;
    fs->hooks = (struct olmo_unit_hooks){.ctx = fs, .acquire = acquire, .release = release};
    m->hooks = &fs->hooks;
    return 0;
}

void olmo_fsdp_destroy(struct olmo_fsdp *fs, struct olmo_optimizer *opt) {
    if (!fs->m) return;
    const struct olmo_backend *be = fs->m->be;
    if (be->synchronize) be->synchronize(be); /* no side- or gradient-queue work still uses a buffer */
    float *bufs[] = {fs->master, fs->grad, fs->rs_out, fs->blk_g[0], fs->blk_g[1],
                     fs->root_w[0], fs->root_w[1], fs->root_g[0], fs->root_g[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    be->free(be, fs->root_c[0]);
    be->free(be, fs->root_c[1]);
    for (int s = 0; s < fs->n_slots; s++) {
        be->free(be, fs->slot[s].w);
        be->free(be, fs->slot[s].c);
    }
    if (opt) opt->master = NULL;
    fs->m->hooks = NULL;
    fs->m->n_win = 0;
    free(fs->units);
    free(fs->regions);
    if (fs->shard_comm) be->comm_group_destroy(be, fs->shard_comm);
    if (fs->rs_comm) be->comm_group_destroy(be, fs->rs_comm);

    if (fs->replica_comm) be->comm_group_destroy(be, fs->replica_comm);
    olmo_dist_free_group(&fs->shard_group);
    olmo_dist_free_group(&fs->replica_group);
    memset(fs, 0, sizeof *fs);
}

int olmo_fsdp_zero_grads(struct olmo_fsdp *fs) {
    TRY(grads_settle_all(fs)); /* a failed step's reduce-scatters may still add to the shard */
    return fs->n_local ? fs->m->be->zero(fs->m->be, fs->grad, fs->n_local * sizeof(float)) : 0;
}

int olmo_fsdp_sync_replicas(struct olmo_fsdp *fs) {
    TRY(grads_settle_all(fs));
    return replica_allreduce(fs, fs->grad, fs->n_local);
}

int olmo_fsdp_grad_norm(struct olmo_fsdp *fs, double *norm) {
    double ss = 0.0;
    if (fs->n_local) TRY(fs->m->be->sum_squares(fs->m->be, fs->grad, fs->n_local, &ss));
    /* replicas hold the same shards after olmo_fsdp_sync_replicas: sum within the shard group only */
    TRY(olmo_dist_allreduce_f64(&fs->shard_group, &ss, 1));
    *norm = sqrt(ss);
    return 0;
}

static int clip(struct olmo_fsdp *fs, double norm, double max_norm) {
    if (!fs->n_local) return 0;
    const float scale = olmo_clip_scale(norm, max_norm);
    return scale != 1.0f ? fs->m->be->scale(fs->m->be, fs->grad, fs->n_local, scale) : 0;
}

static int step(struct olmo_fsdp *fs, struct olmo_optimizer *opt, const struct olmo_train_config *t, double lr) {
    const struct olmo_backend *be = fs->m->be;
    TRY(weights_changed(fs));
    opt->step++;
    const long bias_step = olmo_optimizer_bias_step(opt, t); /* train.optim_init_step, step_increment_bugfix */
    for (int u = 0; u < fs->n_units; u++) {
        const struct olmo_fsdp_unit *un = &fs->units[u];
        if (!un->my_len) continue;
        /* region 0 is exactly the embedding matrix, the one tensor with its own weight decay */
        const double wd = un->region == 0 ? t->embedding_weight_decay : t->weight_decay;
        TRY(be->adamw(be, fs->master + un->local, fs->grad + un->local, opt->m + un->local, opt->v + un->local,
                      un->my_len, lr, (float)t->beta1, (float)t->beta2, (float)t->eps, wd, bias_step));
    }
    return 0;
}

/* The local pieces of the embedding's units (region 0) as one range of the local shard: true, with
 * [*lo, *hi) (empty when this rank holds none of it), when they are contiguous there. */
static bool embedding_range(const struct olmo_fsdp *fs, size_t *lo, size_t *hi) {
    *lo = *hi = 0;
    bool any = false;
    for (int u = 0; u < fs->n_units; u++) {
        const struct olmo_fsdp_unit *un = &fs->units[u];
        if (un->region != 0 || !un->my_len) continue;
        if (any && un->local != *hi) return false;
        if (!any) *lo = un->local;
        *hi = un->local + un->my_len;
        any = true;
    }
    return true;
}

int olmo_fsdp_clip_step(struct olmo_fsdp *fs, struct olmo_optimizer *opt, const struct olmo_train_config *t,
                        double lr, double norm) {
    const struct olmo_backend *be = fs->m->be;
    size_t lo, hi;
    if (!be->adamw_flat || !fs->n_local || !embedding_range(fs, &lo, &hi))
        return clip(fs, norm, t->clip_grad_norm) || step(fs, opt, t, lr) ? -1 : 0;
    TRY(weights_changed(fs));
    opt->step++;
    /* the units' pieces are consecutive in the local shard (olmo_fsdp_create): one pass over all of them */
    const struct olmo_adamw_flat f = {.weight_decay = t->weight_decay, .weight_decay2 = t->embedding_weight_decay,
                                      .wd2_lo = lo, .wd2_hi = hi, .grad_scale = olmo_clip_scale(norm, t->clip_grad_norm)};
    return be->adamw_flat(be, fs->master, fs->grad, opt->m, opt->v, fs->n_local, lr, (float)t->beta1,
                          (float)t->beta2, (float)t->eps, &f, olmo_optimizer_bias_step(opt, t));
}

int olmo_fsdp_master_updated(struct olmo_fsdp *fs) { return weights_changed(fs); }

/* This rank's pieces of one freshly initialised tensor. */
static int put_tensor(void *ctx, const struct olmo_param *p, const float *w) {
    struct olmo_fsdp *fs = ctx;
    const struct olmo_backend *be = fs->m->be;
    for (int u = 0; u < fs->n_units; u++) {
        const struct olmo_fsdp_unit *un = &fs->units[u];
        const size_t a = un->start + un->my_lo, b = a + un->my_len; /* my piece, flat */
        const size_t lo = a > p->offset ? a : p->offset, hi = b < p->offset + p->numel ? b : p->offset + p->numel;
        if (lo < hi)
            TRY(be->to_device(be, fs->master + un->local + (lo - a), w + (lo - p->offset), (hi - lo) * sizeof(float)));
    }
    return 0;
}

int olmo_fsdp_init_weights(struct olmo_fsdp *fs, uint64_t seed) {
    size_t largest = 0;
    for (int i = 0; i < fs->m->n_tensors; i++)
        if (fs->m->params[i].numel > largest) largest = fs->m->params[i].numel;
    TRY(weights_changed(fs));
    float *scratch = olmo_malloc(largest * sizeof(float), "initial weights (one tensor)");
    if (!scratch) return -1;
    const int rc = olmo_model_init_each(fs->m, seed, scratch, put_tensor, fs);
    free(scratch);
    return rc;
}
