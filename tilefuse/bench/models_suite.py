"""``tilefuse bench models``: whole models, training and inference, tilefuse against eager and Inductor.

The method is PyTorch's dynamo benchmark harness's (``benchmarks/dynamo/common.py``), which users and reviewers
know:

1. **Accuracy first.** Each backend runs one step from the same weights and inputs as eager; the outputs (and,
   in training, the loss and every parameter gradient) must match eager by :func:`accuracy`: ``allclose`` at the
   dtype's tolerance, else the backend's RMSE against a float64 run of the model at most
   :data:`RMSE_FACTOR` times eager's own RMSE (plus a floor for results that are exactly eager's). A row whose
   backend is wrong says ``wrong: ...`` and is not timed.
2. **Speed** as the ratio of medians over interleaved rounds: each round runs every backend's step
   :data:`STEPS_PER_ROUND` times (order rotated a round), so a drift of the GPU's clocks lands on all alike.
   ``ms_p50`` is the median over rounds of a step's mean, ``ms_p20``/``ms_p80`` the spread of the rounds.
3. **Summary**: geomean of the speed-ups over the models, per backend and mode.

Rows: ``case`` = ``<model>-<mode>-b<batch>``; ``impl`` = the backend; ``baseline`` = eager (``vs_baseline`` = eager
time / this time); ``note`` carries ``key=value`` fields: the speed-up over each Inductor mode run, compile
seconds cold (the first call in a fresh Dynamo) and warm (the same after ``torch._dynamo.reset()``, with the disk
caches warm), peak GPU memory, Dynamo graphs and graph breaks, and tilefuse's kernels, externs and fallbacks.

Models (random weights built from config objects: nothing is downloaded): the Hugging Face families GPT-2
124M, a Llama-style ~1B, BERT-base, T5-small, ViT-B/16, a Qwen2-style model with grouped-query attention; the
torchvision models ResNet-50, MobileNetV2 and ConvNeXt-T where torchvision is installed; and a UNet written
here. ``--smoke`` runs tiny configs of the Hugging Face and plain-PyTorch models on the CPU (Triton's
interpreter), eager and tilefuse only: it proves the code path and the accuracy check; its times mean nothing.

Modes: ``train`` (AdamW, bf16 autocast), ``infer`` (the model in the dtype, a serving batch) and, for the causal
LMs, ``decode``: batch 1, one token step after a prompt, against transformers' ``StaticCache`` (fixed shapes, so
a compiled step does not recompile as the sequence grows; the case name says ``-decode-b1``).

Every phase (compile-cold, accuracy, compile-warm, warm-up, timing) is logged with its wall time as it ends;
``--time-limit S`` bounds each model x backend over all its phases (:class:`harness.Deadline`), past which its
row is "not run: exceeded S s in phase X" and the suite goes on. A ``*-reduce-overhead`` backend that cannot
compile that mode is a "not run" or "error" row with the backend's own words, never a mislabelled timing.
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import harness, runner

SUITE = "models"
BACKENDS = ("eager", "inductor", "inductor-max-autotune", "inductor-reduce-overhead", "tilefuse",
            "tilefuse-reduce-overhead")
SMOKE_BACKENDS = ("eager", "tilefuse")  # Inductor on the CPU builds C++ for minutes: not a smoke test
MODES = ("train", "infer", "decode")  # decode: the causal LMs alone, batch 1, static KV cache
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# The dynamo harness's tolerances: allclose at these, else the RMSE rule below.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float64: 1e-7}
# A backend's RMSE against float64 may be this many times eager's own RMSE (the harness's multiplier is 2-3;
# training steps compare gradients, whose error a different but correct summation order changes more).
RMSE_FACTOR = 3.0
RMSE_FLOOR = 1e-7  # against results eager computes exactly (an RMSE of 0.0 would admit nothing)
ROUNDS, STEPS_PER_ROUND = 5, 3
SMOKE_ROUNDS, SMOKE_STEPS = 2, 1
# Steps each backend runs after its compile, before the timed rounds: the rows are steady states. tilefuse's
# reduce-overhead step trial times 5 periods between step starts each way (11 steps, decision 059); inside the
# timed rounds its GPT-2 training row read 8.95 ms where the trial's captured steps took 7.95 (lab log).
WARMUP_STEPS, SMOKE_WARMUP_STEPS = 12, 1
DECODE_ROOM = 8  # cache slots past the prompt: a round's steps (rewound between rounds) and the first step


# ------------------------------------------------------------------------------------------------ models
@dataclasses.dataclass
class ModelCase:
    """A model builder and its inputs: ``build(tiny)`` -> module; ``inputs(model, batch, device)`` -> kwargs;
    ``loss(output)`` -> scalar for training; ``batch``: the serving / training batch at real size."""
    name: str
    build: Callable[[bool], nn.Module]
    inputs: Callable[[nn.Module, int, torch.device], dict]
    batch: int
    family: str  # "hf" or "vision"
    decoder: bool = False  # a causal LM: also a decode step with a static KV cache (mode "decode", batch 1)


def _hf():
    import transformers  # noqa: F401  (a clear ImportError where it is missing)

    return transformers


def _tokens(vocab: int, seq: int, labels: bool = True):
    def make(model, batch, device):
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        return {"input_ids": ids, **({"labels": ids.clone()} if labels else {})}
    return make


def _gpt2(tiny):
    t = _hf()
    cfg = t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64) if tiny else t.GPT2Config()
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    return t.GPT2LMHeadModel(cfg)


def _llama(tiny):
    t = _hf()
    if tiny:
        cfg = t.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    else:  # ~1.1B: TinyLlama's shape
        cfg = t.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    return t.LlamaForCausalLM(cfg)


def _qwen2(tiny):
    t = _hf()
    if tiny:
        cfg = t.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=1, vocab_size=128, max_position_embeddings=64)
    else:  # Qwen2-0.5B's shape: 14 query heads sharing 2 key/value heads
        cfg = t.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                            num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096)
    return t.Qwen2ForCausalLM(cfg)


def _bert(tiny):
    t = _hf()
    cfg = (t.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vocab_size=128, max_position_embeddings=64) if tiny else t.BertConfig())
    cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.0
    return t.BertForMaskedLM(cfg)


def _t5(tiny):
    t = _hf()
    kw = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=128,
              relative_attention_num_buckets=8, relative_attention_max_distance=16) if tiny else \
        dict(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128)  # t5-small
    return t.T5ForConditionalGeneration(t.T5Config(dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, **kw))


def _t5_inputs(vocab, seq):
    def make(model, batch, device):
        return {"input_ids": torch.randint(1, vocab, (batch, seq), device=device),
                "labels": torch.randint(1, vocab, (batch, seq // 2), device=device)}
    return make


def _vit(tiny):
    t = _hf()
    cfg = (t.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, num_labels=10) if tiny else t.ViTConfig(num_labels=1000))
    cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.0
    return t.ViTForImageClassification(cfg)


def _images(size, classes):
    def make(model, batch, device):
        return {"pixel_values": torch.randn(batch, 3, size, size, device=device),
                "labels": torch.randint(0, classes, (batch,), device=device)}
    return make


class UNet(nn.Module):
    """A small UNet: two levels down (conv, BatchNorm, ReLU, max-pool), up by transposed convs with skips."""

    def __init__(self, width: int = 16, classes: int = 3):
        super().__init__()

        def block(ci, co):
            return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU(),
                                 nn.Conv2d(co, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU())
        w = width
        self.down1, self.down2, self.mid = block(3, w), block(w, 2 * w), block(2 * w, 4 * w)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2), block(4 * w, 2 * w)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2), block(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, pixel_values, labels=None):
        d1 = self.down1(pixel_values)
        d2 = self.down2(F.max_pool2d(d1, 2))
        m = self.mid(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], 1))
        logits = self.head(self.dec1(torch.cat([self.up1(u2), d1], 1)))
        return logits if labels is None else (F.cross_entropy(logits, labels), logits)


def _unet(tiny):
    return UNet(width=8 if tiny else 64)


def _seg_inputs(size, classes=3):
    def make(model, batch, device):
        return {"pixel_values": torch.randn(batch, 3, size, size, device=device),
                "labels": torch.randint(0, classes, (batch, size, size), device=device)}
    return make


class Classifier(nn.Module):
    """An image classifier called as the Hugging Face models are: ``(pixel_values, labels) -> (loss, logits)``."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        return logits if labels is None else (F.cross_entropy(logits, labels), logits)


