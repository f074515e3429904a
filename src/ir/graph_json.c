/* graph_json.c — the graph's JSON form (schema in docs/ir.md) and loading it back: inputs and
 * parameters are listed as tensors, activations as node outputs; loading re-runs shape
 * inference on every node and compares with the recorded shapes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "ir/float_graph.h"
#include "ir/ir.h"

static json_t *shape_json(const dw_ir_tensor *t) {
    json_t *a = json_array();
    for (int i = 0; i < t->ndim; i++) json_array_append_new(a, json_integer(t->shape[i]));
    return a;
}

/* [v[0], ..., v[n-1]] */
static json_t *reals(const double *v, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* A rope node's parameters beyond the default over the whole head: {"type", "factor", ...}, the
 * fields its type uses, and "rotary_dim" when only part of each head rotates. */
static json_t *rope_json(const dw_rope_scaling *r) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(dw_rope_type_name(r->type)));
    if (r->rotary_dim) json_object_set_new(o, "rotary_dim", json_integer(r->rotary_dim));
    if (r->type == DW_ROPE_DEFAULT) return o;
    if (r->type == DW_ROPE_LONGROPE) {
        json_object_set_new(o, "short_factor", reals(r->short_factor, r->n_factors));
        json_object_set_new(o, "long_factor", reals(r->long_factor, r->n_factors));
        json_object_set_new(o, "original_max_position_embeddings", json_real(r->original_max));
        json_object_set_new(o, "attention_factor", json_real(r->attention_factor));
        return o;
    }
    json_object_set_new(o, "factor", json_real(r->factor));
    if (r->type == DW_ROPE_LINEAR) return o;
    json_object_set_new(o, "original_max_position_embeddings", json_real(r->original_max));
    if (r->type == DW_ROPE_LLAMA3) {
        json_object_set_new(o, "low_freq_factor", json_real(r->low_freq_factor));
        json_object_set_new(o, "high_freq_factor", json_real(r->high_freq_factor));
        return o;
    }
    json_object_set_new(o, "beta_fast", json_real(r->beta_fast));
    json_object_set_new(o, "beta_slow", json_real(r->beta_slow));
    json_object_set_new(o, "attention_factor", json_real(r->attention_factor));
    json_object_set_new(o, "truncate", json_boolean(r->truncate));
    return o;
}

/* longrope's list `key` of o into f (at most DW_ROPE_MAX_FACTORS numbers), its length into *n. */
static dw_status rope_factors(dw_ctx *ctx, const json_t *o, const char *key, const char *what, const char *node,
                              double *f, int32_t *n) {
    const json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || json_array_size(a) > DW_ROPE_MAX_FACTORS)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.rope.%s is not an array of at most %d numbers",
                            what, node, key, DW_ROPE_MAX_FACTORS);
    *n = (int32_t)json_array_size(a);
    for (int32_t i = 0; i < *n; i++) {
        if (!json_is_number(json_array_get(a, (size_t)i)))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.rope.%s[%d] is not a number", what, node,
                                key, (int)i);
        f[i] = json_number_value(json_array_get(a, (size_t)i));
    }
    return DW_OK;
}

static dw_status rope_parse(dw_ctx *ctx, const json_t *o, const char *what, const char *node, dw_rope_scaling *r) {
    if (!json_is_object(o))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.rope is not an object", what, node);
    const char *type = NULL;
    DW_TRY(dw_json_get_str(ctx, o, "type", what, &type));
    r->type = -1;
    for (int32_t t = 0; t < DW_ROPE_TYPE_COUNT; t++)
        if (!strcmp(type, dw_rope_type_name(t))) r->type = t;
    if (r->type < 0)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.rope.type '%s' is not default, linear, llama3, "
                            "yarn or longrope", what, node, type);
    long long rotary = 0;
    DW_TRY(dw_json_get_int_opt(ctx, o, "rotary_dim", what, &rotary));
    if (rotary < 0 || rotary > INT32_MAX)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.rope.rotary_dim %lld", what, node, rotary);
    r->rotary_dim = (int32_t)rotary;
    if (r->type == DW_ROPE_LONGROPE) {
        int32_t n_long = 0;
        DW_TRY(rope_factors(ctx, o, "short_factor", what, node, r->short_factor, &r->n_factors));
        DW_TRY(rope_factors(ctx, o, "long_factor", what, node, r->long_factor, &n_long));
        if (n_long != r->n_factors)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.rope: %d short factors, %d long", what,
                                node, (int)r->n_factors, (int)n_long);
    }
    DW_TRY(dw_json_get_num_opt(ctx, o, "factor", what, &r->factor));
    DW_TRY(dw_json_get_num_opt(ctx, o, "original_max_position_embeddings", what, &r->original_max));
    DW_TRY(dw_json_get_num_opt(ctx, o, "low_freq_factor", what, &r->low_freq_factor));
    DW_TRY(dw_json_get_num_opt(ctx, o, "high_freq_factor", what, &r->high_freq_factor));
    DW_TRY(dw_json_get_num_opt(ctx, o, "beta_fast", what, &r->beta_fast));
    DW_TRY(dw_json_get_num_opt(ctx, o, "beta_slow", what, &r->beta_slow));
    DW_TRY(dw_json_get_num_opt(ctx, o, "attention_factor", what, &r->attention_factor));
    return dw_json_get_bool_opt(ctx, o, "truncate", what, &r->truncate);
}

