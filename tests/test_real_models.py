"""The real-model suite: Hugging Face transformers families and plain PyTorch models through
``torch.compile(..., backend="tilefuse")``, against eager and a float64 run (tests/real_models.py's rule).

Per model: inference (eval, no_grad, every output) and training (two AdamW steps: the loss, every gradient,
every parameter and buffer after each step). Also: greedy ``generate()`` with its KV cache (same tokens as
eager, a bound on graphs compiled), and a whole training step (forward, backward, optimizer step) under one
``torch.compile``. Each test prints a line of what compiled and what fell back, and why (``pytest -s``).
Non-strict: a fallback to ATen is allowed and reported, a wrong answer is not; on the CPU each model's count of
fallbacks is held to CPU_FALLBACKS (most have none), so a new one shows.

TILEFUSE_TEST_MODEL_BACKEND=aot_eager runs the same checks through PyTorch's own backend (all must pass: that
checks the harness). CPU budget: about 4 minutes on the 2-core machine (Triton's interpreter).
"""
from __future__ import annotations

import contextlib
import copy
import time

import pytest
import torch

from . import real_models as rm
from .support import interpreter_only

LR, WEIGHT_DECAY, TRAIN_STEPS = 1e-3, 0.01, 2
# AdamW divides by sqrt(v) + eps: a gradient that is zero in exact arithmetic (a bias before a train-mode
# BatchNorm, a key bias under softmax) is fp32 rounding noise (7e-9 measured on MobileNet), and with the
# default eps 1e-8 it moves its parameter by up to LR in a random direction, in eager as in any compiled run.
# eps 1e-4 keeps that under 1e-3 LR while gradients of 1e-3..1e-1 still get Adam steps.
ADAM_EPS = 1e-4
NEW_TOKENS, PROMPT = 4, 8
# generate(): the prompt, the first decode step and the decode steps once Dynamo has made the cache length
# dynamic are at most three compiles of the forward; a graph break would multiply them, a recompile per token
# would exceed the bound with NEW_TOKENS = 4.
GENERATE_GRAPH_LIMIT = 3

