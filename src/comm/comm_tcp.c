/* comm_tcp.c — the "tcp" communicator: CPU ranks joined in a star through rank 0 over TCP
 * sockets, for jobs that torchrun, srun or `deepwell launch` start (MASTER_ADDR:MASTER_PORT is
 * rank 0's rendezvous). Rank 0 reduces in rank order 0, 1, ..., N-1, so every result is the same
 * on every rank and from run to run. Bandwidth goes through rank 0 (N-1 copies each way): meant
 * for CPU ranks on one node and for bootstrapping NCCL, not for moving GPU gradients. Every wait
 * is bounded by the timeout; a peer that closed its socket (it failed or died) is an error naming
 * it. A split is a star of its own through each color's first rank, on a port the system picks.
 * Not MPI (comm_mpi.c). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"

enum { TCP_MAGIC = 0x4d434457 /* "DWCM" */, TCP_VERSION = 1, TCP_CHUNK = 1 << 22 };

typedef struct {
    int *fd;          /* (world): rank 0: the socket of each other rank; others: fd[0] to rank 0 */
    double timeout_s;
    char *scratch;    /* TCP_CHUNK bytes: rank 0's receive buffer for reductions */
} tcp_impl;

typedef struct {
    uint32_t magic, version;
    int32_t rank, world;
} tcp_hello;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits until fd is ready for `events`, at most timeout_s. */
static dw_status wait_fd(dw_ctx *ctx, const dw_comm *c, int fd, short events, int peer, double timeout_s) {
    const double end = now_s() + timeout_s;
    for (;;) {
        double left = end - now_s();
        if (left <= 0)
            return dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: rank %d did not %s within %g s (DW_COMM_TIMEOUT): is it "
                                "alive and at the same step?", c->rank, peer, events == POLLIN ? "send" : "receive",
                                timeout_s);
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int rc = poll(&p, 1, ms);
        if (rc > 0) return DW_OK; /* ready, or an error/hang-up that the read or write reports */
        if (rc < 0 && errno != EINTR)
            return dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: poll: %s", c->rank, strerror(errno));
    }
}

/* Sends (or receives) exactly n bytes to (from) peer, each wait bounded by the timeout. */
static dw_status io_all(dw_ctx *ctx, const dw_comm *c, int peer, void *buf, size_t n, bool sending) {
    const tcp_impl *t = c->impl;
    const int fd = t->fd[c->rank == 0 ? peer : 0];
    char *p = buf;
    while (n > 0) {
        DW_TRY(wait_fd(ctx, c, fd, sending ? POLLOUT : POLLIN, peer, t->timeout_s));
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0)
            return dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: %s rank %d: %s (it failed or exited: its own message "
                                "says why)", c->rank, sending ? "sending to" : "receiving from", peer,
                                k < 0 ? strerror(errno) : "connection closed");
        p += k;
        n -= (size_t)k;
    }
    return DW_OK;
}

static dw_status send_all(dw_ctx *ctx, const dw_comm *c, int peer, const void *buf, size_t n) {
    return io_all(ctx, c, peer, (void *)buf, n, true);
}

static dw_status recv_all(dw_ctx *ctx, const dw_comm *c, int peer, void *buf, size_t n) {
    return io_all(ctx, c, peer, buf, n, false);
}

/* ---- collectives ----------------------------------------------------------------------------- */
static dw_status tcp_all_reduce(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type ty, dw_comm_op op) {
    tcp_impl *t = c->impl;
    const int es = dw_comm_type_size(ty);
    const size_t bytes = (size_t)n * (size_t)es;
    if (c->rank != 0) {
        DW_TRY(send_all(ctx, c, 0, buf, bytes));
        return recv_all(ctx, c, 0, buf, bytes);
    }
    const int64_t per = TCP_CHUNK / es; /* elements per chunk */
    for (int64_t off = 0; off < n; off += per) {
        const int64_t k = n - off < per ? n - off : per;
        char *dst = (char *)buf + (size_t)off * (size_t)es;
        for (int r = 1; r < c->world; r++) { /* in rank order: the same sum everywhere, every time */
            DW_TRY(recv_all(ctx, c, r, t->scratch, (size_t)k * (size_t)es));
            dw_comm_reduce_host(dst, t->scratch, k, ty);
        }
        if (op == DW_COMM_AVG) dw_comm_divide_host(dst, k, ty, c->world);
    }
    for (int r = 1; r < c->world; r++) DW_TRY(send_all(ctx, c, r, buf, bytes));
    return DW_OK;
}