static json_t *attrs_json(const dw_ir_node *n) {
    json_t *a = json_object();
    if (n->attrs.heads) json_object_set_new(a, "heads", json_integer(n->attrs.heads));
    if (n->attrs.kv_heads) json_object_set_new(a, "kv_heads", json_integer(n->attrs.kv_heads));
    if (n->attrs.head_dim) json_object_set_new(a, "head_dim", json_integer(n->attrs.head_dim));
    if (n->attrs.eps) json_object_set_new(a, "eps", json_real(n->attrs.eps));
    if (n->attrs.theta) json_object_set_new(a, "theta", json_real(n->attrs.theta));
    if (n->attrs.rope.type != DW_ROPE_DEFAULT || n->attrs.rope.rotary_dim)
        json_object_set_new(a, "rope", rope_json(&n->attrs.rope));
    if (n->attrs.experts) json_object_set_new(a, "experts", json_integer(n->attrs.experts));
    if (n->attrs.window) json_object_set_new(a, "window", json_integer(n->attrs.window));
    if (n->attrs.coef) json_object_set_new(a, "coef", json_real(n->attrs.coef));
    if (n->attrs.zcoef) json_object_set_new(a, "zcoef", json_real(n->attrs.zcoef));
    if (n->attrs.softcap) json_object_set_new(a, "softcap", json_real(n->attrs.softcap));
    if (n->attrs.scale) json_object_set_new(a, "scale", json_real(n->attrs.scale));
    if (n->attrs.offset) json_object_set_new(a, "offset", json_real(n->attrs.offset));
    if (n->attrs.has_pad) json_object_set_new(a, "pad", json_integer(n->attrs.pad));
    if (n->attrs.capacity_factor > 0) json_object_set_new(a, "capacity_factor", json_real(n->attrs.capacity_factor));
    if (n->attrs.top_k) {
        json_object_set_new(a, "top_k", json_integer(n->attrs.top_k));
        json_object_set_new(a, "score", json_string(n->attrs.score == DW_ROUTER_SIGMOID ? "sigmoid" : "softmax"));
        json_object_set_new(a, "norm_topk", json_boolean(n->attrs.norm_topk));
        if (n->attrs.n_group) json_object_set_new(a, "n_group", json_integer(n->attrs.n_group));
        if (n->attrs.topk_group) json_object_set_new(a, "topk_group", json_integer(n->attrs.topk_group));
    }
    return a;
}

