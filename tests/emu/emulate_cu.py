#!/usr/bin/env python3
"""Turns a CUDA source file into C++ that runs its kernels on the CPU (tests/emu/cuda_emu.hpp).

usage: emulate_cu.py IN.cu OUT.cpp

Each launch `name<targs><<<config>>>(args)` becomes `::hpc::emu::launch(name<targs>, config)(args)`,
and each `__shared__` declaration is followed (on its line) by the call that fills its
variables with garbage once per block; everything else is left as it is, lines included, so
that the compiler's messages name the .cu file's own lines (#line). A launch or declaration
this cannot take apart is an error naming its line.
"""
import os
import re
import sys

OPEN, CLOSE = "<<<", ">>>"


def fail(path, text, at, why):
    line = text.count("\n", 0, at) + 1
    sys.exit(f"emulate_cu.py: {path}:{line}: {why}")


def kernel_start(path, text, end):
    """Where the kernel's name (with its template arguments) that ends at `end` begins."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if i > 0 and text[i - 1] == ">":  # template arguments: back to their '<'
        depth = 0
        while i > 0:
            i -= 1
            if text[i] == ">":
                depth += 1
            elif text[i] == "<":
                depth -= 1
                if depth == 0:
                    break
        else:
            fail(path, text, end, "unbalanced template arguments before <<<")
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_:"):
        j -= 1
    if j == i:
        fail(path, text, end, "no kernel name before <<<")
    return j


def closing_paren(path, text, open_at):
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    fail(path, text, open_at, "a launch's arguments never close")


SHARED = "__shared__"


def declared_names(path, text, at, end):
    """The names a declaration `__shared__ T a[..][..], b;` (text[at:end]) declares. A comma
    separates two only outside brackets and outside the type's template arguments (angle
    brackets count only outside the others: `[a < b ? 1 : 2]` is a bound, not an argument list)."""
    names, depth, angles, part = [], 0, 0, []
    for ch in text[at + len(SHARED):end] + ",":
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        elif depth == 0 and ch == "<":
            angles += 1
        elif depth == 0 and ch == ">":
            angles -= 1
        if ch == "," and depth == 0 and angles == 0:
            words = re.findall(r"[A-Za-z_]\w*", "".join(part).split("[")[0].split("=")[0])
            if not words:
                fail(path, text, at, "a __shared__ declaration without a name")
            names.append(words[-1])
            part = []
        else:
            part.append(ch)
    return names


def garble_shared(path, text):
    """After each `__shared__` declaration (in a function), on the same line: its variables filled
    with garbage by the first of each block's threads to reach it, as a GPU's shared memory holds
    whatever was there before (cuda_emu.hpp's fresh_shared)."""
    out, done, count = [], 0, 0
    for m in re.finditer(r"\b" + SHARED + r"\b", text):
        if m.start() < done:
            continue
        line_start = text.rfind("\n", 0, m.start()) + 1
        if "//" in text[line_start:m.start()] or "#define" in text[line_start:m.start()]:
            continue  # a comment, or the macro that defines it
        end = text.find(";", m.start())
        if end < 0:
            fail(path, text, m.start(), "a __shared__ declaration without its ';'")
        marks = []
        for name in declared_names(path, text, m.start(), end):
            count += 1
            mark = f"hpc_emu_shared_mark_{count}"
            marks.append(f" static unsigned long long {mark} = 0; ::hpc::emu::fresh_shared({mark}, &{name}, sizeof {name});")
        out.append(text[done:end + 1] + "".join(marks))
        done = end + 1
    out.append(text[done:])
    return "".join(out)


def emulate(path, text):
    out, done = [], 0
    while True:
        at = text.find(OPEN, done)
        if at < 0:
            break
        start = kernel_start(path, text, at)
        close = text.find(CLOSE, at)
        if close < 0:
            fail(path, text, at, "<<< without >>>")
        paren = close + len(CLOSE)
        while paren < len(text) and text[paren].isspace():
            paren += 1
        if paren >= len(text) or text[paren] != "(":
            fail(path, text, at, "no arguments after >>>")
        end = closing_paren(path, text, paren)
        out.append(text[done:start])
        # The newlines inside the launch stay where they were: the lines after it keep their numbers.
        name = text[start:at]
        config = text[at + len(OPEN):close]
        spacing = text[close + len(CLOSE):paren]
        out.append(f"::hpc::emu::launch({name}, {config}){spacing}{text[paren:end + 1]}")
        done = end + 1
    out.append(text[done:])
    return "".join(out)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: emulate_cu.py IN.cu OUT.cpp")
    source, target = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    body = emulate(source, garble_shared(source, text))
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    tmp = target + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write('#include "emu/cuda_emu.hpp"  // first: the device built-ins\n')
        f.write(f'#line 1 "{os.path.abspath(source)}"\n')
        f.write(body)
    os.replace(tmp, target)


if __name__ == "__main__":
    main()