# (the cpu cases on a GPU machine: every one failed "generated no kernel", its CPU tensors run in ATen)
DEVICES = [pytest.param("cpu", id="cpu", marks=interpreter_only), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
MAX_SHOWN = 20  # mismatches listed in a failure message (all are counted)
HF_GENERATE = ["gpt2-sdpa", "llama-sdpa"]
# One transformer's whole compiled step (Dynamo traces AdamW over every parameter: ~160 s of CPU a model on the
# interpreter, most of the file's time); test_compiler_training.py compiles a small MLP's step as well.
WHOLE_STEP = ["gpt2-sdpa"]
# Trained on 16 x 64 tokens as well: a norm's weight gradient over 1024 rows is split in two stages (decision 058),
# which the 24-token batches never reach; LayerNorm and RMSNorm
LONG_BATCH = list(rm.LONG_CASES)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _case(name: str, cases: dict = rm.CASES) -> rm.Case:
    case = cases[name]
    if case.hf:
        pytest.importorskip("transformers", reason="the Hugging Face families need transformers "
                                                   "(pinned in the Makefile's DEPS)")
    return case


def _build(case: rm.Case, device: str, train: bool):
    """The model and two deep copies with identical weights: (eager, float64 reference, to compile)."""
    model = case.build().to(device).train(train)
    return model, copy.deepcopy(model).double(), copy.deepcopy(model)


# The fallbacks each model has on the CPU (Triton's interpreter), by (model, what was compiled); every other model
# and mode has none. A count that moves either way fails the test: a new fallback is a regression (or a choice to
# write down here), one fewer is progress to record. (On a GPU the ATen kernels differ, e.g. an RNN's; no count.)
CPU_FALLBACKS = {
    ("unet", "inference"): 2,  # max_pool2d_with_indices
    ("unet", "training"): 4,  # max_pool2d_with_indices, forward and backward
    ("lstm", "inference"): 2,  # mkldnn_rnn_layer (the CPU's fused RNN kernel, eval only)
    ("transformer-encoder", "inference"): 2,  # _transformer_encoder_layer_fwd (nn.TransformerEncoder's fast path)
}


@contextlib.contextmanager
def _compiling(case: rm.Case, what: str, device: str):
    """Dynamo set up for the case; tilefuse's counters zeroed; yields a report dict filled on exit; an
    exception gets the report (what compiled, what fell back) attached."""
    counter = rm.CountingBackend()
    rm.reset_stats()
    report = {"counter": counter, "case": case.name, "what": what, "device": device}
    t0 = time.perf_counter()
    try:
        with torch._dynamo.config.patch(**case.dynamo):
            yield report
    except Exception as exc:
        exc.add_note(rm.summary(case.name, what, counter, rm.tilefuse_stats(), time.perf_counter() - t0))
        raise
    finally:
        report["stats"] = rm.tilefuse_stats()
        report["text"] = rm.summary(case.name, what, counter, report["stats"], time.perf_counter() - t0)
        print("\n" + report["text"], flush=True)


def _check(report: dict, problems: dict[str, list[str]]) -> None:
    """Wrong answers first (``problems``: by what was compared; all counted, the first MAX_SHOWN shown), then a
    model tilefuse did not compile at all (every graph in ATen: the suite would pass without testing the
    compiler)."""
    counts = ", ".join(f"{part}: {len(ps)}" for part, ps in problems.items() if ps)
    problems = [p for ps in problems.values() for p in ps]
    if problems:
        raise AssertionError(f"{len(problems)} mismatches ({counts}):\n  " + "\n  ".join(problems[:MAX_SHOWN])
                             + "\n" + report["text"])
    s = report["stats"]
    if rm.BACKEND == "tilefuse":
        assert int(s.get("graphs", 0)) >= 1 and int(s.get("kernels", 0)) + int(s.get("cache_hits", 0)) >= 1, \
            f"tilefuse generated no kernel for the model (it ran in ATen):\n{report['text']}"
        if report["device"] == "cpu":
            expected = CPU_FALLBACKS.get((report["case"], report["what"]), 0)
            got = len(s.get("fallbacks", []))
            assert got == expected, f"{got} fallbacks where this model has {expected} (CPU_FALLBACKS):\n" \
                                    f"{report['text']}"


# ---------------------------------------------------------------------------------------- inference
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(rm.CASES))
def test_inference(name, device):
    case = _case(name)
    eager, fp64, model = _build(case, device, train=False)
    kwargs = rm.forward_kwargs(case, case.batch(torch.device(device)), inference=True)
    with torch.no_grad():
        expected = eager(**kwargs)
        reference = fp64(**rm.to_double(kwargs))
        with _compiling(case, "inference", device) as report:
            out = torch.compile(model, backend=report["counter"])(**kwargs)
    _check(report, {"output": rm.tree_problems("output", out, expected, reference)})


# ----------------------------------------------------------------------------------------- training
def _snapshot(model, loss) -> dict:
    """What one training step is judged on: the loss, gradients, then parameters and buffers after the step."""
    return {"loss": loss.detach(),
            "grad": {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()},
            "param": {n: p.detach().clone() for n, p in model.named_parameters()},
            "buffer": {n: b.detach().clone() for n, b in model.named_buffers()}}


def step_problems(step: int, compiled: dict, eager: dict, fp64: dict) -> dict[str, list[str]]:
    """The rule on each part of a step's snapshot, by part ("step 0 grad": [...])."""
    return {f"step {step} {part}": rm.tree_problems(f"step {step} {part}", compiled[part], eager[part], fp64[part])
            for part in ("loss", "grad", "param", "buffer")}