json_t *dw_graph_json(const dw_graph *g) {
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string("deepwell-graph"));
    json_object_set_new(j, "version", json_integer(2));
    json_object_set_new(j, "model_type", json_string(g->model.model_type));
    json_object_set_new(j, "batch", json_integer(g->batch));
    json_object_set_new(j, "seq", json_integer(g->seq));
    json_object_set_new(j, "params", json_integer(dw_graph_params(g)));
    json_object_set_new(j, "flops_per_token", json_real(dw_graph_flops_per_token(g)));
    json_t *m = json_object();
    json_object_set_new(m, "summary", json_string(g->model.summary));
    json_object_set_new(m, "blocks", json_integer(g->model.n_blocks));
    json_object_set_new(m, "vocab", json_integer(g->model.vocab));
    json_object_set_new(m, "max_seq", json_integer(g->model.max_seq));
    json_object_set_new(m, "tied_embeddings", json_boolean(g->model.tied_embeddings));
    json_object_set_new(j, "model", m);
    json_t *cfg = g->model.config_json ? json_loads(g->model.config_json, 0, NULL) : NULL;
    json_object_set_new(j, "config", cfg ? cfg : json_null());
    json_t *roles = json_object();
    const struct {
        const char *k;
        int idx;
    } r[] = {{dw_graph_float_input(g) ? "input" : "tokens", g->tokens}, {"targets", g->targets},
             {dw_graph_float_input(g) ? "output" : "logits", g->logits}, {"loss", g->loss}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].idx >= 0) json_object_set_new(roles, r[i].k, json_string(g->tensors[r[i].idx].name));
    json_object_set_new(j, "roles", roles);
    json_t *ts = json_array();
    for (int i = 0; i < g->n_tensors; i++) {
        const dw_ir_tensor *t = &g->tensors[i];
        if (t->kind == DW_TENSOR_ACT) continue;
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(t->name));
        json_object_set_new(o, "kind", json_string(dw_tensor_kind_name(t->kind)));
        json_object_set_new(o, "dtype", json_string(dw_ir_dtype_name(t->dtype)));
        json_object_set_new(o, "shape", shape_json(t));
        if (t->hf_transposed) json_object_set_new(o, "hf_transposed", json_true());
        if (t->kind == DW_TENSOR_PARAM) {
            json_object_set_new(o, "init", json_string(dw_init_name(t->init)));
            if (t->init == DW_INIT_NORMAL) json_object_set_new(o, "init_std", json_real(t->init_std));
            json_object_set_new(o, "decay", json_boolean(t->decay));
        }
        json_array_append_new(ts, o);
    }
    json_object_set_new(j, "tensors", ts);
    json_t *ns = json_array();
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        const dw_ir_tensor *o = &g->tensors[n->out[0]];
        json_t *jn = json_object(), *in = json_array();
        json_object_set_new(jn, "name", json_string(n->name));
        json_object_set_new(jn, "op", json_string(dw_op_name(n->op)));
        if (n->block >= 0) json_object_set_new(jn, "block", json_integer(n->block));
        for (int k = 0; k < n->n_in; k++) json_array_append_new(in, json_string(g->tensors[n->in[k]].name));
        json_object_set_new(jn, "inputs", in);
        if (n->n_out == 1) { /* the common case: "output", "dtype", "shape" */
            json_object_set_new(jn, "output", json_string(o->name));
            json_object_set_new(jn, "dtype", json_string(dw_ir_dtype_name(o->dtype)));
            json_object_set_new(jn, "shape", shape_json(o));
        } else { /* "outputs": [{name, dtype, shape}, ...] */
            json_t *outs = json_array();
            for (int k = 0; k < n->n_out; k++) {
                const dw_ir_tensor *ok = &g->tensors[n->out[k]];
                json_t *jo = json_object();
                json_object_set_new(jo, "name", json_string(ok->name));
                json_object_set_new(jo, "dtype", json_string(dw_ir_dtype_name(ok->dtype)));
                json_object_set_new(jo, "shape", shape_json(ok));
                json_array_append_new(outs, jo);
            }
            json_object_set_new(jn, "outputs", outs);
        }
        json_object_set_new(jn, "attrs", attrs_json(n));
        double f, b;
        dw_ir_flops(g, n, &f, &b);
        json_object_set_new(jn, "flops_fwd", json_real(f));
        json_object_set_new(jn, "flops_bwd", json_real(b));
        json_array_append_new(ns, jn);
    }
    json_object_set_new(j, "nodes", ns);
    return j;
}

/* Reads "shape" (an array of at most DW_IR_MAX_DIMS positive integers). */
static dw_status read_shape(dw_ctx *ctx, const json_t *o, const char *what, const char *name,
                            int *ndim, int64_t *shape) {
    const json_t *a = json_object_get(o, "shape");
    if (!json_is_array(a) || json_array_size(a) > DW_IR_MAX_DIMS)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: '%s': field 'shape': expected an array of at "
                            "most %d sizes", what, name, DW_IR_MAX_DIMS);
    *ndim = (int)json_array_size(a);
    for (int i = 0; i < *ndim; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) <= 0)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: '%s': field 'shape': expected positive "
                                "integers", what, name);
        shape[i] = json_integer_value(v);
    }
    return DW_OK;
}

