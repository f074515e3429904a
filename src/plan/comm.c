/* comm.c — alpha-beta costs of NCCL-style collectives on the planner's machine model: ring
 * algorithms inside the NVLink domain, hierarchical (NVLink + per-GPU NIC) across domains.
 * MoE dispatch/combine all-to-all, plain or node-limited (DeepSeek-V3: a token crosses the
 * network once per node it reaches, then NVLink). A model, not a measurement: constants below
 * are assumptions stated in docs/planner.md. */
#include <math.h>

#include "plan/plan.h"

#define ALPHA_NVLINK 3e-6   /* seconds per ring step inside the NVLink domain */
#define ALPHA_NET 8e-6      /* seconds per ring step across nodes */
#define BUS_EFF 0.80        /* fraction of link rate a collective reaches (NCCL bus bandwidth) */

/* Ring cost for n ranks moving `frac * bytes` per rank over a link of `gbps` (GB/s). */
static double ring(double steps, double alpha, double frac, double bytes, double gbps) {
    if (gbps <= 0) gbps = 1; /* unknown fabric: 1 GB/s, loudly slow rather than free */
    return steps * alpha + frac * bytes / (gbps * 1e9 * BUS_EFF);
}

static double flat(dw_coll c, double n, double bytes, double alpha, double gbps) {
    if (n <= 1) return 0;
    switch (c) {
    case DW_COLL_ALLREDUCE: return ring(2 * (n - 1), alpha, 2 * (n - 1) / n, bytes, gbps);
    case DW_COLL_ALLGATHER:
    case DW_COLL_REDUCESCATTER:
    case DW_COLL_ALLTOALL: return ring(n - 1, alpha, (n - 1) / n, bytes, gbps);
    case DW_COLL_P2P: return ring(1, alpha, 1, bytes, gbps);
    }
    return 0;
}

double dw_plan_broadcast_time(const dw_hw *hw, int64_t n, double bytes) {
    return dw_plan_coll_time(hw, DW_COLL_ALLGATHER, n, 1, bytes) * (double)n / (double)(n - 1);
}

double dw_plan_coll_time(const dw_hw *hw, dw_coll c, int64_t n, int64_t stride, double bytes) {
    if (c == DW_COLL_P2P) {
        /* neighbours `stride` apart share an NVLink domain when stride < domain */
        bool nvl = stride < hw->nvlink_domain && hw->nvlink_domain > 1;
        return flat(c, 2, bytes, nvl ? ALPHA_NVLINK : ALPHA_NET,
                    nvl ? hw->nvlink_gbps : hw->internode_gbps);
    }
    if (n <= 1 || bytes <= 0) return 0;
    int64_t dom = hw->nvlink_domain > 1 ? hw->nvlink_domain : 1;
    /* k members of the group share one NVLink domain (groups are laid out contiguously). */
    int64_t k = stride >= dom ? 1 : dom / stride;
    if (k > n) k = n;
    double nd = (double)n, kd = (double)k;
    if (k >= n) return flat(c, nd, bytes, ALPHA_NVLINK, hw->nvlink_gbps);
    double nvl = hw->nvlink_gbps, net = hw->internode_gbps;
    if (c == DW_COLL_ALLTOALL) {
        /* (k-1)/n of each rank's data stays in the domain, (n-k)/n crosses the network */
        return (nd - 1) * ALPHA_NET + bytes * ((kd - 1) / nd) / ((nvl > 0 ? nvl : 1) * 1e9 * BUS_EFF) +
               bytes * ((nd - kd) / nd) / ((net > 0 ? net : 1) * 1e9 * BUS_EFF);
    }
    /* Hierarchical: the k GPUs of a domain each own 1/k of the buffer on the inter-domain ring
     * (one NIC each), plus the intra-domain phase on NVLink. */
    double intra = flat(c, kd, bytes, ALPHA_NVLINK, nvl);
    double inter = flat(c, nd / kd, bytes / kd, ALPHA_NET, net);
    return intra + inter;
}

/* Members of a group of n ranks `stride` GPUs apart that share an NVLink domain, and the domains
 * (nodes) it spans. */
static void group_domains(const dw_hw *hw, int64_t n, int64_t stride, double *k, double *D) {
    int64_t dom = hw->nvlink_domain > 1 ? hw->nvlink_domain : 1;
    int64_t kk = stride >= dom ? 1 : dom / stride;
    if (kk > n) kk = n;
    *k = (double)kk, *D = (double)n / (double)kk;
}

int64_t dw_plan_node_limit(const dw_plan_in *in, int64_t ep, int64_t stride) {
    const dw_group_routing *r = &in->cfg->route;
    if (r->n_group <= 1 || r->topk_group >= r->n_group || in->experts != in->cfg->n_experts) return 0;
    double k, D;
    group_domains(in->hw, ep, stride, &k, &D);
    /* experts are laid out over the EP ranks in order, so a group spans D / n_group nodes when
     * the group count is below the node count, and shares a node with others otherwise */
    double per_group = D > (double)r->n_group ? D / (double)r->n_group : 1;
    double M = (double)r->topk_group * per_group;
    return (int64_t)(M < D ? M : D);
}

double dw_plan_moe_a2a_time(const dw_hw *hw, int64_t ep, int64_t stride, double tokens, double top_k,
                            double row_bytes, int64_t max_nodes) {
    if (ep <= 1 || tokens <= 0) return 0;
    double k, D;
    group_domains(hw, ep, stride, &k, &D);
    if (max_nodes <= 0 || D <= 1)
        return dw_plan_coll_time(hw, DW_COLL_ALLTOALL, ep, stride, tokens * top_k * row_bytes);
    /* Node-limited: each token goes once to each remote node among the M its routing allows (the
     * expected number of distinct nodes top_k picks spread over M nodes reach), then on within
     * that node over NVLink to each target GPU; NIC and NVLink phases are pipelined. */
    double M = (double)max_nodes < D ? (double)max_nodes : D;
    double reached = M * (1 - pow(1 - 1 / M, top_k));
    double remote = reached * (D - 1) / D;
    double nic = tokens * remote * row_bytes / ((hw->internode_gbps > 0 ? hw->internode_gbps : 1) * 1e9 * BUS_EFF);
    double nvl = tokens * top_k * row_bytes * (k - 1) / k / ((hw->nvlink_gbps > 0 ? hw->nvlink_gbps : 1) * 1e9 * BUS_EFF);
    return (D - 1) * ALPHA_NET + (k - 1) * ALPHA_NVLINK + (nic > nvl ? nic : nvl);
}