def _torchvision(name):
    def build(tiny):
        import torchvision

        return Classifier(getattr(torchvision.models, name)(weights=None))
    return build


def cases(smoke: bool) -> list[ModelCase]:
    """The suite's models: tiny configs on the CPU smoke run, real sizes otherwise."""
    if smoke:
        return [ModelCase("gpt2", _gpt2, _tokens(128, 16), 2, "hf", decoder=True),
                ModelCase("llama", _llama, _tokens(128, 16), 2, "hf", decoder=True),
                ModelCase("qwen2-gqa", _qwen2, _tokens(128, 16), 2, "hf", decoder=True),
                ModelCase("bert", _bert, _tokens(128, 16), 2, "hf"),
                ModelCase("t5", _t5, _t5_inputs(128, 16), 2, "hf"),
                ModelCase("vit", _vit, _images(32, 10), 2, "hf"),
                ModelCase("unet", _unet, _seg_inputs(16), 2, "vision")]
    out = [ModelCase("gpt2-124m", _gpt2, _tokens(50257, 512), 8, "hf", decoder=True),
           ModelCase("llama-1b", _llama, _tokens(32000, 1024), 4, "hf", decoder=True),
           ModelCase("qwen2-0.5b-gqa", _qwen2, _tokens(151936, 1024), 4, "hf", decoder=True),
           ModelCase("bert-base", _bert, _tokens(30522, 512), 16, "hf"),
           ModelCase("t5-small", _t5, _t5_inputs(32128, 512), 16, "hf"),
           ModelCase("vit-b16", _vit, _images(224, 1000), 32, "hf"),
           ModelCase("unet", _unet, _seg_inputs(256), 8, "vision")]
    try:
        import torchvision  # noqa: F401

        out += [ModelCase("resnet50", _torchvision("resnet50"), _images(224, 1000), 64, "vision"),
                ModelCase("mobilenet_v2", _torchvision("mobilenet_v2"), _images(224, 1000), 64, "vision"),
                ModelCase("convnext_tiny", _torchvision("convnext_tiny"), _images(224, 1000), 64, "vision")]
    except ImportError:
        pass
    return out


