/* plan_api.c — deepwell.h's planner handles over the private planner (plan.h): dw_plan (one
 * layout with the model, machine and job it was made for, its predictions and its checks) and
 * dw_plan_set (a search's candidates and rejections). Each handle owns copies of what it reads,
 * so callers may free the hardware and options they passed. Not the cost model or the search. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/sized.h"
#include "plan/plan.h"
#include "plan/plan_handle.h"

static const dw_plan_job JOB_DEFAULTS = {.size = sizeof(dw_plan_job), .recipe = DW_RECIPE_BF16, .top_k = 5};

void dw_plan_job_init(dw_plan_job *job, size_t size) {
    if (job) dw_sized_init(job, size, &JOB_DEFAULTS, sizeof JOB_DEFAULTS);
}

static dw_status read_job(dw_ctx *ctx, const dw_plan_job *pub, dw_plan_job *full) {
    *full = JOB_DEFAULTS;
    if (!pub) return dw_set_error(ctx, DW_ERR_INVALID, "planner: NULL job");
    if (!dw_sized_read(full, sizeof *full, pub))
        return dw_set_error(ctx, DW_ERR_INVALID, "planner: job size is 0 (call dw_plan_job_init)");
    return DW_OK;
}

static void env_free(plan_env *env) {
    free(env->model);
    dw_hw_free(env->hw);
    dw_gemm_table_free(&env->gemm);
    memset(env, 0, sizeof *env);
}

static dw_status env_load(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job, plan_env *env) {
    memset(env, 0, sizeof *env);
    if (!model) return dw_set_error(ctx, DW_ERR_INVALID, "missing model (a preset name or a directory)");
    if (!hw) return dw_set_error(ctx, DW_ERR_INVALID, "missing hardware (dw_probe, dw_hw_preset or dw_hw_load)");
    DW_TRY(dw_model_config_load(ctx, model, &env->cfg));
    env->model = strdup(model);
    env->hw = dw_hw_dup(hw);
    if (!env->model || !env->hw) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (job->gemm_rates) {
        DW_TRY(dw_gemm_table_load(ctx, job->gemm_rates, &env->gemm));
        env->has_gemm = true;
    }
    dw_job j = {.seq = job->seq, .global_batch = job->global_batch, .recipe = (dw_recipe)job->recipe,
                .moe_experts = job->moe_experts, .moe_top_k = job->moe_top_k, .moe_capacity = job->moe_capacity,
                .mem_headroom = job->mem_headroom};
    return dw_plan_in_init(ctx, &env->cfg, env->hw, &j, env->has_gemm ? &env->gemm : NULL, &env->in);
}

static dw_status env_copy(dw_ctx *ctx, const plan_env *src, plan_env *dst) {
    memset(dst, 0, sizeof *dst);
    dst->cfg = src->cfg;
    dst->model = strdup(src->model);
    dst->hw = dw_hw_dup(src->hw);
    dst->has_gemm = src->has_gemm;
    if (src->has_gemm && src->gemm.n > 0) {
        dst->gemm.pts = malloc((size_t)src->gemm.n * sizeof *dst->gemm.pts);
        if (dst->gemm.pts) {
            memcpy(dst->gemm.pts, src->gemm.pts, (size_t)src->gemm.n * sizeof *dst->gemm.pts);
            dst->gemm.n = src->gemm.n;
        }
    }
    if (!dst->model || !dst->hw || (src->gemm.n > 0 && !dst->gemm.pts))
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dst->in = src->in;
    dst->in.cfg = &dst->cfg;
    dst->in.hw = dst->hw;
    dst->in.gemm = dst->has_gemm ? &dst->gemm : NULL;
    return DW_OK;
}

/* Summary, checks, predictions (`known` when the search already made them) of p->par. */
static void finish(dw_plan *p, const dw_plan_entry *known) {
    dw_par_format(&p->par, p->summary, sizeof p->summary);
    const dw_plan_in *in = &p->env.in;
    p->seq = in->job.seq, p->global_batch = in->job.global_batch, p->recipe = in->job.recipe;
    int n = dw_plan_check(in, &p->par, p->why, sizeof p->why);
    if (n == 1 && strncmp(p->why, "memory:", 7) == 0) n = 0, p->why[0] = 0; /* the memory check's own */
    p->violations = n;
    if (n == 0) {
        if (known) {
            p->e = *known;
        } else {
            dw_plan_memory(in, &p->par, &p->e.mem);
            dw_plan_time(in, &p->par, &p->e, NULL);
        }
        p->e.par = p->par;
    }
    p->engine_ok = dw_plan_engine_runnable(in, &p->par, p->engine_why, sizeof p->engine_why);
}

