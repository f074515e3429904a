/* cmd_quantize.c — `deepwell quantize`: rewrites a safetensors checkpoint with one recipe in the
 * on-disk layout of shared/FORMATS.md (the work is dw_quantize_file's). */
#include <getopt.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("Usage: deepwell quantize --recipe R [--scale-rounding rceil|floor] [--pow2] [--in-place] IN.safetensors\n"
           "                         OUT.safetensors\n\n"
           "Quantises every qualifying tensor of IN with recipe R (exact CPU reference) and writes OUT\n"
           "atomically (temporary file, fsync, rename: a failed run leaves an existing OUT untouched).\n"
           "A tensor NAME qualifies when it is F32, BF16 or F16, 2-D [R, C] or 1-D [C] (written as\n"
           "[1, C]), non-empty, C is a multiple of the recipe's block (128 for fp8_block and\n"
           "fp8_block2d, 32 for the MX recipes, 16 for nvfp4) and, for fp8_block2d, R a multiple of 128.\n"
           "It is replaced by:\n"
           "  NAME          codes: F8_E4M3 [R, C] (F8_E5M2 for mxfp8_e5m2; U8 [R, C/2] for mxfp4 and\n"
           "                nvfp4: two FP4 codes per byte, the even column in the low nibble)\n"
           "  NAME.scale    scales, row-major, unswizzled: F32 [] (fp8_tensor), F32 [R] (fp8_row),\n"
           "                F32 [R, C/128] (fp8_block), F32 [R/128, C/128] (fp8_block2d),\n"
           "                U8 [R, C/32] UE8M0 (MX recipes), U8 [R, C/16] UE4M3 (nvfp4)\n"
           "  NAME.scale_2  nvfp4 only: the FP32 tensor scale, F32 []\n"
           "Other tensors are copied unchanged and listed on stderr with the reason. __metadata__ keeps\n"
           "the input's entries and records deepwell.recipe, deepwell.scale_rounding, deepwell.pow2.\n\n"
           "  --recipe R              fp8_tensor, fp8_row, fp8_block, fp8_block2d, mxfp8, mxfp8_e5m2,\n"
           "                          mxfp4, nvfp4 (see shared/FORMATS.md)\n"
           "  --scale-rounding MODE   MX recipes: rceil (default; cuBLAS/Transformer Engine) or floor\n"
           "                          (the OCP rule)\n"
           "  --pow2                  FP8 recipes (fp8_*): round every FP32 scale up to a power of two\n"
           "  --in-place              allow OUT to be IN (the same file, by any path): IN is replaced\n"
           "                          by its quantised version; without it that is refused\n"
           "  -h, --help              this help\n\n"
           "Exit status: 0 written, 2 bad arguments or malformed input, 3 I/O (IN unreadable, OUT not\n"
           "writable, a full disk), 1 other failures (deepwell --help has the table).\n");
}

static void notify(void *user, const dw_st_tensor_info *t, const char *why) {
    (void)user;
    if (why)
        fprintf(stderr, "deepwell quantize: copied unchanged: %s (%s, %d-D): %s\n", t->name, t->dtype, t->ndim,
                why);
}

int cmd_quantize(int argc, char **argv) {
    static const struct option opts[] = {{"recipe", required_argument, 0, 'r'},
                                         {"scale-rounding", required_argument, 0, 's'},
                                         {"pow2", no_argument, 0, 'p'},
                                         {"in-place", no_argument, 0, 'i'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    dw_quantize_opts o;
    dw_quantize_opts_init(&o, sizeof o);
    dw_recipe recipe = DW_RECIPE_COUNT;
    dw_scale_rounding rounding = DW_SCALE_RCEIL;
    bool rounding_given = false, in_place = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (!dw_recipe_parse(optarg, &recipe) || recipe == DW_RECIPE_BF16) {
                cli_error("quantize", "unknown recipe '%s' (fp8_tensor, fp8_row, fp8_block, "
                          "fp8_block2d, mxfp8, mxfp8_e5m2, mxfp4, nvfp4)", optarg);
                return DW_EXIT_USAGE;
            }
            break;
        case 's':
            if (!dw_scale_rounding_parse(optarg, &rounding)) {
                cli_error("quantize", "--scale-rounding expects rceil or floor, got '%s'", optarg);
                return DW_EXIT_USAGE;
            }
            rounding_given = true;
            break;
        case 'p': o.pow2 = true; break;
        case 'i': in_place = true; break;
        case 'h': help(); return DW_EXIT_OK;
        default: return cli_usage_error("quantize");
        }
    }
    if (recipe == DW_RECIPE_COUNT) {
        cli_error("quantize", "--recipe is required");
        return cli_usage_error("quantize");
    }
    if (argc - optind != 2) {
        cli_error("quantize", "expected IN.safetensors OUT.safetensors, got %d argument(s)", argc - optind);
        return cli_usage_error("quantize");
    }
    if (rounding_given && !dw_recipe_is_mx(recipe)) {
        cli_error("quantize", "--scale-rounding applies to the MX recipes (mxfp8, mxfp8_e5m2, mxfp4), not %s",
                  dw_recipe_name(recipe));
        return DW_EXIT_USAGE;
    }
    if (o.pow2 && dw_recipe_scale_bytes(recipe) != 4) {
        cli_error("quantize", "--pow2 applies to the FP8 recipes with FP32 scales (fp8_*), not %s",
                  dw_recipe_name(recipe));
        return DW_EXIT_USAGE;
    }
    o.recipe = recipe;
    o.rounding = rounding;
    const char *in = argv[optind], *out = argv[optind + 1];
    struct stat si, so;
    if (!in_place && stat(in, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        cli_error("quantize", "%s and %s are the same file: OUT would replace the checkpoint being quantised "
                  "(give --in-place to do that on purpose)", in, out);
        return DW_EXIT_USAGE;
    }
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_status s = dw_ctx_create(&co, &ctx);
    if (s != DW_OK) return cli_fail("quantize", NULL, s);
    dw_quantize_summary sum = {.size = sizeof sum};
    s = dw_quantize_file(ctx, in, out, &o, notify, NULL, &sum);
    int rc = DW_EXIT_OK;
    if (s != DW_OK) rc = cli_fail("quantize", ctx, s);
    else
        printf("%s: %s: %d tensor(s) quantised, %d copied unchanged; tensor data %.3f MB -> %.3f MB\n",
               out, dw_recipe_name(recipe), sum.quantized, sum.copied, sum.in_bytes / 1e6,
               sum.out_bytes / 1e6);
    dw_ctx_free(ctx);
    return rc;
}