# ------------------------------------------------------------------------------------------------ steps
def _loss(out) -> torch.Tensor:
    """A scalar from any model's output: the model's own loss where it returns one."""
    if isinstance(out, torch.Tensor):
        return out.float().pow(2).mean()
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    if isinstance(out, (tuple, list)):
        return out[0].float() if out[0].dim() == 0 else out[0].float().pow(2).mean()
    return out.logits.float().pow(2).mean()


def _outputs(out) -> list[torch.Tensor]:
    """The tensors of a model's output, in a fixed order (logits, loss, ...)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return [v for k, v in out.items() if isinstance(v, torch.Tensor)]


class DecodeCache:
    """A static KV cache (transformers' ``StaticCache``: fixed shapes, so a compiled decode step never
    recompiles as the sequence grows) prefilled by the eager model with a prompt, and the positions of the
    decode steps that follow it. The cache writes each step at its own running length: :meth:`rewind` (outside
    the timed region) sets it back to the prompt's, so the timed steps always decode positions P, P+1, ..."""

    def __init__(self, model: nn.Module, prompt: torch.Tensor, room: int):
        from transformers import StaticCache

        self.prompt_len = P = prompt.shape[1]
        self.cache = StaticCache(config=model.config, max_cache_len=P + room)
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=self.cache, use_cache=True,
                  cache_position=torch.arange(P, device=prompt.device))
        self.positions = [torch.tensor([P + i], device=prompt.device) for i in range(room)]
        self.i = 0

    def rewind(self) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.prompt_len)
        self.i = 0

    def next_step(self) -> dict:
        if self.i >= len(self.positions):  # never in a timed round (rounds rewind first); a write past the end
            self.rewind()                 # of the cache would be an out-of-bounds index_copy_ on the GPU
        position = self.positions[self.i]
        self.i += 1
        return {"past_key_values": self.cache, "cache_position": position, "use_cache": True}