/* ---- searching ------------------------------------------------------------------------------ */

dw_status dw_autoplan_search(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job,
                             dw_plan_set **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_autoplan_search: NULL out");
    *out = NULL;
    dw_plan_job j;
    DW_TRY(read_job(ctx, job, &j));
    dw_plan_set *s = calloc(1, sizeof *s);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_status st = env_load(ctx, model, hw, &j, &s->env);
    if (st == DW_OK) st = dw_plan_search(ctx, &s->env.in, j.top_k, &s->r);
    if (st != DW_OK) {
        dw_plan_set_free(s);
        return st;
    }
    *out = s;
    return DW_OK;
}

dw_status dw_autoplan(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job, dw_plan **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_autoplan: NULL out");
    *out = NULL;
    dw_plan_job j;
    DW_TRY(read_job(ctx, job, &j));
    j.top_k = 1; /* the best is the same whatever the number kept */
    dw_plan_set *s = NULL;
    DW_TRY(dw_autoplan_search(ctx, model, hw, &j, &s));
    dw_status st = s->r.n_plans > 0
                       ? dw_plan_set_get(ctx, s, 0, out)
                       : dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                                      "no configuration fits %s on %lld GPU(s): all %lld configurations searched "
                                      "were rejected (dw_autoplan_search lists the reasons)",
                                      model, (long long)s->env.in.n_gpus, (long long)s->r.evaluated);
    dw_plan_set_free(s);
    return st;
}

static dw_status dump(dw_ctx *ctx, json_t *doc, bool pretty, char **out) {
    char *text = doc ? dw_json_dump(doc, pretty) : NULL;
    json_decref(doc);
    if (!text) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory building the plan JSON");
    *out = text;
    return DW_OK;
}