static dw_status read_tensors(dw_ctx *ctx, dw_graph *g, const json_t *ts, const char *what) {
    if (!json_is_array(ts)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'tensors': expected an array", what);
    for (size_t i = 0; i < json_array_size(ts); i++) {
        const json_t *o = json_array_get(ts, i);
        const char *name, *kind, *dtype;
        DW_TRY(dw_json_get_str(ctx, o, "name", what, &name));
        DW_TRY(dw_json_get_str(ctx, o, "kind", what, &kind));
        DW_TRY(dw_json_get_str(ctx, o, "dtype", what, &dtype));
        dw_tensor_kind k = strcmp(kind, "input") ? DW_TENSOR_PARAM : DW_TENSOR_INPUT;
        dw_ir_dtype dt;
        if ((strcmp(kind, "input") && strcmp(kind, "param")) || !dw_ir_dtype_parse(dtype, &dt))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': kind '%s' / dtype '%s' is not "
                                "input|param / f32|bf16|i32", what, name, kind, dtype);
        int ndim;
        int64_t shape[DW_IR_MAX_DIMS];
        DW_TRY(read_shape(ctx, o, what, name, &ndim, shape));
        bool tr = false;
        DW_TRY(dw_json_get_bool_opt(ctx, o, "hf_transposed", what, &tr));
        int t = dw_graph_add_tensor(g, name, k, dt, ndim, shape);
        if (t < 0) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", what);
        dw_ir_tensor *it = &g->tensors[t];
        it->hf_transposed = tr;
        if (k != DW_TENSOR_PARAM) continue;
        const char *init = dw_init_name(it->init);
        DW_TRY(dw_json_get_str_opt(ctx, o, "init", what, &init));
        if (!dw_init_parse(init, &it->init))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': field 'init': '%s' is not normal, "
                                "ones or zeros", what, name, init);
        DW_TRY(dw_json_get_num_opt(ctx, o, "init_std", what, &it->init_std));
        DW_TRY(dw_json_get_bool_opt(ctx, o, "decay", what, &it->decay));
        if (it->init == DW_INIT_NORMAL && !(it->init_std > 0))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': field 'init_std' must be positive",
                                what, name);
    }
    return DW_OK;
}

/* A node's outputs: "output" with "shape" (one-output ops) or "outputs": [{name, shape}, ...]
 * (as many as the op has); names into names[], the shape objects into shapes[]. */
static dw_status read_outputs(dw_ctx *ctx, const json_t *o, const char *what, const char *name, dw_op op,
                              const char **names, const json_t **shapes) {
    const int n_out = dw_op_outputs(op);
    const json_t *outs = json_object_get(o, "outputs");
    if (n_out == 1 && !outs) {
        DW_TRY(dw_json_get_str(ctx, o, "output", what, &names[0]));
        shapes[0] = o;
        return DW_OK;
    }
    if (!json_is_array(outs) || json_array_size(outs) != (size_t)n_out)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': field 'outputs': expected an array of %d objects (op %s)",
                            what, name, n_out, dw_op_name(op));
    for (int k = 0; k < n_out; k++) {
        const json_t *jo = json_array_get(outs, (size_t)k);
        if (!json_is_object(jo))
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': outputs[%d]: expected an object", what, name, k);
        DW_TRY(dw_json_get_str(ctx, jo, "name", what, &names[k]));
        shapes[k] = jo;
    }
    return DW_OK;
}

