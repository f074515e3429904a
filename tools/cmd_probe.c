/* cmd_probe.c — `deepwell probe`: this machine's hardware, a datasheet preset, or a saved file,
 * as a readable table or as JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("Usage: deepwell probe [--json] [--preset NAME [--nodes N] | --hw FILE] [--list-presets]\n\n"
           "Detects this machine's GPUs through the CUDA runtime (NVLink state through NVML when\n"
           "present) and prints them. With no GPU or driver it prints zero GPUs and a notice.\n\n"
           "  --json           print one JSON object (the schema `dw_hw_load` reads back)\n"
           "  --preset NAME    describe a machine we don't have, from datasheet figures\n"
           "  --nodes N        number of nodes for --preset (default 1)\n"
           "  --hw FILE        load a hardware JSON file written by `deepwell probe --json`\n"
           "  --list-presets   list the presets and exit\n"
           "  -h, --help       this help\n");
}

static void print_bytes(char *buf, size_t n, double bytes) {
    if (bytes < 0) snprintf(buf, n, "?");
    else snprintf(buf, n, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
}

static void print_gpus(const dw_hw *hw, const dw_hw_info *m) {
    printf("\n%-3s %-26s %-4s %4s %10s %10s %6s %6s %7s %7s %-s\n", "#", "name", "cc", "SMs", "HBM",
           "free", "SM MHz", "memMHz", "L2", "smem", "features");
    for (int i = 0; i < m->gpus; i++) {
        dw_gpu_info g = {.size = sizeof g};
        dw_hw_get_gpu(hw, i, &g);
        char hbm[32], fr[32], feat[128] = "";
        print_bytes(hbm, sizeof hbm, (double)g.hbm_bytes);
        print_bytes(fr, sizeof fr, (double)g.hbm_free_bytes);
        const struct { bool on; const char *name; } fs[] = {
            {g.wgmma, "wgmma"}, {g.fp8, "fp8"}, {g.tcgen05, "tcgen05"},
            {g.tmem, "tmem"},   {g.mx_block_scaling, "mx"}, {g.fp4, "fp4"}};
        for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++)
            if (fs[k].on) {
                strncat(feat, feat[0] ? "," : "", sizeof feat - strlen(feat) - 1);
                strncat(feat, fs[k].name, sizeof feat - strlen(feat) - 1);
            }
        printf("%-3d %-26.26s %d.%-2d %4d %10s %10s %6d %6d %5.0fMB %5lluKB %s\n", g.index, g.name,
               g.cc_major, g.cc_minor, g.sms, hbm, fr, g.sm_clock_mhz, g.mem_clock_mhz,
               g.l2_bytes / 1e6, (unsigned long long)(g.smem_optin_bytes / 1024), feat);
    }
    printf("\n%-3s %-9s %-9s %-9s %-9s %-s\n", "#", "BF16 TF", "FP8 TF", "FP4 TF", "HBM GB/s",
           "NVLink (links/active)");
    for (int i = 0; i < m->gpus; i++) {
        dw_gpu_info g = {.size = sizeof g};
        dw_hw_get_gpu(hw, i, &g);
        char nv[32];
        if (g.nvlink_links < 0) snprintf(nv, sizeof nv, "unknown (no NVML)");
        else snprintf(nv, sizeof nv, "%d/%d", g.nvlink_links, g.nvlink_active);
        printf("%-3d %-9.0f %-9.0f %-9.0f %-9.0f %s\n", g.index, g.peak_bf16_tflops, g.peak_fp8_tflops,
               g.peak_fp4_tflops, g.hbm_gbps, nv);
    }
}

static void print_peers(const dw_hw *hw, int n) {
    printf("\npeer access (rank):\n    ");
    for (int j = 0; j < n; j++) printf(" %5d", j);
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("%3d ", i);
        for (int j = 0; j < n; j++) {
            dw_peer_link l = {.size = sizeof l};
            if (i == j) printf(" %5s", "-");
            else if (dw_hw_get_peer(hw, i, j, &l) == DW_OK && l.access) printf("   Y(%d)", l.perf_rank);
            else printf(" %5s", "N");
        }
        printf("\n");
    }
}

static void print_table(const dw_hw *hw) {
    dw_hw_info m = {.size = sizeof m};
    dw_hw_get_info(hw, &m);
    printf("source: %s%s%s\n", m.source, m.preset[0] ? " " : "", m.preset);
    if (m.label[0]) printf("note:   %s\n", m.label);
    char ram[32];
    print_bytes(ram, sizeof ram, (double)m.host_ram_bytes);
    if (m.host_cpus > 0) printf("host:   %d CPUs, %s RAM\n", m.host_cpus, ram);
    printf("nodes:  %d x %d GPU(s); NVLink domain %d", m.nodes, m.gpus, m.nvlink_domain);
    if (m.nvlink_gbps > 0) printf(", NVLink %.0f GB/s/dir", m.nvlink_gbps);
    if (m.internode_gbps > 0) printf(", inter-node %.0f GB/s/GPU", m.internode_gbps);
    printf("\n");
    if (m.gpus == 0) {
        printf("gpus:   none (%s)\n", m.notice[0] ? m.notice : "no GPU");
        return;
    }
    print_gpus(hw, &m);
    if (!strcmp(m.source, "probe")) printf("(peak rates derived from SMs x clock x architecture, not measured)\n");
    if (m.gpus > 1) print_peers(hw, m.gpus);
}

int cmd_probe(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"preset", required_argument, 0, 'p'},
                                         {"nodes", required_argument, 0, 'n'},
                                         {"hw", required_argument, 0, 'f'},
                                         {"list-presets", no_argument, 0, 'l'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false, list = false;
    const char *preset = NULL, *file = NULL;
    long nodes = 1;
    bool nodes_given = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'p': preset = optarg; break;
        case 'n':
            if (!cli_parse_int("probe", "--nodes", optarg, 1, 1000000, &nodes)) return DW_EXIT_USAGE;
            nodes_given = true;
            break;
        case 'f': file = optarg; break;
        case 'l': list = true; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("probe");
        }
    }
    if (optind < argc) {
        cli_error("probe", "unexpected argument '%s'", argv[optind]);
        return cli_usage_error("probe");
    }
    if (list) {
        for (int i = 0; i < dw_hw_preset_count(); i++)
            printf("%-12s %s\n", dw_hw_preset_name(i), dw_hw_preset_description(i));
        return DW_EXIT_OK;
    }
    if (preset && file) {
        cli_error("probe", "--preset and --hw cannot be used together");
        return DW_EXIT_USAGE;
    }
    if (nodes_given && !preset) {
        cli_error("probe", "--nodes applies to --preset only");
        return DW_EXIT_USAGE;
    }
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("probe", NULL, s);
    dw_hw *hw = NULL;
    if (preset) s = dw_hw_preset(ctx, preset, (int)nodes, &hw);
    else if (file) s = dw_hw_load(ctx, file, &hw);
    else s = dw_probe(ctx, &hw);
    if (s != DW_OK) {
        int rc = cli_fail("probe", ctx, s);
        dw_ctx_free(ctx);
        return rc;
    }
    if (!preset && !file && dw_hw_gpu_count(hw) == 0)
        fprintf(stderr, "deepwell probe: no GPUs: %s\n", dw_hw_notice(hw) ? dw_hw_notice(hw) : "none found");
    int rc = DW_EXIT_OK;
    if (json) {
        char *text = NULL;
        s = dw_hw_to_json(ctx, hw, true, &text);
        if (s == DW_OK) printf("%s\n", text);
        else rc = cli_fail("probe", ctx, s);
        dw_free_string(text);
    } else {
        print_table(hw);
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
    return rc;
}
