"""The real-model suite's models and its accuracy rule (tests/test_real_models.py runs them).

Models: Hugging Face transformers families at tiny configs, built from config objects (random init, nothing
downloaded, dropout 0, fp32), and plain PyTorch vision, recurrent and attention models. Each is a ``Case``: a
builder, a random batch maker and a loss.

The accuracy rule follows the one PyTorch's dynamo benchmark harness uses, written here for trees of named
tensors: a compiled tensor passes if it is allclose to eager's at ``TOL``; otherwise it must be about as close
to a float64 run of the same model as eager's own result is (RMSE within ``RMSE_FACTOR`` of eager's plus a
small floor), and no element may be further from float64 than ``ELEMENT_FACTOR`` times eager's worst element
(so one wildly wrong element cannot hide in an RMSE over many right ones).

``TILEFUSE_TEST_MODEL_BACKEND`` (default ``tilefuse``) picks the backend; ``aot_eager`` checks the harness
itself: everything must pass with it.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

BACKEND = os.environ.get("TILEFUSE_TEST_MODEL_BACKEND", "tilefuse")

# ------------------------------------------------------------------------------------ accuracy rule
# fp32 tolerance of the dynamo benchmark harness: rtol, and atol as a fraction of the tensor's RMS (the
# harness's absolute 1e-4 assumes values of order 1; gradients of these models are 1e-4..1e-1).
TOL = 1e-4
# The harness allows 2x eager's RMSE against float64 (3x for tensors under 1000 elements); most tensors here
# are that small, so 3x throughout.
RMSE_FACTOR = 3.0
# The worst element may be this many times further from float64 than eager's worst element.
ELEMENT_FACTOR = 10.0
# The floor below which differences are rounding noise, as a fraction of the RMS of the whole group being
# compared (all outputs, all gradients, all parameters): a gradient that is zero in exact arithmetic (a key
# projection's bias under softmax, a conv bias before BatchNorm) is pure noise whose size depends on the
# summation order, and has no scale of its own. The harness's floor is tol/10 absolute.
FLOOR = TOL / 10


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0


def group_floor(fp64_leaves: list) -> float:
    """The absolute noise floor of a group of compared tensors: FLOOR times the RMS over all of them."""
    vals = [t.detach().reshape(-1).to("cpu", torch.float64) for t in fp64_leaves
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    if not vals:
        return 0.0
    flat = torch.cat(vals)
    return FLOOR * _rms(flat[torch.isfinite(flat)])


def _nonfinite_problem(what, res, ref) -> str | None:
    """Non-finite elements must be where eager has them, and be the same (NaN, +Inf or -Inf)."""
    if torch.isfinite(ref).all() and torch.isfinite(res).all():
        return None
    if not torch.equal(torch.isnan(res), torch.isnan(ref)):
        return (f"{what}: {int(torch.isnan(res).sum())} NaN elements, eager has {int(torch.isnan(ref).sum())} "
                f"(first differing index {_first(torch.isnan(res) != torch.isnan(ref))})")
    infs = torch.isinf(ref) | torch.isinf(res)
    if not torch.equal(res[infs], ref[infs]):
        first = _first(torch.isinf(res) != torch.isinf(ref))
        return f"{what}: Inf elements differ from eager's (first at index {first})"
    return None


def _first(mask: torch.Tensor) -> tuple:
    idx = mask.nonzero()
    return tuple(idx[0].tolist()) if len(idx) else ()


def tensor_problem(what: str, res: Any, ref: torch.Tensor, fp64: torch.Tensor | None, floor: float = 0.0) -> str | None:
    """None if the compiled tensor ``res`` passes against eager's ``ref`` and the float64 run's ``fp64``, else
    what is wrong with the numbers that decided it. ``floor``: the group's absolute noise floor (group_floor)."""
    if not isinstance(res, torch.Tensor):
        return f"{what}: compiled gave {type(res).__name__}, eager a tensor"
    if res.shape != ref.shape or res.dtype != ref.dtype or res.device != ref.device:
        return (f"{what}: compiled {tuple(res.shape)} {res.dtype} {res.device}, "
                f"eager {tuple(ref.shape)} {ref.dtype} {ref.device}")
    res, ref = res.detach(), ref.detach()
    if not ref.dtype.is_floating_point:
        if torch.equal(res, ref):
            return None
        return f"{what}: {int((res != ref).sum())} of {ref.numel()} elements differ from eager (exact comparison)"
    res, ref = res.to("cpu", torch.float64), ref.to("cpu", torch.float64)
    fp = fp64.detach().to("cpu", torch.float64) if fp64 is not None else ref
    problem = _nonfinite_problem(what, res, ref)
    if problem:
        return problem
    keep = torch.isfinite(ref) & torch.isfinite(fp)
    res, ref, fp = res[keep], ref[keep], fp[keep]
    if res.numel() == 0:
        return None
    scale = _rms(fp)
    atol = TOL * scale + floor
    if torch.allclose(res, ref, rtol=TOL, atol=atol):
        return None
    res_rmse, ref_rmse = _rms(res - fp), _rms(ref - fp)
    res_worst, ref_worst = (res - fp).abs(), float((ref - fp).abs().max())
    worst_at = int(res_worst.argmax())
    rmse_limit = RMSE_FACTOR * ref_rmse + TOL / 10 * scale + floor
    element_limit = ELEMENT_FACTOR * ref_worst + atol
    summary = (f"RMSE vs float64 {res_rmse:.3g} (eager's {ref_rmse:.3g}, limit {rmse_limit:.3g}); worst element "
               f"off by {float(res_worst[worst_at]):.3g} (eager's worst {ref_worst:.3g}, limit {element_limit:.3g}); "
               f"relative error {_rms(res - fp) / max(scale, 1e-300):.3g}, tensor RMS {scale:.3g}")
    if not res_rmse <= rmse_limit:
        return f"{what}: {summary}"
    if not float(res_worst[worst_at]) <= element_limit:
        return f"{what}: one element wildly off: {summary}"
    return None