def _train(case: rm.Case, device: str, step_fn, what: str, n_steps: int = TRAIN_STEPS):
    """``n_steps`` steps on eager, float64 and compiled copies; ``step_fn(model, opt, counter)`` returns the
    callable (batch -> loss after backward and optimizer step) for a copy, compiled when counter is given."""
    models = dict(zip(("eager", "fp64", "compiled"), _build(case, device, train=True)))
    opts = {k: torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=ADAM_EPS)
            for k, m in models.items()}
    problems = {}
    with _compiling(case, what, device) as report:
        steps = {k: step_fn(m, opts[k], report["counter"] if k == "compiled" else None) for k, m in models.items()}
        for step in range(n_steps):
            batch = case.batch(torch.device(device))
            seen = {}
            for k in ("eager", "fp64", "compiled"):
                loss = steps[k](rm.to_double(batch) if k == "fp64" else batch)
                seen[k] = _snapshot(models[k], loss)
                opts[k].zero_grad(set_to_none=True)
            problems.update(step_problems(step, seen["compiled"], seen["eager"], seen["fp64"]))
    _check(report, problems)


def _module_compiled(case):
    """The model compiled (as users do); loss, backward and the optimizer step in eager."""
    def make(model, opt, counter):
        run = torch.compile(model, backend=counter) if counter else model

        def step(batch):
            loss = case.loss(run(**rm.forward_kwargs(case, batch, inference=False)), batch)
            loss.backward()
            opt.step()
            return loss
        return step
    return make


def _step_compiled(case):
    """The whole step (forward, loss.backward(), optimizer.step()) under one torch.compile."""
    def make(model, opt, counter):
        def train_step(batch):
            loss = rm.model_loss(case, model, batch)
            loss.backward()
            opt.step()
            return loss.detach()
        return torch.compile(train_step, backend=counter) if counter else train_step
    return make


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(rm.CASES))
def test_training(name, device):
    case = _case(name)
    _train(case, device, _module_compiled(case), "training")


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LONG_BATCH)
def test_training_at_1024_tokens(name, device):
    """One step (the loss, every gradient, the parameters after the update) of a one-layer model
    (rm.LONG_CASES): what the column sums' plan at 1024 rows decides. Most of the time is the interpreter running
    the step's kernels; a second step adds only the optimizer's state, which test_training checks."""
    case = _case(name, rm.LONG_CASES)
    _train(case, device, _module_compiled(case), "training at 1024 tokens", n_steps=1)
    if rm.BACKEND == "tilefuse":  # the plan this test is for: the column sums in row-loop kernels (none at 24 tokens)
        from tilefuse.compiler import records

        forms = [k.form for r in records.REPORTS if r.kind == "backward" for k in r.kernels]
        assert "rowloop" in forms, f"no row-loop kernel in the backward at 1024 tokens: {forms}"


@pytest.mark.slow  # Dynamo traces the optimizer step too: the heaviest compile in the file
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", WHOLE_STEP)
def test_whole_training_step_compiled(name, device):
    case = _case(name)
    _train(case, device, _step_compiled(case), "compiled train_step")


