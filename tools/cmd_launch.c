/* cmd_launch.c — `deepwell launch -n N -- COMMAND ...`: one node's launcher, like torchrun's
 * --nproc-per-node. Forks N processes of `deepwell COMMAND ...` with torchrun's environment (RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) around a free local port,
 * where rank 0 holds the TCP rendezvous; passes stop signals on once; when a rank fails, stops
 * the others and exits with its status. Not the communication itself (the library's comm/). */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, sigaction, kill */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const char *CMD = "launch";
enum { MAX_RANKS = 1024, GRACE_S = 10 };

static void help(void) {
    printf("Usage: deepwell launch -n N [--master-port P] -- COMMAND [ARGS...]\n\n"
           "Runs `deepwell COMMAND ARGS` as N processes on this node: ranks 0..N-1 of one job (data\n"
           "parallel training: `deepwell launch -n 2 -- train --model ... --batch B`, B sequences per\n"
           "rank). Each gets torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
           "MASTER_ADDR (127.0.0.1) and MASTER_PORT, where rank 0 holds the rendezvous; CPU ranks then\n"
           "talk over TCP through rank 0, GPU ranks over NCCL (one GPU per rank, by local rank).\n"
           "Every rank's log lines carry its rank; rank 0 prints progress and writes the run.\n\n"
           "  -n, --nproc N        ranks to start, 1..%d\n"
           "  --master-port P      the rendezvous port (default: a free one)\n"
           "  -h, --help           this help\n\n"
           "SIGINT, SIGTERM, SIGHUP and SIGUSR1 are passed on to every rank once (training finishes\n"
           "the step and checkpoints). When a rank fails, the others get SIGTERM (SIGKILL after %d s)\n"
           "and launch exits with the status of the first rank found failed. Under mpirun, srun or\n"
           "torchrun, start deepwell train directly instead: it reads their environment\n"
           "(docs/multi-gpu.md).\n",
           MAX_RANKS, GRACE_S);
}

static pid_t pids[MAX_RANKS];
static int nranks;
static volatile sig_atomic_t forwarded;

static void forward(int sig) { /* async-signal-safe: kill only */
    forwarded = sig;
    for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) kill(pids[r], sig);
}

/* A port nobody listens on now (the kernel's choice); 0 when none can be had. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* In the child: the rank's environment, then `deepwell ARGS`. Never returns. */
static void exec_rank(int rank, int port, char **args) {
    char v[32];
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the launcher killed: the ranks follow */
    setpgid(0, 0);                     /* a terminal's Ctrl-C reaches the launcher, which passes it on once */
    static const char *outer[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "OMPI_COMM_WORLD_LOCAL_SIZE"}; /* an enclosing mpirun is not this job */
    for (size_t i = 0; i < sizeof outer / sizeof outer[0]; i++) unsetenv(outer[i]);
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", nranks);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("MASTER_PORT", v, 1);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    execv("/proc/self/exe", args);
    fprintf(stderr, "deepwell launch: rank %d: cannot run /proc/self/exe: %s\n", rank, strerror(errno));
    _exit(127);
}

static int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

/* Waits for every rank; after the first failure, stops the rest. The code of the first rank found
 * failed (the others usually fail after it, hearing that it left). */
static int supervise(void) {
    int left = nranks, code = 0;
    double deadline = 0;
    while (left > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, deadline > 0 ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR) continue;
        if (pid < 0) break;
        if (pid == 0) { /* stopping the others: SIGKILL once the grace period is over */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            if ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec > deadline)
                for (int r = 0; r < nranks; r++)
                    if (pids[r] > 0) kill(pids[r], SIGKILL);
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
            continue;
        }
        int rank = 0;
        while (rank < nranks && pids[rank] != pid) rank++;
        if (rank == nranks) continue;
        pids[rank] = 0;
        left--;
        if (exit_code(status) != 0 && code == 0) {
            code = exit_code(status);
            if (left > 0 && !forwarded) {
                fprintf(stderr, "deepwell launch: rank %d exited with status %d; stopping the other %d rank(s)\n",
                        rank, code, left);
                for (int r = 0; r < nranks; r++)
                    if (pids[r] > 0) kill(pids[r], SIGTERM);
            }
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            deadline = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + GRACE_S;
        }
    }
    return code;
}

int cmd_launch(int argc, char **argv) {
    static const struct option longopts[] = {{"nproc", required_argument, 0, 'n'},
                                             {"master-port", required_argument, 0, 'p'},
                                             {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    long n = 0, port = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+n:h", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'h': help(); return DW_EXIT_OK;
        case 'n': ok = cli_parse_int(CMD, "-n", optarg, 1, MAX_RANKS, &n); break;
        case 'p': ok = cli_parse_int(CMD, "--master-port", optarg, 1, 65535, &port); break;
        default: return cli_usage_error(CMD);
        }
        if (!ok) return cli_usage_error(CMD);
    }
    if (!n || optind >= argc) {
        cli_error(CMD, "%s", !n ? "-n N (the number of ranks) is required" : "no command after the options: "
                                                                             "deepwell launch -n N -- train ...");
        return cli_usage_error(CMD);
    }
    if (!strcmp(argv[optind], "launch")) {
        cli_error(CMD, "the command to run N times cannot be launch itself");
        return cli_usage_error(CMD);
    }
    if (!port && !(port = free_port())) {
        cli_error(CMD, "no free local port for the rendezvous: give --master-port P");
        return DW_EXIT_IO;
    }
    /* argv for each rank: deepwell COMMAND ARGS... */
    char **args = calloc((size_t)(argc - optind + 2), sizeof *args);
    if (!args) return DW_EXIT_FAIL;
    args[0] = "deepwell";
    for (int i = optind; i < argc; i++) args[i - optind + 1] = argv[i];
    nranks = (int)n;
    fflush(stdout);
    fflush(stderr);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) sigaction(sigs[k], &sa, NULL);
    int code = 0;
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid == 0) exec_rank(r, (int)port, args);
        if (pid < 0) {
            fprintf(stderr, "deepwell launch: cannot start rank %d: %s\n", r, strerror(errno));
            for (int k = 0; k < r; k++) kill(pids[k], SIGTERM);
            code = DW_EXIT_FAIL;
            nranks = r;
            break;
        }
        pids[r] = pid;
    }
    int rc = supervise();
    free(args);
    return code ? code : rc;
}