def named_leaves(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(name, leaf) for every leaf of a model output: tensors, numbers, None; through ModelOutput, dicts,
    tuples and lists."""
    if obj is None or isinstance(obj, (torch.Tensor, int, float, bool, str)):
        return [(prefix, obj)]
    if isinstance(obj, Mapping):
        items = list(obj.items())
    elif isinstance(obj, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        raise TypeError(f"{prefix or 'the output'}: cannot compare a {type(obj).__name__} (return tensors, dicts, "
                        f"tuples; e.g. use_cache=False for a Hugging Face model)")
    out = []
    for key, value in items:
        out += named_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def tree_problems(what: str, res: Any, ref: Any, fp64: Any) -> list[str]:
    """Every leaf of the compiled output ``res`` against eager's ``ref`` and the float64 run's ``fp64``."""
    res_l, ref_l, fp_l = (dict(named_leaves(x)) for x in (res, ref, fp64))
    if list(res_l) != list(ref_l):
        return [f"{what}: compiled outputs {sorted(res_l)} != eager's {sorted(ref_l)}"]
    floor = group_floor(list(fp_l.values()))
    problems = []
    for name, r in ref_l.items():
        c, label = res_l[name], f"{what} {name}" if name else what
        if isinstance(r, torch.Tensor):
            f = fp_l.get(name)
            p = tensor_problem(label, c, r, f if isinstance(f, torch.Tensor) else None, floor)
        elif isinstance(r, float):
            p = tensor_problem(label, torch.tensor(c), torch.tensor(r), torch.tensor(fp_l.get(name, r)), floor)
        else:
            p = None if c == r else f"{label}: compiled {c!r} != eager's {r!r}"
        if p:
            problems.append(p)
    return problems


# -------------------------------------------------------------------------------------- compiling
class CountingBackend:
    """A Dynamo backend that counts the graphs handed to the real one (compiles and recompiles)."""

    def __init__(self, name: str = BACKEND):
        self.name = name
        self.inner = torch._dynamo.lookup_backend(name)
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.inner(gm, example_inputs)


def tilefuse_stats() -> dict:
    import tilefuse.compiler as compiler

    return dict(compiler.stats())


def reset_stats() -> None:
    import tilefuse.compiler as compiler

    compiler.reset_stats()


def fallback_reasons(stats: dict, limit: int = 8) -> list[str]:
    """The fallbacks, grouped by reason (the first line, shortened), most frequent first."""
    counts = collections.Counter(str(reason).splitlines()[0][:160] if str(reason).strip() else "(no reason)"
                                 for _where, reason in stats.get("fallbacks", []))
    return [f"{n}x {reason}" for reason, n in counts.most_common(limit)]


def summary(name: str, mode: str, counter: CountingBackend, stats: dict, seconds: float) -> str:
    fb = stats.get("fallbacks", [])
    line = (f"[real-models] {name} {mode} ({counter.name}): {counter.graphs} dynamo graphs; tilefuse "
            f"{stats.get('graphs', 0)} graphs ({stats.get('graph_fallbacks', 0)} ran whole in ATen), "
            f"{stats.get('kernels', 0)} kernels, {stats.get('externs', 0)} externs, {len(fb)} fallbacks; "
            f"{seconds:.1f}s")
    reasons = fallback_reasons(stats)
    return line + ("\n    fallbacks: " + "\n    fallbacks: ".join(reasons) if reasons else "")


# ------------------------------------------------------------------------------------------ cases
@dataclasses.dataclass(frozen=True)
class Case:
    """One model: ``build()`` makes it (fp32, CPU); ``batch(device)`` a random batch of forward kwargs;
    ``loss(output, batch)`` the training loss; ``infer_kwargs`` extra forward kwargs at inference;
    ``dynamo`` Dynamo config patches it needs to be traced at all."""
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.device], dict]
    loss: Callable[[Any, dict], torch.Tensor]
    infer_kwargs: dict = dataclasses.field(default_factory=dict)
    dynamo: dict = dataclasses.field(default_factory=dict)
    hf: bool = False


VOCAB, SEQ, BATCH = 128, 12, 2


def hf_loss(out, batch):
    return out.loss


def _ids(device, vocab=VOCAB, seq=SEQ, low=3, batch=BATCH):
    return torch.randint(low, vocab, (batch, seq), device=device)


def _causal_lm_batch(device, batch=BATCH, seq=SEQ):
    ids = _ids(device, seq=seq, batch=batch)
    return {"input_ids": ids, "labels": ids, "use_cache": False}


def long_causal_lm_batch(device):
    """16 sequences of 64 tokens: 1024 rows into every norm and linear, where the norms' weight gradients (column
    sums over the rows) are split in two stages, which the 24-token batches do not reach (decision 058)."""
    return _causal_lm_batch(device, batch=16, seq=64)


def _masked_lm_batch(device):
    ids = _ids(device)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # one padded sequence: masked keys in attention
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _quiet_transformers():
    transformers = __import__("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _gpt2(attn, layers=2):
    def build():
        tf = _quiet_transformers()
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=layers, n_head=2, n_inner=64,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **_TOKENS)
        return tf.GPT2LMHeadModel._from_config(cfg, attn_implementation=attn)
    return build


def _llama_like(config_cls: str, model_cls: str, attn: str = "sdpa", layers: int = 2, **extra):
    def build():
        tf = _quiet_transformers()
        cfg = getattr(tf, config_cls)(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attention_dropout=0.0, **_TOKENS, **extra)
        return getattr(tf, model_cls)._from_config(cfg, attn_implementation=attn)
    return build


def _opt():
    tf = _quiet_transformers()
    cfg = tf.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                       max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
                       activation_dropout=0.0, layerdrop=0.0, **_TOKENS)
    return tf.OPTForCausalLM._from_config(cfg, attn_implementation="sdpa")


def _bert():
    tf = _quiet_transformers()
    cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        max_position_embeddings=64, type_vocab_size=2, pad_token_id=0)
    return tf.BertForMaskedLM._from_config(cfg, attn_implementation="sdpa")


def _bert_batch(device):
    b = _masked_lm_batch(device)
    # expanded (stride 0), as BertModel makes them itself when none are given
    b["token_type_ids"] = (torch.arange(SEQ, device=device) >= SEQ // 2).long().expand(BATCH, SEQ)
    return b


def _t5():
    tf = _quiet_transformers()
    cfg = tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      dropout_rate=0.0, feed_forward_proj="gated-gelu", decoder_start_token_id=0,
                      pad_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    return tf.T5ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")


def _t5_batch(device):
    b = _masked_lm_batch(device)
    b["labels"] = _ids(device, seq=8)
    b["use_cache"] = False
    return b


def _vit():
    tf = _quiet_transformers()
    cfg = tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, num_labels=5)
    return tf.ViTForImageClassification._from_config(cfg, attn_implementation="sdpa")


def _vit_batch(device):
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, device=device),
            "labels": torch.randint(0, 5, (BATCH,), device=device)}


# --------------------------------------------------------------------------- plain PyTorch models
def _randomize_batchnorm(model: nn.Module) -> nn.Module:
    """Running statistics and affine parameters away from their 0/1 init, so eval mode is not an identity."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.normal_(1, 0.1)
                m.bias.normal_(0, 0.1)
    return model