static dw_status tcp_reduce_scatter(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type ty,
                                    dw_comm_op op) {
    return tcp_all_reduce(ctx, c, buf, n_each * c->world, ty, op); /* every block reduced: a superset */
}

static dw_status tcp_all_gather(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n_each, dw_comm_type ty) {
    const size_t blk = (size_t)n_each * (size_t)dw_comm_type_size(ty);
    if (c->rank != 0) {
        DW_TRY(send_all(ctx, c, 0, (char *)buf + (size_t)c->rank * blk, blk));
        return recv_all(ctx, c, 0, buf, blk * (size_t)c->world);
    }
    for (int r = 1; r < c->world; r++) DW_TRY(recv_all(ctx, c, r, (char *)buf + (size_t)r * blk, blk));
    for (int r = 1; r < c->world; r++) DW_TRY(send_all(ctx, c, r, buf, blk * (size_t)c->world));
    return DW_OK;
}

static dw_status tcp_broadcast(dw_ctx *ctx, dw_comm *c, void *buf, int64_t n, dw_comm_type ty, int root) {
    const size_t bytes = (size_t)n * (size_t)dw_comm_type_size(ty);
    if (c->rank == 0) {
        if (root != 0) DW_TRY(recv_all(ctx, c, root, buf, bytes));
        for (int r = 1; r < c->world; r++)
            if (r != root) DW_TRY(send_all(ctx, c, r, buf, bytes));
        return DW_OK;
    }
    if (c->rank == root) return send_all(ctx, c, 0, buf, bytes);
    return recv_all(ctx, c, 0, buf, bytes);
}

static dw_status tcp_barrier(dw_ctx *ctx, dw_comm *c) {
    int64_t one = 1;
    DW_TRY(tcp_all_reduce(ctx, c, &one, 1, DW_COMM_I64, DW_COMM_SUM));
    if (one != c->world)
        return dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: barrier counted %lld of %d ranks", c->rank, (long long)one,
                            c->world);
    return DW_OK;
}

static int64_t total(const int64_t *counts, int world) {
    int64_t s = 0;
    for (int r = 0; r < world; r++) s += counts[r];
    return s;
}

/* Rank d gets from rank 0, for every source s in order: the count, then the elements. */
static dw_status recv_blocks(dw_ctx *ctx, dw_comm *c, void *recv, const int64_t *recv_counts, int es) {
    char *p = recv;
    for (int s = 0; s < c->world; s++) {
        int64_t k = 0;
        DW_TRY(recv_all(ctx, c, 0, &k, sizeof k));
        if (k != recv_counts[s])
            return dw_set_error(ctx, DW_ERR_INVALID, "tcp all-to-all: rank %d sends %lld elements to rank %d, which "
                                "expects %lld", s, (long long)k, c->rank, (long long)recv_counts[s]);
        DW_TRY(recv_all(ctx, c, 0, p, (size_t)k * (size_t)es));
        p += (size_t)k * (size_t)es;
    }
    return DW_OK;
}