static dw_status read_node(dw_ctx *ctx, dw_graph *g, const json_t *o, const char *what) {
    const char *name, *opname, *out[DW_IR_MAX_OUTPUTS];
    const json_t *shape_of[DW_IR_MAX_OUTPUTS];
    DW_TRY(dw_json_get_str(ctx, o, "name", what, &name));
    DW_TRY(dw_json_get_str(ctx, o, "op", what, &opname));
    dw_op op;
    if (!dw_op_parse(opname, &op))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': unknown op '%s'", what, name, opname);
    DW_TRY(read_outputs(ctx, o, what, name, op, out, shape_of));
    const json_t *in = json_object_get(o, "inputs");
    if (!json_is_array(in) || json_array_size(in) > DW_IR_MAX_INPUTS)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': field 'inputs': expected an array "
                            "of at most %d names", what, name, DW_IR_MAX_INPUTS);
    int idx[DW_IR_MAX_INPUTS];
    for (size_t k = 0; k < json_array_size(in); k++) {
        const char *tn = json_string_value(json_array_get(in, k));
        idx[k] = tn ? dw_graph_find_tensor(g, tn) : -1;
        if (idx[k] < 0)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': input '%s' is not defined before "
                                "it", what, name, tn ? tn : "(not a string)");
    }
    dw_ir_attrs a = {0};
    const json_t *ja = json_object_get(o, "attrs");
    long long v;
    const struct {
        const char *k;
        int64_t *dst;
    } ints[] = {{"heads", &a.heads}, {"kv_heads", &a.kv_heads}, {"head_dim", &a.head_dim}, {"top_k", &a.top_k}, {"experts", &a.experts},
                 {"window", &a.window}, {"n_group", &a.n_group}, {"topk_group", &a.topk_group}};
    for (size_t k = 0; ja && k < sizeof ints / sizeof ints[0]; k++) {
        v = 0;
        DW_TRY(dw_json_get_int_opt(ctx, ja, ints[k].k, what, &v));
        *ints[k].dst = v;
    }
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "eps", what, &a.eps));
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "theta", what, &a.theta));
    const json_t *jr = ja ? json_object_get(ja, "rope") : NULL;
    if (jr) DW_TRY(rope_parse(ctx, jr, what, name, &a.rope));
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "coef", what, &a.coef));
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "zcoef", what, &a.zcoef));
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "softcap", what, &a.softcap));
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "scale", what, &a.scale));
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "offset", what, &a.offset));
    a.has_pad = ja && json_object_get(ja, "pad");
    if (a.has_pad) {
        v = 0;
        DW_TRY(dw_json_get_int(ctx, ja, "pad", what, &v));
        a.pad = v;
    }
    if (ja) DW_TRY(dw_json_get_num_opt(ctx, ja, "capacity_factor", what, &a.capacity_factor));
    if (a.capacity_factor < 0)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.capacity_factor %g is negative (0: dropless)",
                            what, name, a.capacity_factor);
    if (ja) DW_TRY(dw_json_get_bool_opt(ctx, ja, "norm_topk", what, &a.norm_topk));
    const char *score = "softmax";
    if (ja) DW_TRY(dw_json_get_str_opt(ctx, ja, "score", what, &score));
    if (strcmp(score, "softmax") && strcmp(score, "sigmoid"))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': attrs.score '%s' is neither softmax nor sigmoid",
                            what, name, score);
    a.score = strcmp(score, "sigmoid") ? DW_ROUTER_SOFTMAX : DW_ROUTER_SIGMOID;
    for (int k = 0; k < dw_op_outputs(op); k++)
        if (dw_graph_find_tensor(g, out[k]) >= 0)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': output name '%s' is already used",
                                what, name, out[k]);
    long long block = -1;
    DW_TRY(dw_json_get_int_opt(ctx, o, "block", what, &block));
    if (block < -1 || block >= g->model.n_blocks)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s': field 'block': %lld is not in [-1, %lld)",
                            what, name, block, (long long)g->model.n_blocks);
    dw_graph_set_block(g, (int)block);
    int t[DW_IR_MAX_OUTPUTS];
    if (dw_graph_add_node_outs(ctx, g, op, name, idx, (int)json_array_size(in), &a, out, t) != DW_OK)
        return dw_prefix_error(ctx, DW_ERR_FORMAT, "%s", what);
    for (int k = 0; k < dw_op_outputs(op); k++) {
        int ndim;
        int64_t shape[DW_IR_MAX_DIMS];
        DW_TRY(read_shape(ctx, shape_of[k], what, name, &ndim, shape));
        const dw_ir_tensor *ot = &g->tensors[t[k]];
        bool same = ndim == ot->ndim;
        for (int d = 0; same && d < ndim; d++) same = shape[d] == ot->shape[d];
        if (!same)
            return dw_set_error(ctx, DW_ERR_FORMAT, "%s: node '%s' (%s): recorded shape of output '%s' differs "
                                "from the one its inputs give", what, name, opname, out[k]);
    }
    return DW_OK;
}

/* "model_type", "model" {summary, blocks, vocab, max_seq, tied_embeddings} and "config" (an object
 * kept as text, or null). */