dw_status dw_autoplan_json(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job, int top_k,
                           char **json_out) {
    if (!json_out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_autoplan_json: NULL out");
    *json_out = NULL;
    dw_plan_job j;
    DW_TRY(read_job(ctx, job, &j));
    j.top_k = top_k;
    dw_plan_set *s = NULL;
    DW_TRY(dw_autoplan_search(ctx, model, hw, &j, &s));
    dw_status st = dw_plan_set_to_json(ctx, s, false, json_out);
    dw_plan_set_free(s);
    return st;
}

void dw_plan_set_free(dw_plan_set *s) {
    if (!s) return;
    env_free(&s->env);
    dw_plan_result_free(&s->r);
    free(s);
}

int dw_plan_set_count(const dw_plan_set *s) { return s ? s->r.n_plans : 0; }

void dw_plan_set_stats(const dw_plan_set *s, int64_t *evaluated, int64_t *feasible) {
    if (evaluated) *evaluated = s ? s->r.evaluated : 0;
    if (feasible) *feasible = s ? s->r.feasible : 0;
}

dw_status dw_plan_set_get(dw_ctx *ctx, const dw_plan_set *s, int i, dw_plan **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_set_get: NULL out");
    *out = NULL;
    if (!s || i < 0 || i >= s->r.n_plans)
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_set_get: candidate %d of %d", i, s ? s->r.n_plans : 0);
    dw_plan *p = calloc(1, sizeof *p);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    p->bound = true;
    dw_status st = env_copy(ctx, &s->env, &p->env);
    if (st != DW_OK) {
        dw_plan_free(p);
        return st;
    }
    p->par = s->r.plans[i].par;
    finish(p, &s->r.plans[i]);
    *out = p;
    return DW_OK;
}

dw_status dw_plan_set_to_json(dw_ctx *ctx, const dw_plan_set *s, bool pretty, char **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_set_to_json: NULL out");
    *out = NULL;
    if (!s) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_set_to_json: NULL set");
    return dump(ctx, dw_plan_result_json(&s->env.in, &s->r), pretty, out);
}

int dw_plan_reject_reasons(void) { return DW_REJECT_COUNT; }

const char *dw_plan_reject_name(int reason) {
    return reason >= 0 && reason < DW_REJECT_COUNT ? dw_reject_name((dw_reject)reason) : NULL;
}

int64_t dw_plan_set_rejected(const dw_plan_set *s, int reason, int *examples) {
    bool ok = s && reason >= 0 && reason < DW_REJECT_COUNT;
    if (examples) *examples = ok ? s->r.rej.n_examples[reason] : 0;
    return ok ? s->r.rej.count[reason] : 0;
}

const char *dw_plan_set_reject_example(const dw_plan_set *s, int reason, int i) {
    if (!s || reason < 0 || reason >= DW_REJECT_COUNT || i < 0 || i >= s->r.rej.n_examples[reason]) return NULL;
    return s->r.rej.example[reason][i];
}

/* ---- plans without a search ------------------------------------------------------------------ */

dw_status dw_plan_single(dw_ctx *ctx, int64_t micro_batch, int64_t seq, dw_plan **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_single: NULL out");
    *out = NULL;
    if (micro_batch < 1 || seq < 1)
        return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_single: micro-batch %lld and sequence %lld must be >= 1",
                            (long long)micro_batch, (long long)seq);
    dw_plan *p = calloc(1, sizeof *p);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    p->par = (dw_par){.dp = 1, .tp = 1, .pp = 1, .ep = 1, .cp = 1, .vpp = 1, .micro_batch = micro_batch,
                      .grad_accum = 1, .sched = DW_SCHED_1F1B, .recompute = DW_RECOMPUTE_NONE};
    p->seq = seq, p->global_batch = micro_batch, p->recipe = DW_RECIPE_BF16;
    dw_par_format(&p->par, p->summary, sizeof p->summary);
    snprintf(p->engine_why, sizeof p->engine_why, "the plan has no model (made by dw_plan_single)");
    *out = p;
    return DW_OK;
}

/* A plan bound to model, hw and job, its layout still to be read. */
static dw_status new_bound(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job, dw_plan **out) {
    *out = NULL;
    dw_plan_job j;
    DW_TRY(read_job(ctx, job, &j));
    dw_plan *p = calloc(1, sizeof *p);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    p->bound = true;
    dw_status st = env_load(ctx, model, hw, &j, &p->env);
    if (st != DW_OK) {
        dw_plan_free(p);
        return st;
    }
    *out = p;
    return DW_OK;
}

/* Reads the layout from a parsed document (takes the reference j), then checks and predicts. */
static dw_status adopt(dw_ctx *ctx, dw_plan *p, json_t *j, const char *what) {
    dw_status st = dw_par_from_json(ctx, j, what, &p->par);
    json_decref(j);
    if (st != DW_OK) return st;
    if (p->par.grad_accum == 0) { /* not given: what the job's batch implies, when it divides */
        int64_t per = (int64_t)p->par.dp * p->par.micro_batch, G = p->env.in.job.global_batch;
        p->par.grad_accum = per > 0 && G % per == 0 ? G / per : 0;
    }
    finish(p, NULL);
    return DW_OK;
}

dw_status dw_plan_from_json(dw_ctx *ctx, const char *text, size_t len, const char *what, const char *model,
                            const dw_hw *hw, const dw_plan_job *job, dw_plan **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_from_json: NULL out");
    *out = NULL;
    if (!text) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_from_json: NULL text");
    if (!what) what = "plan";
    dw_plan *p = NULL;
    DW_TRY(new_bound(ctx, model, hw, job, &p));
    json_t *j = NULL;
    dw_status st = dw_json_load_string(ctx, text, len, what, &j);
    if (st == DW_OK) st = adopt(ctx, p, j, what);
    if (st != DW_OK) dw_plan_free(p);
    else *out = p;
    return st;
}

