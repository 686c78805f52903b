"""bench/gpu.py's cases and the implementations it times: the grid, the seeded inputs and masks, and
for each implementation (ours, SDPA's flash and cuDNN backends, compiled FlexAttention, flash-attn)
the maker that sets it up for a case, or says in a few words why it cannot. See bench/gpu.py.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from peers import sdpa_shape

MASKS, PASSES, DOCUMENTS = ("causal", "window", "documents"), ("forward", "fwd+bwd"), 4
BACKWARD_FLOPS = 2.5  # the backward's FLOPs, in forwards (FlashAttention-2)
FLOP_NOTE = ("FLOPs count the pairs the mask lets through: forward 4 * batch * heads * pairs * d, fwd+bwd 3.5x "
             "(the backward as 2.5 forwards, FlashAttention-2's convention); ratio = ours / peer, below 1: ours faster")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Grid:
    sizes: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
    masks: tuple[str, ...] = MASKS
    tokens: int = 32768  # batch = tokens // N
    heads: int = 16
    head_dim: int = 128
    window: int = 1024
    rounds: int = 10
    device: str = "cuda"
    check_n: int = 2048
    check_batch: int = 2
    sample_ms: float = 10.0  # a sample repeats a short call until it covers this long
    warmup: int = 2  # calls after the first (which compiles) and the one that sizes the samples


QUICK = {"sizes": (4096,), "dtypes": (torch.float16,), "rounds": 3}
INTERPRET = Grid(sizes=(64, 96), dtypes=(torch.float32,), tokens=192, heads=2, head_dim=16, window=24, rounds=2,
                 device="cpu", check_n=96, check_batch=1, sample_ms=0.0, warmup=0)
INTERPRET_QUICK = {"sizes": (64,), "rounds": 1}


class Unavailable(Exception):
    """A peer that cannot run a case; the message says why in a few words."""


@dataclass
class Case:
    """One mask, N, batch and dtype: the seeded inputs, and the mask as selfattn's structured rule."""

    mask: str
    n: int
    batch: int
    dtype: torch.dtype
    device: str
    structured: object  # True = may attend
    lengths: list[int] | None  # the documents'
    qkv: list[torch.Tensor]  # (batch, heads, N, d), requiring grad
    grad_out: torch.Tensor  # (batch, heads, N, d)


@dataclass
class Side:
    """An implementation set up for a case: fn(*inputs) -> out; unpack brings its results to (batch, heads, N, d)."""

    name: str
    fn: object
    inputs: list
    grad_out: torch.Tensor
    note: str = ""
    unpack: object = None
    first_call_s: float = 0.0

    def __post_init__(self) -> None:
        self.frozen = [t.detach() for t in self.inputs]  # the forward pass's inputs: no graph, nothing saved


@dataclass
class Row:
    dtype: str
    mask: str
    n: int
    batch: int
    heads: int
    d: int
    pass_: str
    visible_pairs: int
    flops: float
    window: int | None = None
    document_lengths: list[int] | None = None
    ours_ms: float | None = None
    ours_tflops: float | None = None
    ours_backend: str | None = None  # what selfattn.kernels.last_backend() said after our first call
    ours_first_call_s: float | None = None
    ours_error: str | None = None
    peers: dict = field(default_factory=dict)  # name -> {"ms", "ratio", "tflops", "first_call_s", ...} or {"n/a": why}


def document_lengths(n: int, count: int = DOCUMENTS) -> list[int]:
    """count lengths that tile n: cut k near k n / count, moved by up to n / (4 count), seeded by n."""
    rng = random.Random(n)
    cuts = [0] + [round((k + rng.uniform(-0.25, 0.25)) * n / count) for k in range(1, count)] + [n]
    return [b - a for a, b in zip(cuts, cuts[1:])]


