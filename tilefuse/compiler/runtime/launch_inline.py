"""A compiled graph's wrapper with its kept kernels' C launchers called in it, not through a function a launch.

A launch site that has kept its compiled kernel (:class:`tilefuse.kernels.launcher.SiteLauncher`) puts a bound
function where it was; each call of it reads its tensors' addresses, checks them and the profiler hooks, looks
up the stream and calls the C launcher. Across a wrapper call most of that is repeated work: the kernels of one
graph read the same tensors, and the hooks and the stream do not change within a call. :func:`inline_source`
rewrites the wrapper's source so that, for each bound site, its statement is the C launcher's call itself:

    def call(args):
        if _hooks():                                      # a profiler wants the JIT's launch path
            return _generic(args)
        _s0 = _stream(0)
        v_x, v_w = args
        p_v_x = v_x.data_ptr()
        p_v_w = v_w.data_ptr()
        if (p_v_x | p_v_w) & 15:                          # an input the kernels were not specialised for
            return _generic(args)
        args.clear()
        v_buf = alloc((64, 33), (33, 1), torch.float32)
        p_v_buf = v_buf.data_ptr()
        _launch_0(2, 1, 1, _s0, _function_0, 0, 0, None, None, _packed_0, None, None, None, p_v_x, p_v_w,
                  p_v_buf, 64, 33, _t_0_0)  # tfk_...

Each tensor's address is read once a call; an input's alignment is checked once, before anything runs (else the
whole call takes the generic wrapper, whose sites go to the JIT); a buffer the wrapper allocated is aligned by
the allocator; any other tensor (an ATen extern's output, a constant, the seeds) is checked at the launch, which
goes to the site's JIT path when it fails. Integer arguments are literals of the plan (one plan a shape), checked
against the kept specialisation here, once. ``_generic`` is the wrapper as first written: it stays the path for
hooks and unaligned inputs, and the readable source ``explain`` shows.
"""
from __future__ import annotations

import ast
import re

import torch

from ...kernels import launcher

_LAUNCH = re.compile(r"^    (launch_\w+)\((.*?)\)(  # .*)?$")
_UNPACK = re.compile(r"^    (.+) = args$")
_ALLOC = re.compile(r"^    (\w+) = alloc\(")


def bound_site(value) -> launcher.SiteLauncher | None:
    """The site whose bound launch function ``value`` is, else None."""
    site = getattr(value, "site", None)
    return site if site is not None and getattr(site, "fast", None) is value else None


def _arguments(site: launcher.SiteLauncher, text: str) -> list[str] | None:
    """The source texts of one launch statement's arguments, or None where the statement is not one this module
    can write as the C launcher's call (a tensor position that is not a variable, an argument that is neither,
    an integer of another specialisation class)."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError:
        return None
    if call.keywords or len(call.args) != site.fast.__code__.co_argcount:
        return None
    texts = []
    for i, node in enumerate(call.args):
        if i in site.aligned:
            if not isinstance(node, ast.Name):
                return None
        else:
            try:
                value = ast.literal_eval(node)
            except ValueError:
                return None
            if not isinstance(value, (int, float, bool)):
                return None
        texts.append(ast.unparse(node))
    for i, cls in site.ints:
        if launcher._int_class(ast.literal_eval(texts[i])) != cls:
            return None
    return texts


def inline_source(source: str, glb: dict) -> str | None:
    """``source`` (a wrapper as :class:`~.wrapper.WrapperWriter` writes it, before its device or errstate lines)
    with each bound site's launch written as its C launcher's call; the names it uses go into ``glb`` (the
    caller sets ``_generic``). None when no site is bound."""
    lines = source.splitlines()
    launches = {}
    for k, line in enumerate(lines):
        m = _LAUNCH.match(line)
        site = bound_site(glb.get(m.group(1))) if m else None
        texts = _arguments(site, m.group(2)) if site is not None else None
        if texts is not None:
            launches[k] = (m.group(1), site, texts, m.group(3) or "")
    if not launches:
        return None
    unpack = _UNPACK.match(lines[1]) if len(lines) > 1 else None
    inputs = [v.strip() for v in unpack.group(1).split(",") if v.strip() not in ("", "_")] if unpack else []
    allocated = {m.group(1) for m in map(_ALLOC.match, lines) if m}
    used = {texts[i] for _, site, texts, _ in launches.values() for i in site.aligned}
    glb["_hooks"], glb["_stream"] = launcher.hooks_installed, torch._C._cuda_getCurrentRawStream
    out = [lines[0], "    if _hooks():", "        return _generic(args)"]
    out += [f"    _s{i} = _stream({i})" for i in sorted({site.device_index for _, site, _, _ in launches.values()})]
    read = set()
    for k, line in enumerate(lines[1:], start=1):
        if k in launches:
            name, site, texts, comment = launches[k]
            tensors = [texts[i] for i in site.aligned]
            for t in dict.fromkeys(tensors):
                if t not in read:
                    out.append(f"    p_{t} = {t}.data_ptr()")
                    read.add(t)
            unchecked = [t for t in dict.fromkeys(tensors) if t not in allocated and t not in inputs]
            tag = name.removeprefix("launch")
            passed = [f"p_{t}" if i in site.aligned else t for i, t in enumerate(texts)]
            call = launcher.launch_call(site, passed, f"_s{site.device_index}", glb, tag)
            if unchecked:
                glb[f"_jit{tag}"] = site._jit
                out.append(f"    if ({' | '.join(f'p_{t}' for t in unchecked)}) & 15:")
                out.append(f"        _jit{tag}(({', '.join(texts)},))")
                out.append("    else:")
                out.append(f"        {call}{comment}")
            else:
                out.append(f"    {call}{comment}")
            continue
        out.append(line)
        if k == 1 and unpack:
            checked = [t for t in inputs if t in used]
            for t in checked:
                out.append(f"    p_{t} = {t}.data_ptr()")
                read.add(t)
            if checked:
                out.append(f"    if ({' | '.join(f'p_{t}' for t in checked)}) & 15:")
                out.append("        return _generic(args)")
    return "\n".join(out) + "\n"
