"""Four fixes and one shortcut to Triton 3.6's interpreter, applied by tilefuse when its kernels run there (no GPU).

Installed by ``tilefuse/kernels/__init__`` when :func:`tilefuse.device.interpreting` is true (every kernel,
the library's and the compiler's generated ones, is reached through that package); never on a GPU, where
nothing here is used. The kernels' source is unchanged: only the interpreter's evaluation of it is.

1. **numpy 2.4+.** The interpreter keeps a scalar as a one-element 1-D array and converts it for Python
   (``range(kt0, kt1)``, an index) with ``int(array)``: numpy 2.4 removed that conversion of an array of
   ndim > 0 (deprecated since 1.25), so every kernel with a loop failed with "only 0-dimensional arrays can
   be converted to Python scalars" (``interpreter._patch_lang_tensor``'s ``__index__``). Ours converts
   through ``.item()``, which every numpy version accepts.
2. **Threads.** A launch patches triton.language's builtins (module and class attributes, process-wide) for
   its length and keeps the program id in one global builder; two launches from two threads at once undo
   each other's patches ("Did you forget to add @triton.jit ?") or read each other's program ids. One
   lock serialises launches: the interpreter is single-threaded Python anyway, so nothing is lost.
3. **bf16 ``tl.dot``.** numpy has no bfloat16, so the interpreter keeps bf16 values as their uint16 bit
   patterns, and ``create_dot`` multiplied those integers (an answer of ~1e10 where ~0.5 is right, and no
   error). bf16 operands are widened to float32 first (exact: bf16 is the top half of a float32), the
   accumulator stays float32, as on the GPU.
4. **Triton imported before tilefuse.** ``TRITON_INTERPRET`` is read when a function is decorated. When the
   backend is reached through ``torch.compile(backend="tilefuse")`` without ``import tilefuse`` first,
   torch has already imported triton.language, whose own ``@jit`` functions (``tl.sum``, ``tl.max``,
   ``tl.softmax``...) are then compiled-mode objects that refuse a call from an interpreted kernel
   ("Cannot call @triton.jit'd outside of the scope of a kernel": every reduction kernel failed). They
   are rewrapped as interpreted functions, in every module of triton.language that holds them.

And a shortcut: every call of a ``@triton.jit`` helper inside a kernel (``tl.sum``, a generated helper), in every
program, ran the launch's patching of triton.language again (four ``inspect.getmembers`` walks): 12 % of the
interpreter's time in a real-model training step (cProfile, GPT-2 at 1024 tokens). Inside a launch whose patch
already covers the helper's language modules, the helper's patch is skipped; the attributes are already the
interpreted ones, and the launch restores them at its end as before.
"""
from __future__ import annotations

import functools
import inspect
import threading

import numpy as np

LAUNCH_LOCK = threading.RLock()  # re-entrant: a launch from inside a launch (a hook) must not deadlock
_installed = False


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 values (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def install() -> None:
    """Apply the four fixes and the shortcut (idempotent)."""
    global _installed
    if _installed:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    _fix_scalar_index(interpreter)
    _serialise_launches(interpreter)
    _patch_once_a_launch(interpreter, tl)
    _fix_bf16_dot(interpreter, tl)
    rewrap_library_functions(interpreter)
    _installed = True


def rewrap_library_functions(interpreter) -> int:
    """Triton's own ``@jit`` functions decorated in compiled mode, made interpreted. Returns how many."""
    import sys

    from triton.runtime.jit import JITFunction

    done: dict[int, object] = {}
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction) and not isinstance(value, interpreter.InterpretedFunction):
                if id(value) not in done:
                    done[id(value)] = interpreter.InterpretedFunction(value.fn)
                    count += 1
                setattr(module, attr, done[id(value)])
    return count


def _fix_scalar_index(interpreter) -> None:
    original = interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # the scope restores attributes in reverse order, so this one is undone first, then Triton's
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).item()))

    interpreter._patch_lang_tensor = _patch_lang_tensor


def _serialise_launches(interpreter) -> None:
    fn_class = interpreter.InterpretedFunction
    original = fn_class.run

    @functools.wraps(original)
    def run(self, *args, **kwargs):
        with LAUNCH_LOCK:
            return original(self, *args, **kwargs)

    fn_class.run = run


def _patch_once_a_launch(interpreter, tl) -> None:
    original_patch = interpreter._patch_lang
    executor = interpreter.GridExecutor
    original_call = executor.__call__
    launches: list[set] = []  # the language modules each launch under way has patched (launches nest in hooks)
    seen: dict = {}  # function -> its language modules: looked up once, not at each of its calls in each program

    def langs(fn) -> frozenset:
        found = seen.get(fn)
        if found is None:
            found = seen[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                         if inspect.ismodule(v) and (v is tl or v is tl.core))
        return found

    def _patch_lang(fn):
        wanted = langs(fn)
        if launches and wanted <= launches[-1]:
            return interpreter._LangPatchScope()  # nothing to undo: the launch's own scope restores
        scope = original_patch(fn)
        if launches:
            launches[-1].update(wanted)
        return scope

    def call(self, *args, **kwargs):
        launches.append(set())
        try:
            return original_call(self, *args, **kwargs)
        finally:
            launches.pop()

    interpreter._patch_lang = _patch_lang
    executor.__call__ = call


def _fix_bf16_dot(interpreter, tl) -> None:
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def widen(h):
        if h.dtype.scalar == tl.bfloat16:
            return interpreter.TensorHandle(bf16_bits_to_float32(h.data), tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