def visible_pairs(mask: str, n: int, window: int, lengths) -> int:
    """The (query, key) pairs the mask lets through, in closed form."""
    if mask == "causal":
        return n * (n + 1) // 2
    if mask == "window":  # rows i < w see i + 1 keys, the others w
        w = min(window, n)
        return w * (w + 1) // 2 + (n - w) * w
    return sum(length * (length + 1) // 2 for length in lengths)


def flops(pass_: str, batch: int, heads: int, pairs: int, d: int) -> float:
    forward = 4.0 * batch * heads * pairs * d  # S = QK^T and O = PV, 2 FLOPs per multiply-add
    return forward * (1 + BACKWARD_FLOPS) if pass_ == "fwd+bwd" else forward


def make_case(mask: str, n: int, batch: int, dtype: torch.dtype, grid: Grid) -> Case:
    from selfattn.masks import causal_mask, document_mask, sliding_window_mask

    lengths = document_lengths(n) if mask == "documents" else None
    if mask == "causal":
        structured = causal_mask(n, structured=True)
    elif mask == "window":
        structured = sliding_window_mask(n, left=grid.window - 1, structured=True)
    else:
        structured = causal_mask(n, structured=True) & document_mask(lengths, structured=True)
    g = torch.Generator(device=grid.device).manual_seed(n)
    shape = (batch, grid.heads, n, grid.head_dim)
    q, k, v, grad_out = (torch.randn(shape, generator=g, device=grid.device, dtype=dtype) for _ in range(4))
    return Case(mask, n, batch, dtype, grid.device, structured, lengths, [t.requires_grad_() for t in (q, k, v)], grad_out)


# ---- the implementations: each maker gives candidates; the first whose first call works is timed ----

def make_ours(case: Case, state: State) -> list[Side]:
    flash = state.sa.flash_attention
    kwargs = {"is_causal": True} if case.mask == "causal" else {"attn_mask": case.structured}
    return [Side("ours", lambda q, k, v: flash(q, k, v, backend="triton", **kwargs), case.qkv, case.grad_out)]


def sdpa_under(backend: str, **kwargs):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, backend)

    def run(q, k, v):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return run


def make_sdpa_flash(case: Case, state: State) -> list[Side]:
    if not state.cuda:
        raise Unavailable("CUDA only")
    if case.mask != "causal":
        raise Unavailable("takes no mask, only is_causal")
    return [Side("sdpa-flash", sdpa_under("FLASH_ATTENTION", is_causal=True), case.qkv, case.grad_out)]


def make_sdpa_cudnn(case: Case, state: State) -> list[Side]:
    from selfattn.masks import to_additive

    if not state.cuda:
        raise Unavailable("CUDA only")
    if case.mask == "causal":
        return [Side("sdpa-cudnn", sdpa_under("CUDNN_ATTENTION", is_causal=True), case.qkv, case.grad_out)]
    allowed = sdpa_shape(case.structured.dense(case.device))  # (1, 1, N, N)
    bias = to_additive(allowed, case.dtype)  # (1, 1, N, N): 0 or -inf, in the inputs' dtype
    return [Side("sdpa-cudnn", sdpa_under("CUDNN_ATTENTION", attn_mask=bias), case.qkv, case.grad_out, "dense bias"),
            Side("sdpa-cudnn", sdpa_under("CUDNN_ATTENTION", attn_mask=allowed), case.qkv, case.grad_out, "dense bool")]


def make_sdpa_cpu(case: Case, state: State) -> list[Side]:
    kwargs = {"is_causal": True} if case.mask == "causal" else {"attn_mask": sdpa_shape(case.structured.dense(case.device))}
    return [Side("sdpa-cpu", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), case.qkv,
                 case.grad_out, "stand-in: SDPA's CPU kernel")]


def make_flex(case: Case, state: State) -> list[Side]:
    run, block_mask = state.flex(), state.block_mask(case)
    note = "" if state.cuda else "stand-in: eager, not compiled"
    return [Side("flex", lambda q, k, v: run(q, k, v, block_mask=block_mask), case.qkv, case.grad_out, note)]