# ----------------------------------------------------------------------------------------- generate
@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", HF_GENERATE)
def test_generate_with_kv_cache(name, device):
    """Greedy decoding with the DynamicCache: eager's tokens, logits by the accuracy rule (float64 logits from
    one teacher-forced forward over eager's tokens), a bounded number of graphs, none new on a second call."""
    case = _case(name)
    eager, fp64, model = _build(case, device, train=False)
    prompts = [torch.randint(3, rm.VOCAB, (rm.BATCH, PROMPT), device=device) for _ in range(2)]
    kw = dict(attention_mask=torch.ones_like(prompts[0]), max_new_tokens=NEW_TOKENS, do_sample=False,
              return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        expected = [eager.generate(p, **kw) for p in prompts]
        with _compiling(case, "generate", device) as report:
            counter = report["counter"]
            model.forward = torch.compile(model.forward, backend=counter)
            out = model.generate(prompts[0], **kw)
            first = counter.graphs
            again = model.generate(prompts[1], **kw)
        problems = {}
        for i, (o, e) in enumerate(zip((out, again), expected)):
            if not torch.equal(o.sequences, e.sequences):
                problems[f"call {i} tokens"] = [f"call {i}: tokens {o.sequences[:, PROMPT:].tolist()} != eager's "
                                                f"{e.sequences[:, PROMPT:].tolist()}"]
                continue
            ref = fp64(e.sequences[:, :-1], use_cache=False).logits[:, PROMPT - 1:]
            problems[f"call {i} logits"] = rm.tree_problems(f"call {i} logits", torch.stack(o.logits, 1),
                                                            torch.stack(e.logits, 1), ref)
    assert first <= GENERATE_GRAPH_LIMIT, f"generate() compiled {first} graphs for {NEW_TOKENS} tokens " \
                                          f"(limit {GENERATE_GRAPH_LIMIT}):\n{report['text']}"
    assert counter.graphs == first, f"a second generate() of the same lengths compiled " \
                                    f"{counter.graphs - first} more graphs:\n{report['text']}"
    _check(report, problems)


# -------------------------------------------------------------------------------- the rule itself
def _flat(problems: dict) -> list[str]:
    return [p for ps in problems.values() for p in ps]


def test_accuracy_rule_catches_planted_errors():
    """The harness on two eager runs: identical copies pass; a gradient scaled by 1.01, a NaN, one element far
    off in a noisy tensor, and rounding-noise-sized differences are judged as they should be."""
    case = rm.CASES["resnet"]
    models = dict(zip(("eager", "fp64", "compiled"), _build(case, "cpu", train=True)))
    batch = case.batch(torch.device("cpu"))
    seen = {}
    for k, m in models.items():
        loss = rm.model_loss(case, m, rm.to_double(batch) if k == "fp64" else batch)
        loss.backward()
        seen[k] = _snapshot(m, loss)
    problems = _flat(step_problems(0, seen["compiled"], seen["eager"], seen["fp64"]))
    assert not problems, f"identical copies failed the rule: {problems}"

    name = "blocks.1.body.0.0.weight"
    planted = copy.deepcopy(seen["compiled"])
    planted["grad"][name] *= 1.01
    problems = _flat(step_problems(0, planted, seen["eager"], seen["fp64"]))
    assert len(problems) == 1 and name in problems[0], f"a gradient scaled by 1.01: {problems}"

    planted = copy.deepcopy(seen["compiled"])
    planted["grad"][name].view(-1)[5] = float("nan")
    problems = _flat(step_problems(0, planted, seen["eager"], seen["fp64"]))
    assert len(problems) == 1 and "NaN" in problems[0], f"a NaN gradient element: {problems}"

    # A tensor where eager is far from float64 (an ill-conditioned result): one element 20x eager's worst error
    # keeps the RMSE within 3x of eager's on 10000 elements, but not the element cap.
    exact = torch.randn(10000, dtype=torch.float64)
    noisy = (exact + 1e-3 * torch.randn_like(exact)).float()
    wrong = exact.float().clone()
    wrong[123] += 20 * float((noisy.double() - exact).abs().max())
    problem = rm.tensor_problem("ill-conditioned", wrong, noisy, exact)
    assert problem and "wildly off" in problem, problem
    assert rm.tensor_problem("ill-conditioned", exact.float(), noisy, exact) is None

    # Rounding noise: a different summation order passes.
    x = torch.randn(64, 257, dtype=torch.float64)
    w = torch.randn(257, 33, dtype=torch.float64)
    eager = x.float() @ w.float()
    other = (x.float().unsqueeze(-1) * w.float()).flip(1).sum(1)
    assert rm.tensor_problem("matmul", other, eager, x @ w) is None
    # ... and so does a zero-in-exact-arithmetic tensor at noise level, against the group's floor.
    noise = torch.randn(33) * 1e-9
    exact_grads = {"w": x @ w, "b": torch.zeros(33, dtype=torch.float64)}
    assert not rm.tree_problems("grads", {"w": eager, "b": noise * 3}, {"w": eager, "b": noise}, exact_grads)
