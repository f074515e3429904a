/* comm.c — alpha-beta costs of NCCL-style collectives on the planner's machine model: ring
 * algorithms inside the NVLink domain, hierarchical (NVLink + per-GPU NIC) across domains.
 * A model, not a measurement: constants below are assumptions stated in docs/planner.md. */
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