static dw_status tcp_all_to_all(dw_ctx *ctx, dw_comm *c, const void *send, const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts, dw_comm_type ty) {
    const int es = dw_comm_type_size(ty), W = c->world;
    if (c->rank != 0) {
        DW_TRY(send_all(ctx, c, 0, send_counts, (size_t)W * sizeof *send_counts));
        DW_TRY(send_all(ctx, c, 0, send, (size_t)total(send_counts, W) * (size_t)es));
        return recv_blocks(ctx, c, recv, recv_counts, es);
    }
    /* rank 0 gathers every rank's counts and data, then hands each destination its blocks */
    int64_t *counts = malloc((size_t)W * (size_t)W * sizeof *counts); /* [s][d] */
    char **data = calloc((size_t)W, sizeof *data);
    dw_status st = counts && data ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "tcp all-to-all: out of memory");
    if (st == DW_OK) memcpy(counts, send_counts, (size_t)W * sizeof *counts);
    for (int s = 1; st == DW_OK && s < W; s++) {
        st = recv_all(ctx, c, s, counts + (size_t)s * (size_t)W, (size_t)W * sizeof *counts);
        for (int d = 0; st == DW_OK && d < W; d++)
            if (counts[(size_t)s * (size_t)W + d] < 0)
                st = dw_set_error(ctx, DW_ERR_INVALID, "tcp all-to-all: rank %d sends a negative count", s);
        const int64_t k = st == DW_OK ? total(counts + (size_t)s * (size_t)W, W) : 0;
        if (st == DW_OK && !(data[s] = malloc((size_t)k * (size_t)es + 1)))
            st = dw_set_error(ctx, DW_ERR_NOMEM, "tcp all-to-all: out of memory");
        if (st == DW_OK) st = recv_all(ctx, c, s, data[s], (size_t)k * (size_t)es);
    }
    for (int d = 0; st == DW_OK && d < W; d++) {
        char *out = recv;
        for (int s = 0; st == DW_OK && s < W; s++) {
            const int64_t *row = counts + (size_t)s * (size_t)W;
            int64_t off = 0;
            for (int j = 0; j < d; j++) off += row[j];
            const char *src = (s == 0 ? (const char *)send : data[s]) + (size_t)off * (size_t)es;
            const size_t bytes = (size_t)row[d] * (size_t)es;
            if (d == 0) { /* rank 0's own blocks */
                if (row[d] != recv_counts[s])
                    st = dw_set_error(ctx, DW_ERR_INVALID, "tcp all-to-all: rank %d sends %lld elements to rank 0, "
                                      "which expects %lld", s, (long long)row[d], (long long)recv_counts[s]);
                else memcpy(out, src, bytes), out += bytes;
            } else {
                st = send_all(ctx, c, d, &row[d], sizeof row[d]);
                if (st == DW_OK) st = send_all(ctx, c, d, src, bytes);
            }
        }
    }
    for (int s = 0; data && s < W; s++) free(data[s]);
    free(data);
    free(counts);
    return st;
}

static void tcp_destroy(dw_comm *c, bool orderly) {
    (void)orderly;
    tcp_impl *t = c->impl;
    for (int r = 0; t && t->fd && r < c->world; r++)
        if (t->fd[r] >= 0) close(t->fd[r]);
    if (t) free(t->fd), free(t->scratch);
    free(t);
    free(c);
}

static dw_status tcp_split(dw_ctx *ctx, dw_comm *c, int color, int sub_rank, int sub_world, dw_comm **out);

static const dw_comm_i tcp_i = {
    .name = "tcp", .all_reduce = tcp_all_reduce, .reduce_scatter = tcp_reduce_scatter, .all_gather = tcp_all_gather,
    .broadcast = tcp_broadcast, .barrier = tcp_barrier, .all_to_all = tcp_all_to_all, .destroy = tcp_destroy,
    .split = tcp_split};

/* ---- rendezvous ------------------------------------------------------------------------------- */
static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A socket listening on port of every interface (0: one the system picks; *bound gets it). */
static dw_status listen_on(dw_ctx *ctx, int port, int backlog, int *ls_out, int *bound) {
    *ls_out = -1;
    int ls = socket(AF_INET6, SOCK_STREAM, 0), v6 = ls >= 0;
    if (ls < 0) ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) return dw_set_error(ctx, DW_ERR_IO, "tcp rank 0: socket: %s", strerror(errno));
    int one = 1, zero = 0;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* IPv4 peers too */
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
    int rc = v6 ? bind(ls, (struct sockaddr *)&a6, sizeof a6) : bind(ls, (struct sockaddr *)&a4, sizeof a4);
    socklen_t len = v6 ? sizeof a6 : sizeof a4;
    if (rc == 0) rc = listen(ls, backlog);
    if (rc == 0) rc = v6 ? getsockname(ls, (struct sockaddr *)&a6, &len) : getsockname(ls, (struct sockaddr *)&a4, &len);
    if (rc != 0) {
        dw_status st = dw_set_error(ctx, DW_ERR_IO, "tcp rank 0: cannot listen on port %d%s: %s", port,
                                    port ? " (MASTER_PORT)" : "", strerror(errno));
        close(ls);
        return st;
    }
    *bound = ntohs(v6 ? a6.sin6_port : a4.sin_port);
    *ls_out = ls;
    return DW_OK;
}