class Runner:
    """One backend's model (its own copy of the weights), optimizer (training), KV cache (decode) and step."""

    def __init__(self, model: nn.Module, backend: str, mode: str, dtype: torch.dtype, device: torch.device,
                 prompt: torch.Tensor | None = None):
        self.model, self.backend = model, backend
        self.mode, self.dtype, self.device = mode, dtype, device
        self.fn = model if backend == "eager" else torch.compile(model, **_compile_args(backend))
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if mode == "train" else None
        self.autocast = dtype != torch.float32 and device.type == "cuda" and mode == "train"
        # CUDA graphs replay into the same output buffers: a step starts a new generation of them
        self.cudagraphs = backend.endswith("reduce-overhead") and device.type == "cuda"
        self.decode = DecodeCache(model, prompt, DECODE_ROOM) if mode == "decode" else None

    def rewind(self) -> None:
        if self.decode is not None:
            self.decode.rewind()

    def step(self, kwargs, keep: bool = False) -> list[torch.Tensor]:
        """One step; ``keep``: return its results as copies (outputs, or the loss and every gradient) for the
        accuracy check. A timed step returns nothing: copying 124M gradients a step would dilute every
        backend's speed-up alike."""
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        if self.mode != "train":
            extra = self.decode.next_step() if self.decode is not None else {}
            with torch.no_grad():
                out = self.fn(**kwargs, **extra)
            return [t.detach().clone() for t in _outputs(out)] if keep else []
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.autocast):
            out = self.fn(**kwargs)
            loss = _loss(out)
        loss.backward()
        kept = []
        if keep:
            kept = [loss.detach().clone()] + [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                                              for p in self.model.parameters()]
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return kept


def _compile_args(backend: str) -> dict:
    if backend.startswith("inductor"):
        mode = backend.removeprefix("inductor").lstrip("-") or None
        return {"backend": "inductor", "mode": mode}
    if backend.startswith("tilefuse"):
        mode = backend.removeprefix("tilefuse").lstrip("-") or None
        return {"backend": "tilefuse", **({"mode": mode} if mode else {})}
    raise ValueError(f"unknown backend {backend!r}: accepted values are {', '.join(BACKENDS)}")


# ------------------------------------------------------------------------------------------------ accuracy
def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.sqrt(torch.mean((a.double() - b.double()) ** 2)).item() if a.numel() else 0.0


def accuracy(got: list[torch.Tensor], eager: list[torch.Tensor], ref: list[torch.Tensor],
             dtype: torch.dtype) -> str | None:
    """None if ``got`` matches ``eager`` by the dynamo harness's rule, else what differs (the first tensor).

    Per tensor: ``allclose(got, eager)`` at :data:`TOLERANCE`; else ``rmse(got, ref) <= RMSE_FACTOR *
    rmse(eager, ref) + RMSE_FLOOR`` against the float64 run ``ref``. A non-finite value where eager has a finite
    one always fails."""
    if len(got) != len(eager):
        return f"{len(got)} tensors where eager has {len(eager)}"
    tol = TOLERANCE.get(dtype, 1e-4)
    for i, (g, e, r) in enumerate(zip(got, eager, ref)):
        if g.shape != e.shape:
            return f"tensor {i}: shape {tuple(g.shape)}, eager {tuple(e.shape)}"
        g64, e64 = g.detach().double().cpu(), e.detach().double().cpu()
        if bool((torch.isfinite(e64) & ~torch.isfinite(g64)).any()):
            return f"tensor {i}: non-finite values where eager's are finite"
        if torch.allclose(g64, e64, rtol=tol, atol=tol, equal_nan=True):
            continue
        r64 = r.detach().double().cpu()
        mine, theirs = _rmse(g64, r64), _rmse(e64, r64)
        if mine > RMSE_FACTOR * theirs + RMSE_FLOOR:
            return f"tensor {i}: rmse {mine:.3g} against float64, eager's {theirs:.3g}"
    return None