dw_status dw_plan_load(dw_ctx *ctx, const char *path, const char *model, const dw_hw *hw, const dw_plan_job *job,
                       dw_plan **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_load: NULL out");
    *out = NULL;
    if (!path) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_load: NULL path");
    dw_plan *p = NULL;
    DW_TRY(new_bound(ctx, model, hw, job, &p));
    json_t *j = NULL;
    dw_status st = dw_json_load_file(ctx, path, &j);
    if (st == DW_OK) st = adopt(ctx, p, j, path);
    if (st != DW_OK) dw_plan_free(p);
    else *out = p;
    return st;
}

dw_status dw_plan_to_json(dw_ctx *ctx, const dw_plan *p, bool pretty, char **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_to_json: NULL out");
    *out = NULL;
    if (!p) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_to_json: NULL plan");
    json_t *o = dw_par_json(&p->par);
    if (p->bound && p->violations == 0) dw_plan_entry_add_predictions(o, &p->e);
    json_object_set_new(o, "job", json_pack("{s:I, s:I, s:s}", "seq", (json_int_t)p->seq, "global_batch",
                                            (json_int_t)p->global_batch, "precision", dw_recipe_name(p->recipe)));
    return dump(ctx, o, pretty, out);
}

void dw_plan_free(dw_plan *p) {
    if (!p) return;
    env_free(&p->env);
    free(p);
}

/* ---- reading a plan --------------------------------------------------------------------------- */

/* Copies the library's full result struct `full` (n bytes) into the caller's, refusing an unset
 * size; `fn` names the public function in the message. */
static dw_status write_out(dw_ctx *ctx, const char *fn, void *out, const void *full, size_t n) {
    return dw_sized_write(out, full, n) ? DW_OK
                                        : dw_set_error(ctx, DW_ERR_INVALID, "%s: out->size is 0 (set it to sizeof the struct)", fn);
}
#define WRITE_OUT(fn, out, full) write_out(NULL, fn, out, &(full), sizeof(full))

const char *dw_plan_schedule(const dw_plan *p) { return dw_sched_name(p ? p->par.sched : DW_SCHED_1F1B); }

static void info_of(const plan_env *env, dw_plan_info *i) {
    const dw_plan_in *in = &env->in;
    const dw_hw *hw = env->hw;
    dw_param_counts pc;
    dw_plan_params(in, &pc);
    i->model = env->model;
    i->model_type = env->cfg.model_type;
    i->params = pc.total;
    i->model_flops_per_token = dw_plan_model_flops_per_token(in);
    i->experts = in->experts;
    i->top_k = in->experts ? in->top_k : 0;
    i->moe_capacity = in->capacity;
    i->gpu = hw->gpus[0].name;
    i->hw_source = hw->source;
    i->nodes = hw->nodes, i->gpus_per_node = hw->n_gpus, i->nvlink_domain = hw->nvlink_domain;
    i->gpus = in->n_gpus;
    i->seq = in->job.seq, i->global_batch = in->job.global_batch, i->recipe = (int32_t)in->job.recipe;
    i->mem_headroom = in->job.mem_headroom;
    i->peak_flops = dw_plan_peak_flops(&hw->gpus[0], in->job.recipe);
    i->engine = in->n_gpus == 1 && in->engine_model;
}