/* Rank 0: accepts world - 1 ranks on the listening socket ls (closed here), each saying who it is. */
static dw_status accept_ranks(dw_ctx *ctx, dw_comm *c, int ls, int port) {
    tcp_impl *t = c->impl;
    dw_status st = DW_OK;
    for (int k = 1; st == DW_OK && k < c->world; k++) {
        struct pollfd p = {.fd = ls, .events = POLLIN};
        if (poll(&p, 1, (int)(t->timeout_s * 1000)) <= 0) {
            st = dw_set_error(ctx, DW_ERR_IO, "tcp rank 0: %d of %d ranks joined on port %d within %g s "
                              "(DW_COMM_TIMEOUT)", k, c->world, port, t->timeout_s);
            break;
        }
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        tune(fd);
        tcp_hello h = {0};
        t->fd[0] = fd; /* read the hello through the generic path: peer index 0 is unused on rank 0 */
        st = recv_all(ctx, c, 0, &h, sizeof h);
        t->fd[0] = -1;
        if (st == DW_OK && (h.magic != TCP_MAGIC || h.version != TCP_VERSION || h.world != c->world || h.rank < 1 ||
                            h.rank >= c->world || t->fd[h.rank] >= 0))
            st = dw_set_error(ctx, DW_ERR_INVALID, "tcp rank 0: a peer on port %d says it is rank %d of %d (this job "
                              "has %d ranks%s)", port, (int)h.rank, (int)h.world, c->world,
                              h.rank >= 1 && h.rank < c->world && t->fd[h.rank] >= 0 ? ", and that rank joined already" : "");
        if (st != DW_OK) {
            close(fd);
            break;
        }
        t->fd[h.rank] = fd;
    }
    close(ls);
    uint32_t ack = TCP_MAGIC;
    for (int r = 1; st == DW_OK && r < c->world; r++) st = send_all(ctx, c, r, &ack, sizeof ack);
    return st;
}

/* Other ranks: connect to addr:port until it answers or the timeout passes. */
static dw_status connect_root(dw_ctx *ctx, dw_comm *c, const char *addr, int port) {
    tcp_impl *t = c->impl;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const double end = now_s() + t->timeout_s;
    const char *why = "no answer";
    char whyb[256];
    while (now_s() < end) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int gai = getaddrinfo(addr, ps, &hints, &res);
        if (gai != 0) {
            snprintf(whyb, sizeof whyb, "%s", gai_strerror(gai));
            why = whyb;
        }
        for (struct addrinfo *ai = res; ai && t->fd[0] < 0; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                t->fd[0] = fd;
            } else {
                snprintf(whyb, sizeof whyb, "%s", strerror(errno));
                why = whyb;
                close(fd);
            }
        }
        if (res) freeaddrinfo(res);
        if (t->fd[0] >= 0) break;
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL); /* rank 0 may start later */
    }
    if (t->fd[0] < 0)
        return dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: cannot reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) "
                            "within %g s: %s", c->rank, addr, port, t->timeout_s, why);
    tune(t->fd[0]);
    tcp_hello h = {.magic = TCP_MAGIC, .version = TCP_VERSION, .rank = c->rank, .world = c->world};
    uint32_t ack = 0;
    DW_TRY(send_all(ctx, c, 0, &h, sizeof h));
    DW_TRY(recv_all(ctx, c, 0, &ack, sizeof ack));
    if (ack != TCP_MAGIC) return dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: rank 0 answered with garbage", c->rank);
    return DW_OK;
}

/* A tcp communicator's memory, before its rendezvous. */
static dw_status tcp_new(dw_ctx *ctx, int rank, int world, int local_rank, double timeout_s, dw_comm **out) {
    *out = NULL;
    dw_comm *c = calloc(1, sizeof *c);
    tcp_impl *t = calloc(1, sizeof *t);
    if (c) *c = (dw_comm){.i = &tcp_i, .rank = rank, .world = world, .local_rank = local_rank, .host = c, .impl = t};
    if (t) {
        t->timeout_s = timeout_s;
        t->fd = malloc((size_t)world * sizeof *t->fd);
        t->scratch = rank == 0 ? malloc(TCP_CHUNK) : NULL;
    }
    for (int r = 0; t && t->fd && r < world; r++) t->fd[r] = -1;
    if (!c || !t || !t->fd || (rank == 0 && !t->scratch)) {
        if (c) tcp_destroy(c, false);
        else if (t) free(t->fd), free(t->scratch), free(t);
        return dw_set_error(ctx, DW_ERR_NOMEM, "tcp: out of memory");
    }
    *out = c;
    return DW_OK;
}