# ------------------------------------------------------------------------------------------------ the suite
def _stats_note(backend: str) -> dict:
    from torch._dynamo.utils import counters

    note = {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}
    if backend.startswith("tilefuse"):
        import tilefuse.compiler as compiler

        s = compiler.stats()
        note.update(kernels=s["kernels"], externs=s["externs"], fallbacks=len(s["fallbacks"]))
        if backend.endswith("reduce-overhead"):  # captured or not, and why not: a row's time means little without it
            note["cudagraphs"] = _cudagraphs_field(s)
    return note


def _cudagraphs_field(stats: dict) -> str:
    """What tilefuse's CUDA graphs did (from ``tilefuse.compiler.stats()``), as one field of a row's note."""
    from .compiler_suite import cuda_graph_summary

    return cuda_graph_summary(stats).removeprefix("cuda graphs: ").replace(";", ",")[:300]


def _fmt_note(fields: dict) -> str:
    return "; ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())


def _skip_row(rec, name, backend, dtype, shape, why, fields) -> harness.Row:
    """A "not run" row that keeps what the phases before it measured (compile seconds, graphs) in its note."""
    return rec._row(name, backend, dtype, shape, status=f"not run: {why}", baseline="eager", note=_fmt_note(fields))


_REFUSED_MODES: dict[str, str] = {}  # backend -> the backend's words when it compiled another mode instead


def _forget_mode_warning(backend: str) -> None:
    """tilefuse warns once a process about a mode it does not have: forget that it did, so this compile's
    warning is seen (an earlier model, test or suite in the process may have had it)."""
    mode = _compile_args(backend).get("mode") if backend != "eager" else None
    if mode and backend.startswith("tilefuse"):
        from tilefuse.compiler import backend as tf_backend

        getattr(tf_backend, "_MODES_WARNED", set()).discard(mode)


def _not_a_mode(backend: str, caught: list, exc: BaseException | None = None) -> str:
    """The backend's own words that it has not the mode asked for (tilefuse before it had CUDA graphs): a
    warning it gave, or that warning raised as an error (Dynamo wraps it) — a ``-reduce-overhead`` row timed
    anyway would be a mislabelled default-mode row."""
    texts = [str(w.message) for w in caught]
    while exc is not None:
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    for text in texts:
        if "is not a tilefuse mode" in text:
            start = text.find("tilefuse backend: mode=")
            _REFUSED_MODES[backend] = text[max(start, 0):].strip().splitlines()[0]
    return _REFUSED_MODES.get(backend, "")