static dw_status read_model(dw_ctx *ctx, const json_t *j, const char *what, dw_graph_model *m) {
    const char *type, *summary = "";
    DW_TRY(dw_json_get_str(ctx, j, "model_type", what, &type));
    const json_t *o = json_object_get(j, "model");
    if (!json_is_object(o)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'model': expected an object", what);
    long long blocks, vocab, max_seq;
    DW_TRY(dw_json_get_int(ctx, o, "blocks", what, &blocks));
    DW_TRY(dw_json_get_int(ctx, o, "vocab", what, &vocab));
    DW_TRY(dw_json_get_int(ctx, o, "max_seq", what, &max_seq));
    DW_TRY(dw_json_get_str_opt(ctx, o, "summary", what, &summary));
    DW_TRY(dw_json_get_bool_opt(ctx, o, "tied_embeddings", what, &m->tied_embeddings));
    if (blocks < 0 || vocab < 1 || max_seq < 1)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'model': blocks %lld, vocab %lld, max_seq %lld "
                            "out of range", what, blocks, vocab, max_seq);
    snprintf(m->model_type, sizeof m->model_type, "%s", type);
    snprintf(m->summary, sizeof m->summary, "%s", summary);
    m->n_blocks = blocks, m->vocab = vocab, m->max_seq = max_seq;
    const json_t *cfg = json_object_get(j, "config");
    if (cfg && !json_is_null(cfg)) {
        if (!json_is_object(cfg)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'config': expected an object", what);
        m->config_json = json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!m->config_json) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", what);
    }
    return DW_OK;
}

static dw_status read_graph(dw_ctx *ctx, const json_t *j, const char *what, dw_graph **out) {
    const char *format;
    DW_TRY(dw_json_get_str(ctx, j, "format", what, &format));
    if (strcmp(format, "deepwell-graph"))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'format': '%s' is not 'deepwell-graph'",
                            what, format);
    long long version, batch, seq;
    DW_TRY(dw_json_get_int(ctx, j, "version", what, &version));
    if (version != 2)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'version': %lld is not 2", what, version);
    DW_TRY(dw_json_get_int(ctx, j, "batch", what, &batch));
    DW_TRY(dw_json_get_int(ctx, j, "seq", what, &seq));
    dw_graph_model m = {0};
    DW_TRY(read_model(ctx, j, what, &m));
    dw_graph *g = *out = dw_graph_new(&m, batch, seq);
    free(m.config_json);
    if (!g) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", what);
    DW_TRY(read_tensors(ctx, g, json_object_get(j, "tensors"), what));
    const json_t *ns = json_object_get(j, "nodes");
    if (!json_is_array(ns)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nodes': expected an array", what);
    for (size_t i = 0; i < json_array_size(ns); i++) DW_TRY(read_node(ctx, g, json_array_get(ns, i), what));
    const json_t *roles = json_object_get(j, "roles");
    const char *names[4] = {NULL, NULL, NULL, NULL};
    const char *keys[4] = {"tokens", "targets", "logits", "loss"};
    int *dst[4] = {&g->tokens, &g->targets, &g->logits, &g->loss};
    const bool ff = json_object_get(roles, "input") != NULL; /* a feed-forward graph: input, output */
    if (ff) keys[0] = "input", keys[2] = "output";
    for (int r = 0; r < 4; r++) {
        if (ff && (r == 1 || r == 3)) continue;
        DW_TRY(dw_json_get_str(ctx, roles, keys[r], what, &names[r]));
        *dst[r] = dw_graph_find_tensor(g, names[r]);
    }
    return dw_graph_verify(ctx, g);
}

dw_status dw_graph_from_json_obj(dw_ctx *ctx, const json_t *j, const char *what, dw_graph **out) {
    dw_graph *g = NULL;
    dw_status s = read_graph(ctx, j, what ? what : "graph", &g);
    if (s != DW_OK) {
        dw_graph_free(g);
        g = NULL;
    }
    *out = g;
    return s;
}

dw_status dw_graph_from_json(dw_ctx *ctx, const char *text, size_t len, const char *what,
                             dw_graph **out) {
    *out = NULL;
    json_t *j;
    DW_TRY(dw_json_load_string(ctx, text, len, what ? what : "graph", &j));
    dw_status s = dw_graph_from_json_obj(ctx, j, what, out);
    json_decref(j);
    return s;
}

dw_status dw_graph_to_json(dw_ctx *ctx, const dw_graph *g, bool pretty, char **out) {
    json_t *j = dw_graph_json(g);
    *out = dw_json_dump(j, pretty);
    json_decref(j);
    return *out ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "graph: could not serialise to JSON");
}