dw_status dw_plan_get_info(const dw_plan *p, dw_plan_info *out) {
    if (!p || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_info: NULL argument");
    dw_plan_info i = {.size = sizeof i, .seq = p->seq, .global_batch = p->global_batch, .recipe = (int32_t)p->recipe};
    if (p->bound) info_of(&p->env, &i);
    return WRITE_OUT("dw_plan_get_info", out, i);
}

dw_status dw_plan_set_get_info(const dw_plan_set *s, dw_plan_info *out) {
    if (!s || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_set_get_info: NULL argument");
    dw_plan_info i = {.size = sizeof i};
    info_of(&s->env, &i);
    return WRITE_OUT("dw_plan_set_get_info", out, i);
}

dw_status dw_plan_get_memory(const dw_plan *p, dw_plan_mem *out) {
    if (!out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_memory: NULL out");
    dw_sized_clear(out);
    DW_TRY(dw_plan_predicted("dw_plan_get_memory", p));
    dw_plan_mem m = p->e.mem;
    m.size = sizeof m;
    return WRITE_OUT("dw_plan_get_memory", out, m);
}

dw_status dw_plan_get_cost(const dw_plan *p, dw_plan_cost *out) {
    if (!out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_cost: NULL out");
    dw_sized_clear(out);
    DW_TRY(dw_plan_predicted("dw_plan_get_cost", p));
    dw_plan_cost c = p->e.cost;
    c.size = sizeof c;
    return WRITE_OUT("dw_plan_get_cost", out, c);
}

/* The dryrun thresholds: communication the schedule cannot hide, and pipeline idle time, each at
 * most half of the step. */
#define MAX_EXPOSED_COMM 0.5
#define MAX_BUBBLE 0.5

dw_status dw_plan_get_checks(const dw_plan *p, dw_plan_checks *out) {
    if (!p || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_plan_get_checks: NULL argument");
    dw_sized_clear(out);
    if (!p->bound)
        return dw_set_error(NULL, DW_ERR_INVALID,
                            "dw_plan_get_checks: the plan has no model or machine (dw_plan_single)");
    dw_plan_checks c = {.size = sizeof c, .violations = p->violations, .why = p->why,
                        .constraints_ok = p->violations == 0};
    if (c.constraints_ok) {
        const dw_cost *k = &p->e.cost;
        double hidden = k->tp_comm + k->cp_comm + k->ep_comm + k->pp_comm + k->dp_exposed;
        c.memory_ok = p->e.mem.total <= p->e.mem.limit;
        c.overlap = k->step > 0 ? hidden / k->step : 0;
        c.overlap_ok = c.overlap <= MAX_EXPOSED_COMM;
        c.bubble_ok = k->bubble_frac <= MAX_BUBBLE;
    }
    return WRITE_OUT("dw_plan_get_checks", out, c);
}

/* ---- Deepwell's engine ------------------------------------------------------------------------ */

bool dw_plan_runs_on_engine(const dw_plan *p, const char **why) {
    if (why) *why = p ? p->engine_why : "NULL plan";
    return p && p->bound && p->engine_ok;
}

dw_status dw_plan_engine_policy(dw_ctx *ctx, const dw_plan *p, dw_policy **out) {
    if (!out) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_engine_policy: NULL out");
    *out = NULL;
    if (!p) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_engine_policy: NULL plan");
    return dw_plan_recipe_policy(ctx, p->recipe, out);
}

static dw_status engine_runs(dw_ctx *ctx, const char *fn, const dw_plan *p, void *out) {
    if (!p || !out) return dw_set_error(ctx, DW_ERR_INVALID, "%s: NULL argument", fn);
    dw_sized_clear(out);
    if (!dw_plan_runs_on_engine(p, NULL))
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: the engine does not run this plan: %s", fn, p->engine_why);
    return DW_OK;
}

dw_status dw_plan_get_engine_memory(dw_ctx *ctx, const dw_plan *p, dw_plan_engine_mem *out) {
    DW_TRY(engine_runs(ctx, "dw_plan_get_engine_memory", p, out));
    dw_plan_engine_mem m;
    DW_TRY(dw_plan_engine_memory_par(ctx, &p->env.in, &p->par, &m));
    m.size = sizeof m;
    return write_out(ctx, "dw_plan_get_engine_memory", out, &m, sizeof m);
}

dw_status dw_plan_get_engine_cost(dw_ctx *ctx, const dw_plan *p, dw_plan_engine_cost *out) {
    DW_TRY(engine_runs(ctx, "dw_plan_get_engine_cost", p, out));
    dw_plan_engine_cost t;
    DW_TRY(dw_plan_engine_time_par(ctx, &p->env.in, &p->par, &t)); /* launches as the runtime issues them */
    t.size = sizeof t;
    return write_out(ctx, "dw_plan_get_engine_cost", out, &t, sizeof t);
}

dw_status dw_plan_write_svg(dw_ctx *ctx, const dw_plan *p, const char *path) {
    if (!path) return dw_set_error(ctx, DW_ERR_INVALID, "dw_plan_write_svg: NULL path");
    dw_status st = dw_plan_predicted("dw_plan_write_svg", p);
    if (st != DW_OK) return dw_set_error(ctx, st, "%s", dw_errmsg(NULL));
    return dw_pipe_write_svg(ctx, &p->env.in, &p->par, path);
}