def run_case(rec: harness.Recorder, case: ModelCase, mode: str, dtype: torch.dtype, batch: int,
             backends: tuple[str, ...], smoke: bool, log: Callable[[str], None],
             time_limit: float | None = None, warm: bool = True) -> list[harness.Row]:
    """The rows of one model in one mode, a row per backend. Phases, each logged with its wall time as it ends:

    1. per backend in a fresh Dynamo: **compile-cold** (the first step, disk caches as the process found them)
       and **accuracy** (that step's results against eager's and the float64 run's);
    2. one ``torch._dynamo.reset()``, then per backend **compile-warm** (a second compile, the disk caches warm):
       the models compiled here are the ones timed (a reset after them would throw their compiled code away
       and the first timed round would compile again);
    3. **warm-up**: per backend :data:`WARMUP_STEPS` steps, so the timed steps are its steady state (a CUDA-graph
       mode's recordings and step trial are behind it);
    4. **timing**: interleaved rounds.

    ``time_limit``: wall seconds a backend may spend over all its phases; past it (checked between phases and
    by a SIGALRM watchdog inside one) its row is "not run: exceeded N s in phase X" and the others go on.
    ``warm=False`` skips phase 2 (half the compile time): the cold-compiled models are timed, and Dynamo is
    reset once for the model, not before each backend."""
    import warnings

    device = torch.device("cpu") if smoke else torch.device("cuda")
    name = f"{case.name}-{mode}-b{batch}"
    shape = f"batch {batch}" if mode != "decode" else f"batch 1, one token after a {case.name} prompt"
    torch.manual_seed(0)
    try:
        base = case.build(smoke)
    except ImportError as exc:
        return [rec.skip(name, b, str(exc), dtype=dtype, shape=shape) for b in backends]
    base.train(mode == "train")
    model_dtype = torch.float32 if mode == "train" else dtype
    kwargs = case.inputs(base, batch, device)
    prompt = None
    if mode == "decode":
        prompt = kwargs["input_ids"][:1]
        shape = f"batch 1, one token after a {prompt.shape[1]}-token prompt, static KV cache"
        kwargs = {"input_ids": torch.randint(0, base.config.vocab_size, (1, 1), device=device)}
    if case.family == "vision" and "pixel_values" in kwargs:
        kwargs["pixel_values"] = kwargs["pixel_values"].to(model_dtype)

    def build_runner(backend, dt=model_dtype, run_dtype=dtype, source=base):
        model = copy.deepcopy(source).to(device=device, dtype=dt)
        return Runner(model, backend, mode, run_dtype, device, prompt=prompt)

    def say(backend, what):
        log(f"  {name:<28} {backend:<26} {what}")

    # float64 reference (the accuracy rule's yardstick)
    ref_kwargs = {k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}
    ref_runner = build_runner("eager", torch.float64, torch.float64)
    ref = ref_runner.step(ref_kwargs, keep=True)
    del ref_runner
    rows: dict[str, harness.Row] = {}
    runners: dict[str, Runner] = {}
    results: dict[str, list[torch.Tensor]] = {}
    fields: dict[str, dict] = {b: {} for b in backends}
    limits = {b: harness.Deadline(time_limit) for b in backends}

    def give_up(backend, exc: BaseException):
        runners.pop(backend, None)
        f = fields[backend]
        if isinstance(exc, harness.TimeLimitExceeded):
            say(backend, f"NOT RUN {exc} (limit per model and backend: --time-limit)")
            rows[backend] = _skip_row(rec, name, backend, dtype, shape, str(exc), f)
        else:
            rows[backend] = rec._error_row(name, backend, dtype, shape, exc,
                                           {"baseline": "eager", "note": _fmt_note(f)})

    # 1. cold compile and accuracy, each backend in a fresh Dynamo
    for backend in backends:
        limit, f = limits[backend], fields[backend]
        if backend in _REFUSED_MODES:  # refused on an earlier model: the same words, no compile
            rows[backend] = _skip_row(rec, name, backend, dtype, shape, _REFUSED_MODES[backend], f)
            continue
        if warm or backend == backends[0]:
            torch._dynamo.reset()
        from torch._dynamo.utils import counters

        counters.clear()
        if backend.startswith("tilefuse"):
            import tilefuse.compiler as compiler

            compiler.reset_stats()
        say(backend, "compile-cold ..." if backend != "eager" else "first step ...")
        try:
            _forget_mode_warning(backend)
            with limit.phase("compile-cold"), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                # a mode the backend does not have stops the compile at once (it would compile the default
                # mode in full, then the row would be "not run" anyway)
                warnings.filterwarnings("error", message=".*is not a tilefuse mode")
                r = build_runner(backend)
                r.rewind()
                t0 = time.perf_counter()
                results[backend] = r.step(kwargs, keep=True)
                _sync(device)
                f["compile_cold_s"] = time.perf_counter() - t0
            for w in caught:  # shown as they would have been
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
            f.update(_stats_note(backend))
            say(backend, f"compile-cold {f['compile_cold_s']:.1f} s" +
                (f" ({f['graphs']} graphs, {f['graph_breaks']} breaks)" if backend != "eager" else ""))
            refused = _not_a_mode(backend, caught)
            if refused:
                say(backend, f"NOT RUN {refused}")
                rows[backend] = _skip_row(rec, name, backend, dtype, shape, refused, f)
                continue
            if backend == "eager":
                runners[backend] = r  # eager compiles nothing: this one is timed
                continue
            if warm:
                del r
            with limit.phase("accuracy"):
                t0 = time.perf_counter()
                wrong = accuracy(results[backend], results["eager"], ref, dtype) if "eager" in results else \
                    "no eager result to compare with"
                say(backend, f"accuracy {'ok' if not wrong else 'WRONG ' + wrong} ({time.perf_counter() - t0:.1f} s)")
        except (Exception, harness.TimeLimitExceeded) as exc:  # one backend failing must not end the suite
            refused = _not_a_mode(backend, [], exc)
            if refused:
                say(backend, f"NOT RUN {refused}")
                rows[backend] = _skip_row(rec, name, backend, dtype, shape, refused, fields[backend])
            else:
                give_up(backend, exc)
            continue
        if wrong:
            rows[backend] = rec._row(name, backend, dtype, shape, status=f"wrong: {wrong}", baseline="eager",
                                     note=_fmt_note(f))
            continue
        runners[backend] = None if warm else r  # warm: compiled again in phase 2

    # 2. warm compile: a fresh Dynamo, the disk caches of the cold compiles; these models are timed
    if warm:
        torch._dynamo.reset()
    for backend in [b for b, r in runners.items() if r is None]:
        say(backend, "compile-warm ...")
        try:
            with limits[backend].phase("compile-warm"):
                r = build_runner(backend)
                r.rewind()
                t0 = time.perf_counter()
                r.step(kwargs)
                _sync(device)
                fields[backend]["compile_warm_s"] = time.perf_counter() - t0
            runners[backend] = r
            say(backend, f"compile-warm {fields[backend]['compile_warm_s']:.1f} s")
        except (Exception, harness.TimeLimitExceeded) as exc:
            give_up(backend, exc)

    # 3. warm-up: each backend's steps until its steady state (WARMUP_STEPS), outside the timed rounds
    for backend in list(runners):
        r = runners[backend]
        try:
            with limits[backend].phase("warm-up"):
                r.rewind()
                for _ in range(SMOKE_WARMUP_STEPS if smoke else WARMUP_STEPS):
                    r.step(kwargs)
                _sync(device)
        except (Exception, harness.TimeLimitExceeded) as exc:
            give_up(backend, exc)

    # 4. speed: interleaved rounds over the backends that ran and were right
    log(f"  {name:<28} timing {', '.join(runners)}")
    rounds, steps = (SMOKE_ROUNDS, SMOKE_STEPS) if smoke else (ROUNDS, STEPS_PER_ROUND)
    samples: dict[str, list[float]] = {b: [] for b in runners}
    peak: dict[str, int] = {}
    order = list(runners)
    t_timing = time.perf_counter()
    for k in range(rounds):
        for backend in order[k % len(order):] + order[:k % len(order)]:
            if backend not in runners:
                continue
            r = runners[backend]
            try:
                with limits[backend].phase("timing"):
                    r.rewind()
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    _sync(device)
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        r.step(kwargs)
                    _sync(device)
                    samples[backend].append((time.perf_counter() - t0) * 1e3 / steps)
                    if device.type == "cuda":
                        peak[backend] = max(peak.get(backend, 0), torch.cuda.max_memory_allocated())
            except (Exception, harness.TimeLimitExceeded) as exc:
                give_up(backend, exc)
    log(f"  {name:<28} timing {time.perf_counter() - t_timing:.1f} s")
    medians = {b: statistics.median(samples[b]) for b in runners}
    for backend in runners:
        f, times = fields[backend], samples[backend]
        for other in ("inductor", "inductor-max-autotune", "inductor-reduce-overhead"):
            if other in medians and other != backend:
                f[f"x_{other}"] = medians[other] / medians[backend]
        if backend in peak:
            f["peak_gib"] = peak[backend] / 2**30
        if backend == "tilefuse-reduce-overhead":  # what its CUDA graphs did over the timing, not the first step
            import tilefuse.compiler as compiler

            f["cudagraphs"] = _cudagraphs_field(compiler.stats())
        rows[backend] = rec._timed_row(name, backend, dtype, shape, medians[backend],
                                       min(_quantile(times, 0.2), medians[backend]),
                                       max(_quantile(times, 0.8), medians[backend]),
                                       {"baseline": "eager", "note": _fmt_note(f)})
    for backend in backends:
        phases = limits[backend].phases
        if phases:
            say(backend, "phases " + ", ".join(f"{p} {s:.1f} s" for p, s in phases.items()))
    ordered = [rows[b] for b in backends if b in rows]
    mine = {id(r) for r in ordered}  # the CSV lists a case's rows in the backends' order, as they were asked for
    rec.rows[:] = [r for r in rec.rows if id(r) not in mine] + ordered
    return ordered


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _note_fields(note: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in note.split("; ") if "=" in kv)


