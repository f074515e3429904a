#!/usr/bin/env python3
"""preprocess.py SRC.cu OUT.cpp — rewrites CUDA C++ for the host emulator (cuda_runtime.h):
`kernel<<<grid, block[, smem[, stream]]>>>(args);` becomes
`dw_emu_launch(grid, block, smem, [&] { kernel(args); });` and
`extern __shared__ float sm[];` becomes a pointer to the launch's dynamic shared memory."""
import re
import sys


def split_top(s):
    """split s at top-level commas"""
    out, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{':
            depth += 1
        if ch in ')]}':
            depth -= 1
        if ch == ',' and depth == 0:
            out.append(cur.strip())
            cur = ''
        else:
            cur += ch
    out.append(cur.strip())
    return out


def match_paren(s, i):
    """s[i] == '(' : index of the matching ')'"""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == '(':
            depth += 1
        elif s[j] == ')':
            depth -= 1
            if depth == 0:
                return j
    raise SystemExit('unbalanced parentheses')


def kernel_start(s, i):
    """start of the kernel expression that ends right before s[i] (identifier + template args)"""
    j = i
    while j > 0 and s[j - 1].isspace():
        j -= 1
    if s[j - 1] == '>':
        depth = 0
        while True:
            j -= 1
            if s[j] == '>':
                depth += 1
            elif s[j] == '<':
                depth -= 1
                if depth == 0:
                    break
    while j > 0 and (s[j - 1].isalnum() or s[j - 1] in '_:'):
        j -= 1
    return j


def rewrite(src):
    src = re.sub(r'extern __shared__ (\w+) (\w+)\[\];',
                 r'\1 *\2 = (\1 *)dw_emu_dyn_smem;', src)
    while True:
        i = src.find('<<<')
        if i < 0:
            return src
        k0 = kernel_start(src, i)
        kernel = src[k0:i].strip()
        e = src.find('>>>', i)
        cfg = split_top(src[i + 3:e])
        p = src.index('(', e)
        q = match_paren(src, p)
        args = src[p + 1:q]
        smem = cfg[2] if len(cfg) > 2 else '0'
        call = 'dw_emu_launch(%s, %s, %s, [&] { %s(%s); })' % (cfg[0], cfg[1], smem, kernel, args)
        src = src[:k0] + call + src[q + 1:]


if __name__ == '__main__':
    text = open(sys.argv[1]).read()
    open(sys.argv[2], 'w').write(rewrite(text))
