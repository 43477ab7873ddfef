"""The results page: benchmark CSV rows (and a ``tilefuse targets --json`` file) rendered as ONE self-contained
HTML file. Plots are drawn with matplotlib and embedded as base64 PNG; the page loads nothing from anywhere.

Sections follow the reference article's analysis, each measured: the CUDA C++ ladder rung by rung against
cuBLAS; Triton against CUDA C++ (lines of code against % of cuBLAS); GEMM shapes and fused epilogues; the
compiler against eager and Inductor (op graphs, then models and attention where their suites' CSVs are given);
compile times; the cross-vendor target matrix. A section whose suite is not among the inputs says "not run".

Ratios are always "× PEER (PEER time / tilefuse time)": above 1 means tilefuse is faster.
"""
from __future__ import annotations

import ast
import base64
import collections
import html
import io
import re
from pathlib import Path
from typing import Iterable, Sequence

from . import harness

PACKAGE = Path(__file__).resolve().parents[1]

# The ladder's implementations in the order of the ladder, with what each adds.
LADDER_IMPLS = {
    "rung1": "naive",
    "rung2": "coalesced",
    "rung3": "shared-memory tiling",
    "rung4": "register blocking",
    "rung5": "warp tiling",
    "rung5s": "split-K over a warp (portable, skinny M)",
    "rung6": "mma.sync + cp.async + swizzle",
    "rung7": "TMA + wgmma",
    "rung8": "warp-specialised",
    "rung9": "persistent, cluster multicast, TMA store",
    "triton": "tilefuse Triton GEMM",
}
PEERS = ("cublas", "cublas_nt")
REFERENCE_SHAPE = "4096x4096x4096"  # the square shape every ladder suite times; the article's comparisons use it

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#1b1b1b;line-height:1.45}
h1{font-size:1.7em}h2{margin-top:2em;border-bottom:1px solid #ccc;padding-bottom:.2em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.8em 0;font-size:.86em}th,td{border:1px solid #ccc;padding:.25em .55em}
th{background:#f2f2f2;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.good{background:#e7f5e7}td.bad{background:#fbe9e9}td.off{color:#888}
img{max-width:100%;border:1px solid #ddd;margin:.6em 0}.note{color:#555;font-size:.9em}
.wide{overflow-x:auto}code{background:#f4f4f4;padding:0 .2em}.claim{border-left:3px solid #999;padding-left:.8em;color:#333}
"""


# ------------------------------------------------------------------------------------------------ helpers
def esc(text) -> str:
    return html.escape(str(text), quote=True)


def shape_of(case: str) -> str:
    return case.split("/")[-1]


def kind_of(case: str) -> str:
    return case.split("/")[0]


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return ""
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


SPREAD = 0.02  # run-to-run spread on the H200 (DESIGN.md): a ratio within 2 % of 1.00 is at parity


def ratio_class(value: float) -> str:
    return "good" if value >= 1.0 else "" if value >= 1.0 - SPREAD else "bad"


def ratio_cell(value: float | None) -> str:
    if value is None:
        return '<td class="n off">–</td>'
    return f'<td class="n {ratio_class(value)}">{value:.3f}×</td>'


def num_cell(value: float | None, digits: int = 3) -> str:
    return f'<td class="n">{_num(value, digits)}</td>' if value is not None else '<td class="n off">–</td>'


def status_cell(row: harness.Row | None) -> str:
    if row is None:
        return '<td class="off">–</td>'
    return f'<td class="off" title="{esc(row.status)}">{esc(row.status.split(":")[0])}</td>'


def table(head: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """``body``: rows of ready-made ``<td>`` cells (strings beginning with <td) or plain text."""
    out = ['<div class="wide"><table><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for cells in body:
        out.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def figure_png(fig) -> str:
    """A matplotlib figure as an inline <img> (base64 PNG); the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    title = fig.axes[0].get_title() if fig.axes else "plot"
    try:  # a plot has few colours: a 256-colour palette keeps it exact to the eye at a third of the bytes
        from PIL import Image

        small = io.BytesIO()
        Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(256).save(small, format="PNG", optimize=True)
        buf = small
    except ImportError:
        pass
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{esc(title)}" src="data:image/png;base64,{data}">'


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def parse_note(note: str) -> dict[str, str]:
    """``key=value`` fields of a row's note (the models suite writes them)."""
    return dict(re.findall(r"([A-Za-z_][\w.-]*)=([^\s;,]+)", note or ""))


def geomean_line(label: str, ratios: list[float]) -> str:
    gm = harness.geomean(ratios)
    if not gm:
        return ""
    return (f"<p><b>{esc(label)}</b>: geomean {gm:.3f}× over {len(ratios)} cases, "
            f"min {min(ratios):.3f}×, max {max(ratios):.3f}×.</p>")


# ---------------------------------------------------------------------------------------- lines of code
def code_lines_cpp(text: str) -> int:
    """Lines of C++ that are neither blank nor only a comment."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("//"))


# Headers that hold one group of rungs' own kernel code (hopper.cuh: the TMA / mbarrier / wgmma helpers rungs 7-9
# each carried until they were shared): counted with every rung that includes them, so a rung's figure stays the
# code it takes to write that rung.
KERNEL_HEADERS = ("hopper.cuh",)


def rung_source_lines(rung: str, cuda_dir: Path = PACKAGE / "cuda" / "ladder") -> int | None:
    """Code lines of a rung's .cu file (kernel, host launch and C entry point) and of the kernel headers it
    includes (:data:`KERNEL_HEADERS`); the headers every rung shares, such as common.cuh's bf16 helpers and the
    C ABI, are not counted."""
    files = sorted(cuda_dir.glob(f"rung{rung}_*.cu"))
    if not files:
        return None
    text = files[0].read_text()
    included = set(re.findall(r'^\s*#\s*include\s*"([^"]+)"', text, re.M))
    return code_lines_cpp(text) + sum(code_lines_cpp((cuda_dir / h).read_text())
                                      for h in KERNEL_HEADERS if h in included and (cuda_dir / h).exists())


def triton_gemm_lines(kernels_dir: Path = PACKAGE / "kernels") -> int | None:
    """Code lines of the ``@triton.jit`` functions in the GEMM family's modules (docstrings, comments and blank
    lines left out): the Triton GEMM's kernel code, the counterpart of a rung's .cu file."""
    total = 0
    for path in sorted(kernels_dir.rglob("*.py")):
        if "gemm" not in str(path.relative_to(kernels_dir)):
            continue
        source = path.read_text()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            if not any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            doc = set()
            body0 = node.body[0] if node.body else None
            if isinstance(body0, ast.Expr) and isinstance(getattr(body0, "value", None), ast.Constant):
                doc = set(range(body0.lineno, body0.end_lineno + 1))
            for n in range(node.lineno, node.end_lineno + 1):
                text = lines[n - 1].strip()
                if n not in doc and text and not text.startswith("#"):
                    total += 1
    return total or None


# -------------------------------------------------------------------------------------------- sections
class Page:
    def __init__(self, sources: Sequence[tuple[str, list[harness.Row]]], targets: dict | None,
                 targets_path: str | None):
        self.sources = sources
        self.targets, self.targets_path = targets, targets_path
        self.by_suite: dict[str, list[harness.Row]] = collections.defaultdict(list)
        self.files: dict[str, list[str]] = collections.defaultdict(list)
        for path, rows in sources:
            for suite in dict.fromkeys(r.suite for r in rows):
                self.files[suite].append(path)
            for row in rows:
                self.by_suite[row.suite].append(row)

    def source_note(self, suite: str) -> str:
        rows = self.by_suite[suite]
        envs = sorted({(r.gpu, r.torch, r.triton, r.git_sha, r.date) for r in rows})
        env = "; ".join(f"{g or '?'}, torch {t or '?'}, triton {tr or '?'}, commit {s or '?'}, {d or '?'}"
                        for g, t, tr, s, d in envs)
        files = ", ".join(f"<code>{esc(f)}</code>" for f in self.files[suite])
        return f'<p class="note">From {files} ({esc(env)}).</p>'

    # .................................................................................... CUDA ladder
    def ladder(self) -> str:
        out = ['<h2 id="ladder">1. The CUDA C++ ladder, rung by rung, against cuBLAS</h2>']
        rows = self.by_suite.get("ladder")
        if not rows:
            return out[0] + "<p>Not run: no ladder suite CSV among the inputs.</p>"
        out.append(self.source_note("ladder"))
        out.append("<p>Each rung adds one technique to the one before it (CUDA C++ under <code>tilefuse/cuda/</code>). "
                   "Every rung is timed in the same process, on the same inputs, as cuBLAS. The rungs that read B "
                   "K-major are compared with cuBLAS on that layout (<code>cublas_nt</code>).</p>")
        by = {(r.case, r.impl): r for r in rows}
        shapes = list(dict.fromkeys(r.case for r in rows))
        impls = [i for i in LADDER_IMPLS if any(r.impl == i for r in rows)]
        plt = _plt()
        fig, ax = plt.subplots(figsize=(9, 4.8))
        for case in shapes:
            xs, ys = [], []
            for k, impl in enumerate(impls):
                r = by.get((case, impl))
                if r is not None and r.ok and r.tflops:
                    xs.append(k)
                    ys.append(r.tflops)
            line, = ax.plot(xs, ys, marker="o", label=shape_of(case))
            peer = by.get((case, "cublas"))
            if peer is not None and peer.ok and peer.tflops:
                ax.axhline(peer.tflops, color=line.get_color(), linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(impls)), impls, rotation=30, ha="right")
        ax.set_xlabel("implementation (ladder rung; dashed: cuBLAS at the same shape)")
        ax.set_ylabel("TFLOP/s (log scale)")
        ax.set_title("CUDA C++ ladder against cuBLAS (bf16): TFLOP/s rung by rung")
        ax.legend(title="M x N x K", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        out.append(figure_png(fig))
        head = ["rung", "what it adds"] + [f"{shape_of(c)}: TFLOP/s (× peer)" for c in shapes]
        body = []
        for impl in [*PEERS, *impls]:
            if not any(r.impl == impl for r in rows):
                continue
            cells = [impl, LADDER_IMPLS.get(impl, "the peer")]
            for case in shapes:
                r = by.get((case, impl))
                if r is None or not r.ok or r.tflops is None:
                    cells.append(status_cell(r))
                elif r.vs_baseline is None or not r.baseline:
                    cells.append(f'<td class="n">{_num(r.tflops, 1)}</td>')
                else:
                    cls = ratio_class(r.vs_baseline)
                    cells.append(f'<td class="n {cls}">{_num(r.tflops, 1)} ({r.vs_baseline:.3f}×)</td>')
            body.append(cells)
        out.append(table(head, body))
        peers = sorted({r.baseline for r in rows if r.baseline})
        out.append(f'<p class="note">× peer = peer time / rung time, the peer being {", ".join(peers)} as each row '
                   "says (rungs 7–9 read B K-major: <code>cublas_nt</code>). Above 1: faster than cuBLAS.</p>")
        return "\n".join(out)

    # ....................................................................... Triton against CUDA C++
    def triton_vs_cuda(self) -> str:
        out = ['<h2 id="triton-vs-cuda">2. Triton against CUDA C++: lines of code against % of cuBLAS</h2>']
        rows = self.by_suite.get("ladder")
        if not rows:
            return out[0] + "<p>Not run: this comparison reads the ladder suite's CSV, which is not among the inputs.</p>"
        by = {(shape_of(r.case), r.impl): r for r in rows}
        shapes = list(dict.fromkeys(shape_of(r.case) for r in rows))
        shape = REFERENCE_SHAPE if REFERENCE_SHAPE in shapes else shapes[0]
        points = []
        for impl in LADDER_IMPLS:
            r = by.get((shape, impl))
            if r is None or not r.ok or r.vs_baseline is None:
                continue
            noted = re.search(r"(\d+) lines of code", r.note or "")  # the suite's count at the measured commit
            loc = int(noted.group(1)) if noted else (
                triton_gemm_lines() if impl == "triton" else rung_source_lines(impl[len("rung"):]))
            if loc:
                points.append((impl, loc, 100.0 * r.vs_baseline, r.baseline))
        out.append(self.source_note("ladder"))
        out.append('<p class="claim">The reference article: a Triton GEMM "delivers 85–95 % of CUTLASS performance '
                   'with 10× less code"; hand-written CUDA C++ reaches the peak "but requires hundreds of lines of '
                   'brittle, architecture-specific" code.</p>')
        if not points:
            return "\n".join(out + [f"<p>Not run: no timed rung at {esc(shape)}.</p>"])
        plt = _plt()
        fig, ax = plt.subplots(figsize=(8, 4.8))
        for impl, loc, pct, _ in points:
            ax.scatter([loc], [pct], s=40, color="tab:orange" if impl == "triton" else "tab:blue")
            ax.annotate(impl, (loc, pct), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel("lines of kernel code (log scale; comments and blank lines not counted)")
        ax.set_ylabel("% of cuBLAS (peer time / time x 100, log scale)")
        ax.set_title(f"Lines of code against % of cuBLAS at {shape} (bf16)")
        ax.grid(True, which="both", alpha=0.3)
        out.append(figure_png(fig))
        out.append(table(["implementation", "what it is", "lines of code", "% of cuBLAS", "peer"],
                         [[impl, LADDER_IMPLS[impl], f'<td class="n">{loc}</td>', num_cell(pct, 1), peer]
                          for impl, loc, pct, peer in points]))
        found = {p[0]: p for p in points}
        if "triton" in found and "rung9" in found:
            t, c = found["triton"], found["rung9"]
            out.append(f"<p>Measured: the Triton GEMM's kernels are {t[1]} lines at {t[2]:.1f} % of cuBLAS; rung 9 "
                       f"is {c[1]} lines at {c[2]:.1f} %: the Triton GEMM reaches {100 * t[2] / c[2]:.0f} % of the "
                       f"best CUDA C++ rung with {c[1] / t[1]:.1f}× less code.</p>")
        out.append('<p class="note">Lines of code, comments and blank lines left out: a rung\'s <code>.cu</code> '
                   "file (kernel, launch and C entry point; headers shared by several rungs not counted), as the "
                   "suite's CSV notes them for the measured commit; the Triton GEMM's <code>@triton.jit</code> "
                   "functions in the GEMM family (every config, stream-K, fused epilogues), counted from this "
                   "checkout's sources when the page was rendered.</p>")
        return "\n".join(out)

    # ........................................................................ GEMM shapes, epilogues
    def gemm(self) -> str:
        out = ['<h2 id="gemm">3. The Triton GEMM library: shapes and fused epilogues</h2>']
        rows = self.by_suite.get("gemm")
        if not rows:
            return out[0] + "<p>Not run: no gemm suite CSV among the inputs.</p>"
        out.append(self.source_note("gemm"))
        ours = [r for r in rows if r.impl == "tilefuse"]
        plain = [r for r in ours if not kind_of(r.case).startswith("bias_")]
        fused = [r for r in ours if kind_of(r.case).startswith("bias_")]
        by = {(r.case, r.impl): r for r in rows}
        plt = _plt()
        if plain:
            rated = [r for r in plain if r.ok and r.vs_baseline is not None]
            fig, ax = plt.subplots(figsize=(9, max(3.0, 0.22 * len(rated) + 1.2)))
            colors = {"bfloat16": "tab:blue", "float16": "tab:green"}
            ax.barh(range(len(rated)), [r.vs_baseline for r in rated],
                    color=[colors.get(r.dtype, "tab:purple") for r in rated])
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.set_yticks(range(len(rated)), [f"{kind_of(r.case)} {r.dtype} {shape_of(r.case)}" for r in rated],
                          fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("× peer (peer time / tilefuse time): cuBLAS; torch._scaled_mm for fp8; torch._int_mm for int8")
            ax.set_ylabel("case (kind, dtype, M x N x K)")
            ax.set_title("Triton GEMM against its peer, shape by shape")
            out.append(figure_png(fig))
            for dtype in dict.fromkeys(r.dtype for r in plain):
                group = [r for r in plain if r.dtype == dtype]
                peer = next((r.baseline for r in group if r.baseline), "peer")
                out.append(f"<h3>{esc(dtype)} against {esc(peer)}</h3>")
                body = []
                for r in group:
                    p = by.get((r.case, peer))
                    body.append([kind_of(r.case), shape_of(r.case),
                                 num_cell(p.tflops, 1) if p is not None and p.ok else status_cell(p),
                                 num_cell(r.tflops, 1) if r.ok else status_cell(r),
                                 ratio_cell(r.vs_baseline if r.ok else None)])
                out.append(table(["kind", "M x N x K", f"{peer} TFLOP/s", "tilefuse TFLOP/s",
                                  f"× {peer} ({peer} time / tilefuse time)"], body))
                mm = [r.vs_baseline for r in group if r.ok and r.vs_baseline and kind_of(r.case) == "mm"]
                out.append(geomean_line(f"plain GEMM rows, {dtype}", mm))
        if fused:
            rated = [r for r in fused if r.ok and r.vs_baseline is not None]
            fig, ax = plt.subplots(figsize=(9, max(3.0, 0.22 * len(rated) + 1.2)))
            ax.barh(range(len(rated)), [r.vs_baseline for r in rated],
                    color=["tab:blue" if kind_of(r.case) == "bias_gelu" else "tab:red" for r in rated])
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yticks(range(len(rated)), [f"{kind_of(r.case)} {shape_of(r.case)}" for r in rated], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("× eager chain (eager time / fused kernel time, log scale)")
            ax.set_ylabel("epilogue and M x N x K")
            ax.set_title("Fused epilogues (bias + GeLU; + fp8 quantisation) against the unfused eager chain")
            out.append(figure_png(fig))
            body = []
            for r in fused:
                addmm = by.get((r.case, "addmm+gelu"))
                body.append([kind_of(r.case), shape_of(r.case), num_cell(r.ms_p50) if r.ok else status_cell(r),
                             ratio_cell(r.vs_baseline if r.ok else None),
                             ratio_cell(addmm.ms_p50 / r.ms_p50 if addmm is not None and addmm.ok and r.ok else None)])
            out.append(table(["epilogue", "M x N x K", "tilefuse ms", "× eager chain (eager time / tilefuse time)",
                              "× cuBLAS addmm + GeLU (their time / tilefuse time)"], body))
            for kind in dict.fromkeys(kind_of(r.case) for r in fused):
                out.append(geomean_line(f"{kind} × eager chain",
                                        [r.vs_baseline for r in fused if kind_of(r.case) == kind and r.ok and r.vs_baseline]))
        return "\n".join(out)

    # ................................................................................... the compiler
    def compiler(self) -> str:
        out = ['<h2 id="compiler">4. The compiler against eager and Inductor</h2>',
               '<p class="claim">The reference article: torch.compile "routinely" speeds training and inference up '
               "1.5× to 2.5×, and cannot discover reformulations such as FlashAttention's online softmax.</p>",
               "<h3>Op graphs</h3>"]
        rows = self.by_suite.get("compiler")
        if not rows:
            out.append("<p>Not run: no compiler suite CSV among the inputs.</p>")
        else:
            out.append(self.source_note("compiler"))
            for shape in dict.fromkeys(r.shape for r in rows):
                out.append(self.compiler_graphs(shape, [r for r in rows if r.shape == shape]))
        out.append(self.generic_suite("models", "Whole models (training and inference)", "eager"))
        out.append(self.generic_suite("attention", "Attention", None))
        return "\n".join(out)

    def compiler_graphs(self, shape: str, rows: list[harness.Row]) -> str:
        out = [f"<h4>{esc(shape)}</h4>"] if len({r.shape for r in self.by_suite["compiler"]}) > 1 else []
        by = {(r.case, r.impl): r for r in rows}
        steps = []
        for case in dict.fromkeys(r.case for r in rows):
            t, i, e = by.get((case, "tilefuse")), by.get((case, "inductor")), by.get((case, "eager"))
            if t is not None and t.ok:
                steps.append((case, t, i if i is not None and i.ok else None, e if e is not None and e.ok else None))
        dtype = next((r.dtype for r in rows if r.dtype), "")
        plt = _plt()
        if steps:
            ys = range(len(steps))
            fig, ax = plt.subplots(figsize=(9, max(3.0, 0.3 * len(steps) + 1.2)))
            vs_ind = [i.ms_p50 / t.ms_p50 if i else 0 for _, t, i, _ in steps]
            vs_eag = [e.ms_p50 / t.ms_p50 if e else 0 for _, t, _, e in steps]
            ax.barh([y - 0.2 for y in ys], vs_ind, height=0.4, label="× Inductor (Inductor time / tilefuse time)")
            ax.barh([y + 0.2 for y in ys], vs_eag, height=0.4, label="× eager (eager time / tilefuse time)")
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.set_yticks(list(ys), [c for c, *_ in steps], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("speed-up of tilefuse (peer time / tilefuse time)")
            ax.set_ylabel("graph (a step as a user's loop sees it)")
            ax.set_title(f"Compiler against Inductor and eager, {shape} {dtype}")
            ax.legend(fontsize=8, loc="lower right")
            out.append(figure_png(fig))
            fig, ax = plt.subplots(figsize=(9, max(3.0, 0.3 * len(steps) + 1.2)))
            for impl, off in (("eager", -0.27), ("inductor", 0.0), ("tilefuse", 0.27)):
                vals = [(by[(c, impl)].pct_ceiling or 0) if (c, impl) in by else 0 for c, *_ in steps]
                ax.barh([y + off for y in ys], vals, height=0.27, label=impl)
            ax.axvline(100, color="black", linewidth=0.8)
            ax.set_yticks(list(ys), [c for c, *_ in steps], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("% of the copy bandwidth measured in the same run (minimum bytes / time)")
            ax.set_ylabel("graph")
            ax.set_title(f"Memory-bound graphs as a share of copy bandwidth, {shape} {dtype}")
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
            out.append(figure_png(fig))
        body = []
        for case, t, i, e in steps:
            k = by.get((case, "tilefuse-kernels"))
            body.append([case, num_cell(e.ms_p50 if e else None), num_cell(i.ms_p50 if i else None),
                         num_cell(t.ms_p50), num_cell(t.pct_ceiling, 1),
                         ratio_cell(i.ms_p50 / t.ms_p50 if i else None),
                         ratio_cell(e.ms_p50 / t.ms_p50 if e else None),
                         num_cell(k.ms_p50 if k is not None and k.ok else None)])
        out.append(table(["graph", "eager ms", "Inductor ms", "tilefuse ms", "tilefuse % of copy",
                          "× Inductor (Inductor time / tilefuse time)", "× eager (eager time / tilefuse time)",
                          "tilefuse kernels ms"], body))
        out.append(geomean_line("tilefuse × Inductor, steps", [i.ms_p50 / t.ms_p50 for _, t, i, _ in steps if i]))
        out.append(geomean_line("tilefuse × eager, steps", [e.ms_p50 / t.ms_p50 for _, t, _, e in steps if e]))
        bad = [r for r in rows if not r.ok]
        if bad:
            out.append(f"<p>{len(bad)} rows did not produce a time: "
                       + esc("; ".join(f"{r.case}/{r.impl}: {r.status}" for r in bad[:8])) + "</p>")
        return "\n".join(out)

    def generic_suite(self, suite: str, title: str, baseline: str | None) -> str:
        out = [f"<h3>{esc(title)}</h3>"]
        rows = self.by_suite.get(suite)
        if not rows:
            return out[0] + f'<p>Not run: no CSV of the "{esc(suite)}" suite among the inputs.</p>'
        out.append(self.source_note(suite))
        rated = [r for r in rows if r.ok and r.vs_baseline is not None and r.impl != r.baseline]
        if rated:
            plt = _plt()
            fig, ax = plt.subplots(figsize=(9, max(3.0, 0.22 * len(rated) + 1.2)))
            ax.barh(range(len(rated)), [r.vs_baseline for r in rated],
                    color=["tab:green" if r.vs_baseline >= 1 else "tab:red" for r in rated])
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.set_yticks(range(len(rated)), [f"{r.case} {r.impl}" for r in rated], fontsize=7)
            ax.invert_yaxis()
            peer = baseline or next((r.baseline for r in rated), "baseline")
            ax.set_xlabel(f"× {peer} ({peer} time / this time)")
            ax.set_ylabel("case and implementation")
            ax.set_title(f"{title}: speed against {peer}")
            out.append(figure_png(fig))
        body = []
        for r in rows:
            note = parse_note(r.note)
            extra = ", ".join(f"{k}={v}" for k, v in note.items() if k in (
                "graphs", "breaks", "kernels", "externs", "fallbacks", "peak_mem_gb", "peak_gb"))
            body.append([r.case, r.impl, r.dtype, num_cell(r.ms_p50) if r.ok else status_cell(r),
                         num_cell(r.tflops, 1), ratio_cell(r.vs_baseline if r.ok else None), r.baseline, extra])
        out.append(table(["case", "implementation", "dtype", "ms", "TFLOP/s", "× baseline (its time / this time)",
                          "baseline", "notes"], body))
        for impl in dict.fromkeys(r.impl for r in rated):
            out.append(geomean_line(f"{impl} × its baseline", [r.vs_baseline for r in rated if r.impl == impl]))
        return "\n".join(out)

    # ..................................................................................... compile times
    def compile_times(self) -> str:
        out = ['<h2 id="compile-times">5. Compile times</h2>']
        rows = [r for r in self.by_suite.get("compiler", []) if "-compile-" in r.impl]
        model_rows = [r for r in self.by_suite.get("models", []) if "compile_cold_s" in parse_note(r.note)]
        if not rows and not model_rows:
            return out[0] + "<p>Not run: no compiler or models suite CSV with compile times among the inputs.</p>"
        if rows:
            out.append(self.source_note("compiler"))
            out.append("<p>Seconds from <code>torch.compile</code> to the end of the first call, each graph in a "
                       "fresh process: cold (empty caches) and warm (the disk cache of a previous process).</p>")
            impls = list(dict.fromkeys(r.impl for r in rows))
            multi = len({r.shape for r in rows}) > 1
            label = (lambda r: f"{r.case} {r.shape}") if multi else (lambda r: r.case)
            cases = list(dict.fromkeys(label(r) for r in rows))
            by = {(label(r), r.impl): r for r in rows}
            plt = _plt()
            fig, ax = plt.subplots(figsize=(9, max(3.0, 0.3 * len(cases) + 1.2)))
            width = 0.8 / max(1, len(impls))
            for k, impl in enumerate(impls):
                vals = [by[(c, impl)].ms_p50 / 1e3 if (c, impl) in by and by[(c, impl)].ok else 0 for c in cases]
                ax.barh([y - 0.4 + width * (k + 0.5) for y in range(len(cases))], vals, height=width, label=impl)
            ax.set_yticks(range(len(cases)), cases, fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("compile time, seconds (torch.compile to the end of the first call)")
            ax.set_ylabel("graph")
            ax.set_title("Compile time a graph: tilefuse cold and warm, Inductor cold")
            ax.legend(fontsize=8)
            out.append(figure_png(fig))
            body = [[c] + [num_cell(by[(c, i)].ms_p50 / 1e3) if (c, i) in by and by[(c, i)].ok else
                           status_cell(by.get((c, i))) for i in impls] for c in cases]
            out.append(table(["graph"] + [f"{i} s" for i in impls], body))
            for impl in impls:
                secs = [by[(c, impl)].ms_p50 / 1e3 for c in cases if (c, impl) in by and by[(c, impl)].ok]
                gm = harness.geomean(secs)
                if gm:
                    out.append(f"<p><b>{esc(impl)}</b>: geomean {gm:.2f} s a graph, at most {max(secs):.2f} s.</p>")
        if model_rows:
            out.append(self.source_note("models"))
            body = []
            for r in model_rows:
                note = parse_note(r.note)
                body.append([r.case, r.impl, note.get("compile_cold_s", ""), note.get("compile_warm_s", "")])
            out.append(table(["model", "backend", "cold s", "warm s"], body))
        return "\n".join(out)

    # ................................................................................... target matrix
    def target_matrix(self) -> str:
        out = ['<h2 id="targets">6. Cross-vendor targets</h2>',
               '<p class="claim">The reference article: compiler stacks such as Triton decouple AI code from one '
               "vendor. Here every registered Triton kernel is compiled ahead of time for NVIDIA and AMD targets on "
               "a machine without a GPU, and the matrix instruction each build uses is read from its assembly.</p>"]
        if not self.targets:
            out.append("<p>Omitted: no <code>tilefuse targets --json</code> file among the inputs (run "
                       "<code>tilefuse targets --json &gt; targets.json</code> and pass it to "
                       "<code>tilefuse report</code>).</p>")
            return "\n".join(out)
        results = self.targets.get("results", [])
        names = list(self.targets.get("targets") or dict.fromkeys(r.get("target") for r in results))
        out.append(f'<p class="note">From <code>{esc(self.targets_path)}</code>: {len(results)} compilations, '
                   f"{self.targets.get('failures', sum(1 for r in results if not r.get('ok') and r.get('claimed', True)))} "
                   "failed on a claimed target.</p>")
        cells: dict[tuple[str, str], dict] = {}
        for r in results:
            cells[(f"{r.get('kernel')} [{r.get('example')}]", r.get("target"))] = r
        keys = list(dict.fromkeys(k for k, _ in cells))
        body = []
        for key in keys:
            row = [key]
            for t in names:
                r = cells.get((key, t))
                if r is None:
                    row.append('<td class="off">–</td>')
                elif r.get("ok"):
                    regs = f", {r['registers']} regs" if r.get("registers") is not None else ""
                    row.append(f'<td class="good">{esc(r.get("mma", ""))}{esc(regs)}</td>')
                elif not r.get("claimed", True):
                    row.append(f'<td class="off" title="{esc(r.get("error", ""))}">not claimed</td>')
                else:
                    row.append(f'<td class="bad" title="{esc(r.get("error", ""))}">failed</td>')
            body.append(row)
        out.append(table(["kernel [example]"] + names, body))
        out.append('<p class="note">A cell: the matrix-instruction family found in the build (e.g. wgmma on '
                   "sm_90a, mfma on gfx942) and the registers a thread; \"not claimed\": the kernel does not "
                   "claim that target.</p>")
        return "\n".join(out)

    def other_suites(self) -> str:
        known = {"ladder", "gemm", "compiler", "models", "attention"}
        out = []
        for suite in self.by_suite:
            if suite not in known:
                out.append(self.generic_suite(suite, f"Other suite: {suite}", None))
        return "\n".join(out)

    def render(self, title: str) -> str:
        sections = [self.ladder(), self.triton_vs_cuda(), self.gemm(), self.compiler(), self.compile_times(),
                    self.target_matrix(), self.other_suites()]
        toc = ('<ol><li><a href="#ladder">CUDA C++ ladder</a></li><li><a href="#triton-vs-cuda">Triton against '
               'CUDA C++</a></li><li><a href="#gemm">GEMM shapes and fused epilogues</a></li><li><a '
               'href="#compiler">Compiler against eager and Inductor</a></li><li><a href="#compile-times">Compile '
               'times</a></li><li><a href="#targets">Cross-vendor targets</a></li></ol>')
        inputs = "".join(f"<li><code>{esc(p)}</code> ({len(rows)} rows)</li>" for p, rows in self.sources)
        if self.targets_path:
            inputs += f"<li><code>{esc(self.targets_path)}</code> (target matrix)</li>"
        intro = ("<p>Every figure on this page is read from the benchmark CSV files below, each written by "
                 "<code>tilefuse bench</code> in one device run that timed the peer in the same process on the same "
                 "inputs. A row that did not run shows why, never a number. Ratios read "
                 "<b>× PEER (PEER time / tilefuse time)</b>: above 1, tilefuse is faster.</p>")
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(title)}</title>"
                f"<style>{STYLE}</style></head><body>\n<h1>{esc(title)}</h1>\n{intro}\n<p>Inputs:</p><ul>{inputs}</ul>"
                f"\n{toc}\n" + "\n".join(s for s in sections if s) + "\n</body></html>\n")


def render(sources: Sequence[tuple[str, list[harness.Row]]], targets: dict | None = None,
           targets_path: str | None = None, title: str = "tilefuse results") -> str:
    """The page for ``sources`` (a (path, rows) pair a CSV) and an optional ``tilefuse targets --json`` dict."""
    return Page(sources, targets, targets_path).render(title)
