/* main.c — the `deepwell` command-line tool: dispatches to one subcommand per file and checks,
 * after each, that its standard output was written (cli_finish). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
#define DW_COMMAND(name, fn, summary) {#name, fn, summary},
#include "commands.h"
#undef DW_COMMAND
};

static void usage(FILE *out) {
    fprintf(out,
            "deepwell %s — train transformer models on NVIDIA GPUs in low precision\n\n"
            "Usage: deepwell <command> [options]   (deepwell <command> --help for its options)\n\n"
            "Commands:\n",
            dw_version_string());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nEnvironment: DW_LOG=debug|info|warn|error|off sets the log level (default info).\n\n%s",
            cli_exit_table);
}

int main(int argc, char **argv) {
    cli_io_init(); /* a closed stderr or stdout pipe fails writes, it does not kill a training run */
    if (argc < 2) {
        usage(stderr);
        return DW_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return cli_finish("--help", DW_EXIT_OK);
    }
    if (!strcmp(cmd, "--version")) {
        printf("deepwell %s\n", dw_version_string());
        return cli_finish("--version", DW_EXIT_OK);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) /* every command's output checked */
        if (!strcmp(cmd, commands[i].name)) return cli_finish(cmd, commands[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "deepwell: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return DW_EXIT_USAGE;
}