def _conv_bn(cin, cout, k=3, stride=1, groups=1, act: Callable | None = nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, stride=stride), _conv_bn(cout, cout, act=None))
        self.short = _conv_bn(cin, cout, k=1, stride=stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


class TinyResNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.stem = _conv_bn(3, 8)
        self.blocks = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project (BN + ReLU6 between), residual when shapes allow."""

    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(_conv_bn(cin, mid, k=1, act=nn.ReLU6),
                                  _conv_bn(mid, mid, stride=stride, groups=mid, act=nn.ReLU6),
                                  _conv_bn(mid, cout, k=1, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class TinyMobileNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.features = nn.Sequential(_conv_bn(3, 8, stride=2, act=nn.ReLU6), InvertedResidual(8, 8, 1),
                                      InvertedResidual(8, 16, 2))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class TinyUNet(nn.Module):
    """Two levels down (max-pool), up by transposed conv and by bilinear upsampling, skips concatenated."""

    def __init__(self, cin=3, classes=3):
        super().__init__()
        self.enc1 = nn.Sequential(_conv_bn(cin, 8), _conv_bn(8, 8))
        self.enc2 = nn.Sequential(_conv_bn(8, 16), _conv_bn(16, 16))
        self.mid = _conv_bn(16, 32)
        self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec2 = _conv_bn(32, 16)
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                 nn.Conv2d(16, 8, 1))
        self.dec1 = _conv_bn(16, 8)
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


class RecurrentLM(nn.Module):
    def __init__(self, cell: str, vocab=64, emb=16, hidden=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        if cell == "lstm":
            self.rnn = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
            out = hidden
        else:
            self.rnn = nn.GRU(emb, hidden, num_layers=1, batch_first=True, bidirectional=True)
            out = 2 * hidden
        self.head = nn.Linear(out, vocab)

    def forward(self, ids):
        y, _ = self.rnn(self.emb(ids))
        return self.head(y)


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (post-norm layer, then a pre-norm layer) over padded sequences, mean-pooled."""

    def __init__(self, d=32, classes=5):
        super().__init__()
        layer = dict(d_model=d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.post = nn.TransformerEncoderLayer(**layer, activation="gelu")
        self.pre = nn.TransformerEncoderLayer(**layer, norm_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x, pad):
        h = self.pre(self.post(x, src_key_padding_mask=pad), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


class AttentionBlock(nn.Module):
    """nn.MultiheadAttention (self-attention with a padding mask, head-averaged weights returned) + residual MLP."""

    def __init__(self, d=32, classes=5):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 4, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))
        self.head = nn.Linear(d, classes)

    def forward(self, x, pad):
        a, weights = self.attn(x, x, x, key_padding_mask=pad, need_weights=True)
        h = self.norm(x + a)
        h = h + self.mlp(h)
        return self.head(h[:, 0]), weights


def _image_batch(device, classes=5):
    return {"x": torch.randn(BATCH, 3, 16, 16, device=device),
            "target": torch.randint(0, classes, (BATCH,), device=device)}


def _unet_batch(device):
    return {"x": torch.randn(BATCH, 3, 16, 16, device=device),
            "target": torch.randint(0, 3, (BATCH, 16, 16), device=device)}


RNN_SEQ = 6  # the recurrence is unrolled into per-step kernels: its cost grows with the length


def _seq_batch(device):
    return {"ids": torch.randint(0, 64, (BATCH, RNN_SEQ), device=device)}


def _padded_batch(device):
    pad = torch.zeros(BATCH, 10, dtype=torch.bool, device=device)
    pad[1, 7:] = True
    return {"x": torch.randn(BATCH, 10, 32, device=device), "pad": pad,
            "target": torch.randint(0, 5, (BATCH,), device=device)}


def _classify_loss(out, batch):
    logits = out[0] if isinstance(out, tuple) else out
    return F.cross_entropy(logits, batch["target"])


def _next_token_loss(out, batch):
    return F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), batch["ids"][:, 1:].reshape(-1))