def make_flash_attn(case: Case, state: State) -> list[Side]:
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func
    except ImportError:
        raise Unavailable("not installed") from None
    if not state.cuda:
        raise Unavailable("CUDA only")
    b, h, n, d = case.qkv[0].shape
    q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in case.qkv)  # (B, N, H, d)
    grad_out = case.grad_out.transpose(1, 2).contiguous()
    if case.mask != "documents":
        window = (state.grid.window - 1, 0) if case.mask == "window" else (-1, -1)
        return [Side("flash-attn", lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=window), [q, k, v],
                     grad_out, unpack=lambda x: x.transpose(1, 2))]
    starts = [sum(case.lengths[:i]) for i in range(len(case.lengths))]
    cu = torch.tensor([s * n + o for s in range(b) for o in starts] + [b * n], dtype=torch.int32, device=case.device)
    longest = max(case.lengths)
    packed = [t.detach().reshape(b * n, h, d).requires_grad_() for t in (q, k, v)]  # (B N, H, d): every document in a row
    return [Side("flash-attn", lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True),
                 packed, grad_out.reshape(b * n, h, d), "varlen", lambda x: x.reshape(b, n, h, d).transpose(1, 2))]


class State:
    """What the run shares: the library, the implementations, the compiled FlexAttention, block masks per (mask, N)."""

    def __init__(self, grid: Grid) -> None:
        import selfattn

        self.sa, self.grid, self.cuda = selfattn, grid, grid.device == "cuda"
        self.makers = [("ours", make_ours)] + ([] if self.cuda else [("sdpa-cpu", make_sdpa_cpu)]) + [
            ("sdpa-flash", make_sdpa_flash), ("sdpa-cudnn", make_sdpa_cudnn), ("flex", make_flex),
            ("flash-attn", make_flash_attn)]
        self.ours_backend, self._flex, self._block_masks = None, None, {}
        self.refused: dict = {}  # (name, mask, dtype, backward) -> why, for first calls that failed slowly (compiling)

    def flex(self):
        from torch.nn.attention.flex_attention import flex_attention

        if self._flex is None and not self.cuda:
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            self._flex = flex_attention
        elif self._flex is None:
            import torch._dynamo.config as dynamo
            import torch.fx.experimental._config as fx_config

            # 3 masks x 2 dtypes x 2 passes (inference and training graphs) pass dynamo's default limit of 8
            # compilations, past which it would run FlexAttention eagerly. Duck sizing would tie sizes equal at
            # the first call (16 heads and 16 key blocks at N = 2048) and compile again when they part.
            setattr(dynamo, "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit", 64)
            if hasattr(fx_config, "use_duck_shape"):
                fx_config.use_duck_shape = False
            self._flex = torch.compile(flex_attention, dynamic=True)
        return self._flex

    def block_mask(self, case: Case):
        from torch.nn.attention.flex_attention import create_block_mask

        if (case.mask, case.n) not in self._block_masks:
            window = self.grid.window
            if case.mask == "causal":
                rule = lambda b, h, q, kv: q >= kv  # noqa: E731
            elif case.mask == "window":
                rule = lambda b, h, q, kv: (q >= kv) & (q - kv < window)  # noqa: E731
            else:
                doc = torch.repeat_interleave(torch.arange(len(case.lengths)), torch.tensor(case.lengths)).to(case.device)
                rule = lambda b, h, q, kv: (q >= kv) & (doc[q] == doc[kv])  # noqa: E731
            self._block_masks[case.mask, case.n] = create_block_mask(rule, None, None, case.n, case.n, device=case.device)
        return self._block_masks[case.mask, case.n]


def last_backend() -> str:
    """What selfattn.kernels.last_backend() says ran the last flash call."""
    from selfattn.kernels import last_backend as backend

    return str(backend())


def short_error(error: Exception, caught=()) -> str:
    """The exception's type and first sentence, and the first warning that says why (SDPA explains in warnings)."""
    if isinstance(error, Unavailable):
        return str(error)
    text = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0].split('. ')[0]}"
    reasons = [str(w.message).strip().splitlines()[0] for w in caught if "because" in str(w.message)]
    return (text + (f" ({reasons[0]})" if reasons else ""))[:240]


def call(side: Side, backward: bool):
    if not backward:
        with torch.no_grad():
            return side.fn(*side.frozen)
    for t in side.inputs:
        t.grad = None
    out = side.fn(*side.inputs)
    out.backward(side.grad_out)
    return out