def summary(rows: list[harness.Row]) -> list[str]:
    """One line per (backend, mode): geomean speed-up over eager and over each Inductor mode timed with it,
    over the models it ran right, and which models were wrong, failed or not run."""
    lines = []
    keys = sorted({(r.impl, r.case.split("-")[-2]) for r in rows if r.impl != "eager"})
    for impl, mode in keys:
        mine = [r for r in rows if r.impl == impl and r.case.split("-")[-2] == mode]
        ok = [r.vs_baseline for r in mine if r.ok and r.vs_baseline]
        g = harness.geomean(ok)
        if not g:
            lines.append(f"{impl:<26} {mode:<6} no model timed")
        else:
            over = []
            for other in ("inductor", "inductor-max-autotune", "inductor-reduce-overhead"):
                xs = [float(_note_fields(r.note)[f"x_{other}"]) for r in mine
                      if r.ok and f"x_{other}" in _note_fields(r.note)]
                if xs:
                    over.append(f"{harness.geomean(xs):.3f}x {other} ({len(xs)})")
            lines.append(f"{impl:<26} {mode:<6} geomean {g:.3f}x eager over {len(ok)} models"
                         + (f"; {', '.join(over)}" if over else ""))
        for label, prefixes in (("wrong or failed", ("wrong", "error")), ("not run", ("not run",))):
            bad = [r.case for r in mine if r.status.startswith(prefixes)]
            if bad:
                lines.append(f"{'':<26} {mode:<6} {label}: {', '.join(bad)}")
    return lines