dw_status dw_comm_tcp_create(dw_ctx *ctx, int rank, int world, int local_rank, const char *addr, int port,
                             double timeout_s, dw_comm **out) {
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || port < 1 || port > 65535 || !(timeout_s > 0) || !addr)
        return dw_set_error(ctx, DW_ERR_INVALID, "tcp: rank %d of %d, port %d, timeout %g", rank, world, port, timeout_s);
    dw_comm *c = NULL;
    DW_TRY(tcp_new(ctx, rank, world, local_rank, timeout_s, &c));
    int ls = -1, bound = 0;
    dw_status st = world == 1 || rank != 0 ? DW_OK : listen_on(ctx, port, world, &ls, &bound);
    if (st == DW_OK && world > 1) st = rank == 0 ? accept_ranks(ctx, c, ls, port) : connect_root(ctx, c, addr, port);
    if (st != DW_OK) {
        tcp_destroy(c, false);
        return st;
    }
    *out = c;
    return DW_OK;
}

/* ---- split: a star through each color's first rank, on a port the system picks ------------------ */
typedef struct {
    char host[240]; /* a color's first rank: its host name */
    int64_t color;
    int64_t port;   /* a color's first rank: its port (0: it could not listen), else -1 */
} tcp_where;

static dw_status tcp_split(dw_ctx *ctx, dw_comm *c, int color, int sub_rank, int sub_world, dw_comm **out) {
    const tcp_impl *t = c->impl;
    tcp_where *where = calloc((size_t)c->world, sizeof *where);
    if (!where) return dw_set_error(ctx, DW_ERR_NOMEM, "tcp split: out of memory");
    int ls = -1, bound = 0;
    dw_status st = sub_rank == 0 && sub_world > 1 ? listen_on(ctx, 0, sub_world, &ls, &bound) : DW_OK;
    tcp_where *me = &where[c->rank];
    me->color = color, me->port = sub_rank == 0 ? bound : -1;
    if (sub_rank == 0 && gethostname(me->host, sizeof me->host - 1) != 0)
        snprintf(me->host, sizeof me->host, "localhost");
    /* every rank learns every first rank's address (one that could not listen sends port 0) */
    dw_status ex = dw_comm_all_gather(ctx, c, where, (int64_t)sizeof *where, DW_COMM_BYTE);
    if (st == DW_OK) st = ex;
    int root = 0;
    while (root < c->rank && where[root].color != color) root++;
    char host[sizeof where->host];
    snprintf(host, sizeof host, "%s", where[root].host);
    const int port = (int)where[root].port;
    if (st == DW_OK && sub_rank > 0) { /* the same host name: this node, by loopback */
        char mine[sizeof where->host] = "";
        if (gethostname(mine, sizeof mine - 1) == 0 && !strcmp(mine, host)) snprintf(host, sizeof host, "127.0.0.1");
    }
    free(where);
    if (st == DW_OK && sub_world == 1) { /* alone in its color, after the exchange every rank joins */
        st = dw_comm_self_create(ctx, out);
        if (st == DW_OK) (*out)->local_rank = c->local_rank;
        return st;
    }
    if (st == DW_OK && port < 1)
        st = dw_set_error(ctx, DW_ERR_IO, "tcp rank %d: split: rank %d, the first of color %d, could not listen",
                          c->rank, root, color);
    dw_comm *s = NULL;
    if (st == DW_OK) st = tcp_new(ctx, sub_rank, sub_world, c->local_rank, t->timeout_s, &s);
    if (st == DW_OK) st = sub_rank == 0 ? accept_ranks(ctx, s, ls, port) : connect_root(ctx, s, host, port);
    else if (ls >= 0) close(ls);
    if (st != DW_OK) {
        if (s) tcp_destroy(s, false);
        return dw_prefix_error(ctx, st, "tcp split (color %d, rank %d of %d)", color, sub_rank, sub_world);
    }
    *out = s;
    return DW_OK;
}