def _case(name, build, batch, loss=hf_loss, **kw):
    return Case(name, build, batch, loss, **kw)


CASES: dict[str, Case] = {c.name: c for c in [
    _case("gpt2-sdpa", _gpt2("sdpa"), _causal_lm_batch, hf=True),
    _case("gpt2-eager", _gpt2("eager"), _causal_lm_batch, hf=True),
    _case("llama-sdpa", _llama_like("LlamaConfig", "LlamaForCausalLM"), _causal_lm_batch, hf=True),
    _case("llama-eager", _llama_like("LlamaConfig", "LlamaForCausalLM", "eager"), _causal_lm_batch, hf=True),
    # sliding window 8 < sequence 12: the banded causal mask
    _case("mistral", _llama_like("MistralConfig", "MistralForCausalLM", sliding_window=8), _causal_lm_batch, hf=True),
    _case("qwen2", _llama_like("Qwen2Config", "Qwen2ForCausalLM"), _causal_lm_batch, hf=True),  # q/k/v biases
    _case("opt", _opt, _causal_lm_batch, hf=True),
    _case("bert", _bert, _bert_batch, hf=True),
    _case("t5", _t5, _t5_batch, hf=True),
    _case("vit", _vit, _vit_batch, hf=True),
    _case("resnet", lambda: _randomize_batchnorm(TinyResNet()), _image_batch, _classify_loss),
    _case("mobilenet", lambda: _randomize_batchnorm(TinyMobileNet()), _image_batch, _classify_loss),
    _case("unet", lambda: _randomize_batchnorm(TinyUNet()), _unet_batch,
          lambda out, b: F.cross_entropy(out, b["target"])),
    # Dynamo runs nn.LSTM/GRU in eager (a graph break) unless allow_rnn: the point here is to compile them.
    _case("lstm", lambda: RecurrentLM("lstm"), _seq_batch, _next_token_loss, dynamo={"allow_rnn": True}),
    _case("gru", lambda: RecurrentLM("gru"), _seq_batch, _next_token_loss, dynamo={"allow_rnn": True}),
    _case("transformer-encoder", EncoderClassifier, _padded_batch, _classify_loss),
    _case("multihead-attention", AttentionBlock, _padded_batch, _classify_loss),
]}

# The causal LMs at 1024 tokens (long_causal_lm_batch), one layer each: a layer's kernels are the same in every
# layer, and on the interpreter the second layer doubled the time of a step (two layers took 87 s for GPT-2 and
# 128 s for Llama in a 2-core CI run, for two steps)
LONG_CASES: dict[str, Case] = {c.name: c for c in [
    _case("gpt2-sdpa", _gpt2("sdpa", layers=1), long_causal_lm_batch, hf=True),
    _case("llama-sdpa", _llama_like("LlamaConfig", "LlamaForCausalLM", layers=1), long_causal_lm_batch, hf=True),
]}

# forward kwargs that are targets of the loss, not model inputs (plain PyTorch models)
TARGET_KEYS = ("target",)


def forward_kwargs(case: Case, batch: dict, *, inference: bool) -> dict:
    kw = {k: v for k, v in batch.items() if case.hf or k not in TARGET_KEYS}
    if case.hf and inference:
        kw["output_hidden_states"] = True
    return kw


def to_double(batch: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.dtype.is_floating_point else v
            for k, v in batch.items()}


def model_loss(case: Case, model, batch: dict) -> torch.Tensor:
    return case.loss(model(**forward_kwargs(case, batch, inference=False)), batch)