def run(opts: runner.SuiteOptions) -> list[harness.Row]:
    rec = opts.recorder(SUITE, compute_bound=True)
    modes = (opts.mode,) if opts.mode else MODES
    dtype = DTYPES[opts.dtype] if opts.dtype else (torch.float32 if opts.smoke else torch.bfloat16)
    backends = tuple(opts.backends) if opts.backends else (SMOKE_BACKENDS if opts.smoke else BACKENDS)
    # eager first: the baseline and the accuracy yardstick of every other backend
    backends = ("eager",) + tuple(b for b in backends if b != "eager")
    for case in cases(opts.smoke):
        if not opts.wants(case.name):
            continue
        for mode in modes:
            if mode == "decode" and not case.decoder:
                continue
            batch = 1 if mode == "decode" else (opts.batch or case.batch)  # decode: one sequence, one token
            limit = f", time limit {opts.time_limit:g} s a backend" if opts.time_limit else ""
            opts.log(f"[models] {case.name} {mode} batch {batch} ({', '.join(backends)}{limit})")
            run_case(rec, case, mode, dtype, batch, backends, opts.smoke, opts.log, time_limit=opts.time_limit or None,
                     warm=opts.warm)
    rows = rec.finish()
    for line in summary(rows):
        opts.log(f"[models] {line}")
    return rows
