#!/usr/bin/env python3
"""transform.py SRC_DIR OUT_DIR — copies quant_common.cuh, quant_bulk.cu and ../../core/async_copy.cuh
(SRC_DIR is src/kernels/cuda) for the host emulator: the bodies of the inline-PTX helpers become calls
of shim.h's stand-ins, the dynamic shared-memory declaration a pointer to the launch's buffer, and
launches go through the emulator's preprocess.py."""
import os
import subprocess
import sys


def replace_body(s, name, body):
    i = s.index(' ' + name + '(')  # the definition comes before any use
    j = s.index('{', i)
    depth = 0
    for k in range(j, len(s)):
        if s[k] == '{':
            depth += 1
        elif s[k] == '}':
            depth -= 1
            if depth == 0:
                return s[:j] + '{ ' + body + ' }' + s[k + 1:]
    raise SystemExit('unbalanced braces after ' + name)


src, out = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(out, 'inc/kernels/cuda'), exist_ok=True)
c = open(os.path.join(src, 'quant_common.cuh')).read()
# its FP8 pair conversions (kernels/cuda/fp8_cvt.cuh) come from the emulator's stand-in on the include path
open(os.path.join(out, 'inc/kernels/cuda/quant_common.cuh'), 'w').write(c)
# core/tensor_map.cuh needs the driver's types: its one function over shim.h's maps instead
os.makedirs(os.path.join(out, 'inc/core'), exist_ok=True)
open(os.path.join(out, 'inc/core/tensor_map.cuh'), 'w').write(
    'inline bool dw_make_map_2d(CUtensorMap *m, const void *base, CUtensorMapDataType t, int esize, int64_t rows,\n'
    '                           int64_t cols, int64_t ld, uint32_t box_c, uint32_t box_r, CUtensorMapSwizzle sw) {\n'
    '    return sw == CU_TENSOR_MAP_SWIZZLE_NONE && emu_make_map_2d(m, t, base, rows, cols, ld * esize, box_r, box_c);\n'
    '}\n')
# core/async_copy.cuh's PTX primitives: their bodies become shim.h's stand-ins
a = open(os.path.join(src, '../../core/async_copy.cuh')).read()
for name, body in [('mbar_init', 'emu_mbar_init(bar, count);'), ('mbar_init_fence', ''),
                   ('mbar_expect_tx', 'emu_mbar_arrive_tx(bar, bytes);'), ('mbar_arrive', 'emu_mbar_arrive(bar);'),
                   ('mbar_wait', 'emu_mbar_wait(bar, parity);'), ('tma_load_2d', 'emu_tma_load_2d(dst, map, c0, c1, bar);'),
                   ('bulk_g2s', 'emu_bulk(dst, src, bytes, bar);'), ('tma_store_2d', 'emu_tma_store_2d(map, c0, c1, src);'),
                   ('bulk_s2g', 'emu_bulk_s2g(dst, src, bytes);'), ('bulk_commit', ''),
                   ('bulk_wait_read', 'emu_bulk_wait();'), ('bulk_wait_all', 'emu_bulk_wait();'),
                   ('fence_proxy_async', ''), ('elect_one', 'return dw_emu_lane() == 0;'),
                   ('cp_async_4', 'memcpy(dst, src, 4);'),  # the copy lands at once, then its arrival
                   ('cp_async_arrive', 'emu_mbar_arrive(bar);')]:
    a = replace_body(a, name, body)
a = a.replace('#include <cudaTypedefs.h>', '')  # shim.h has the tensor-map type
if 'asm' in a:
    raise SystemExit('inline asm left in core/async_copy.cuh: add its stand-in to transform.py and shim.h')
open(os.path.join(out, 'inc/core/async_copy.cuh'), 'w').write(a)
b = open(os.path.join(src, 'quant_bulk.cu')).read()
for name, body in [('consumers_sync', 'emu_named_bar(BK_CONS);'), ('vmax2', 'return emu_vmax2(a, b);'),
                   ('l2_keep_policy', 'return 0;')]:
    b = replace_body(b, name, body)
# st_keep's overloads (b32, v2, v4): plain stores of v
n = b.count('void st_keep(')
i = 0
for _ in range(n):
    i = b.index('void st_keep(', i)
    b = b[:i] + replace_body(b[i:], 'st_keep', '(void)pol; memcpy(d, &v, sizeof v);')
    i += len('void st_keep(')
b = b.replace('#include <cudaTypedefs.h>', '')  # shim.h has the tensor-map type
b = b.replace('extern __shared__ __align__(128) unsigned char smem[];',
              'unsigned char *smem = (unsigned char *)dw_emu_dyn_smem;')
if 'asm' in b:
    raise SystemExit('inline asm left in quant_bulk.cu: add its stand-in to transform.py and shim.h')
open(os.path.join(out, 'quant_bulk_pre.cu'), 'w').write(b)
subprocess.check_call([sys.executable, os.path.join(out, 'emu/preprocess.py'), os.path.join(out, 'quant_bulk_pre.cu'),
                       os.path.join(out, 'quant_bulk.cpp')])
