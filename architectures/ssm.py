"""SSM family: selective diagonal linear recurrence (Mamba/S5-style) over the context.

Shape legend (einsum letters):
  b batch, l scanned positions (query + context), n context positions,
  t reader positions, e embed, c inner channels, s state size, p read slots (ports),
  w conv taps.

Recurrence (per channel c and state index s, diagonal):
  h_j = A_j ⊙ h_{j-1} + B_j x_j,   A_j = exp(Δ_j · A),  B_j x_j = Δ_j · B_j · x_j,
with input-dependent (selective) Δ_j, B_j. `scan_impl` picks how the
recurrence runs:
  'auto' (the default): 'linear' on CPU, 'chunked' on an accelerator — the faster
    of the two measured there (H200, 2026-11-30, p400k n = 512 batch 128, median of
    3 x 20 steps: plain 12.2 vs 18.2 ms, CER k = 1 26.1 vs 45.1 ms, k = 2 26.3 vs
    45.3 ms against 'associative', 'auto's choice until then; the H100 of
    2026-11-26 ran 'associative' only; docs/accelerator/h200_2026-11-30_warm/).
  'linear' (CPU's default since 2026-11-29): the gates materialised ([b,l,c,s]), one
    `lax.scan` over them, its gradient written out (`ssm_scan.linear_scan`: the
    adjoint recurrence from the right, the rest element-wise over whole tensors);
    the unmasked read keeps the states at passage ends, masked reads go through the
    closed form, its contributions straight from the gate factors as with 'chunked'
    (`gate_slot_contributions`, its segment sums by `lax.scan`: no reverse scan over
    [b,n,c,s]; CER k = 1 loss gradient 156 → 141 ms against the reverse `linear_scan`,
    median of 7 × 10 steps, compile 10.0 vs 10.1 s, 2026-11-29). Autodiff of 'fused'
    builds the gradient inside its loop body, one iteration per position with
    residual slices: at the smoke grid's shapes (2 cores, one thread per op) the
    encoder readout's gradient 17.9 → 8.6 ms, the plain train-step gradient
    61.6 → 48.5 ms, the CER (k = 1) loss gradient
    197.9 → 150.5 ms, against 'fused'. Memory: [b,l,c,s] tensors (5 MB at the
    smoke grid's shapes, 0.6 GB at p400k n = 512 batch 128 — a size for an
    accelerator, where 'auto' picks 'chunked', which does not store them).
  'fused': one `lax.scan` whose step builds A_j and B_j x_j from the [b,l,c] /
    [b,l,s] factors (no [b,l,c,s] gate tensor; an encoder block's scan emits only
    its readout [b,l,c]); the unmasked read keeps the states at passage ends, and
    span-masked reads (probes) go through the closed form below (its reverse scan
    is a `lax.scan` too). CPU's default until 2026-11-29, where a loop iteration
    per position is cheap: train step of the smoke grid's ssm (train_bench) plain 70 → 46 ms,
    CER (k = 1) 210 → 152 ms against associative. Remeasured 2026-11-29 (idle
    2 cores, median of 3 × 10 steps): fused plain 65–70 ms, CER k = 1 195–208 ms;
    associative 76 / 231; chunked 53 / 141 — faster steps, but its programs
    compile longer (the CER k = 1 step built and compiled in 30 s against 19 s; a
    cold smoke-grid ssm CER cell spent 73 s compiling against 41 s), so that cell,
    trained and audited from a cold cache, took 186 s against 180 s.
  'chunked' (`architectures/ssm_scan.py`): no loop primitive; the encoder's
    readout by the two-level chunked scan (≈ 2.5√l short unrolled steps over
    [b, l/Q, c, s], with a written-out gradient), the read port's per-token
    contributions straight from the gate factors (exp of segment sums of Δ, no
    scan over [b,n,c,s]). For accelerators, where a step-by-step scan pays a
    launch per position and the associative one is memory-bound: XLA's bytes
    per compiled CER step (scale_bench, p400k, n = 256) 2,832 → 571 MB per
    example against 'associative' (attention: 169); 525 vs 2,138 (attention 124)
    since CER's one run on D− (2026-11-30); 460 vs 1,734 since the port gives h_f and
    Π_S h_f from one set of contributions (`pair_values`, the engine's
    `span_pair_method`; same evening); 351 since the readout forms Δ_i x_i and its
    gradient's ∂y_i = ∂out_i ⊙ gate_i per step from slices, the block's output gate
    applied inside it (2026-11-30, late: XLA's count had charged each of the 2 x 31
    unrolled steps the whole [b,l,c] operands of the products it sliced; the CPU
    step time is unchanged: two checkouts on two pinned cores, then swapped, one
    thread each, CER k = 2 step 811 / 803 ms before vs 829 / 805 ms after); the
    masked sums' gradient by `ssm_scan.masked_sum` then took that step to 457 / 463
    ms (CPU CER-step time ssm / attention 4.41 → 2.96, scale_bench). On the
    H200 1.7x faster CER steps than 'associative' ('auto' above). The restart flags
    get no gradient on this path (constant 0/1 masks); jvp is not defined for it.
  'associative': the parallel `jax.lax.associative_scan` over the materialised
    gates everywhere.
  'sequential': `lax.scan` over the materialised gates, the reference.
All give the same values and gradients up to float reassociation
(tests/test_ssm_scan.py, tests/test_architectures.py: 1e-5).

Query-aware compression: the encoder scans [query; context], so every context
token's features (and thus the read recurrence's gates) already depend on the
query; the read recurrence's selection features are further modulated by a
query summary (FiLM). The read recurrence itself starts at the first context
token and (by default) restarts at every passage start; its state at the end of
passage p is read slot p (P = m ports).

Read slots in closed form: the state at the end of passage p is
  state_p = Σ_{j in p} u_j,   u_j = (Π_{j<k≤end(p)} A_k) ⊙ B_j x_j,
so with the gates of the run fixed, Π_S state_p = Σ_{j in S ∩ p} u_j exactly
(`span_decomposition = 'exact'`; SPEC §2). The per-token contributions u_j
[b,n,c,s] do not depend on S: one reverse segmented scan of the gates per
example gives the suffix products W_j = Π_{j<k≤end(p)} A_k (no division of
cumulative products, so products that underflow give 0, not 0/0) — with
'chunked' and 'linear' (resets on), W_j = exp(−rate · Σ_{j<k≤end(p)} Δ_k) from the
gate factors, the same products up to reassociation (`gate_slot_contributions`) — and
every span is then a masked sum (a matmul of the span mask with u). Under the CEU
engine, which splits off probe-independent work by partial evaluation, the
contributions are therefore computed once per call whatever the number of probes.
Without resets at passage starts (`ssm_reset_at_passages=False`) slot p also sees earlier
passages, and the contributions carry the slot axis, [b,n,p,c,s].

State size vs the attention family: the reader reads P x c x s numbers per read
layer (m * ssm_inner * ssm_state, e.g. 8 x 64 x 8 = 4096 at the p100k preset),
independent of the context length N, whereas cross-attention keeps N x (h k)
keys and N x (h k) values (2 x 128 x 64 = 16384 at N = 128, growing with N).
"""
from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from architectures import layers
from architectures import ssm_scan
from architectures.port import ContextMemory, ReadPort
from architectures.spec import ArchSpec


def _combine(left, right):
  a1, b1 = left
  a2, b2 = right
  return a1 * a2, a2 * b1 + b2


def associative_scan(a: jax.Array, b: jax.Array, reverse: bool = False) -> jax.Array:
  """All states h_j of h_j = a_j h_{j-1} + b_j (h_{-1} = 0) along axis 1, in parallel.

  ``reverse``: h_j = a_j h_{j+1} + b_j (h_n = 0), from the last position back.
  """
  return jax.lax.associative_scan(_combine, (a, b), reverse=reverse, axis=1)[1]


def sequential_scan(a: jax.Array, b: jax.Array, reverse: bool = False) -> jax.Array:
  """Reference: the same recurrence with `lax.scan` along axis 1."""
  def step(h, ab):
    h = ab[0] * h + ab[1]
    return h, h
  a_t, b_t = jnp.moveaxis(a, 1, 0), jnp.moveaxis(b, 1, 0)
  _, hs = jax.lax.scan(step, jnp.zeros_like(b_t[0]), (a_t, b_t), reverse=reverse)
  return jnp.moveaxis(hs, 0, 1)


def resolve_scan_impl(impl: str) -> str:
  """'auto' -> 'linear' on the CPU backend, else 'chunked' (the faster of the scans
  measured on an accelerator; module doc); other values unchanged."""
  if impl != "auto":
    return impl
  return "linear" if jax.default_backend() == "cpu" else "chunked"


def run_scan(a: jax.Array, b: jax.Array, impl: str, reverse: bool = False) -> jax.Array:
  """All states of the recurrence over materialised gates: the parallel associative
  scan for impl 'associative', the two-level chunked scan for 'chunked', else
  `lax.scan` ('fused' and 'sequential')."""
  impl = resolve_scan_impl(impl)
  if impl == "chunked":
    return ssm_scan.chunked_scan(a, b, reverse)
  if impl == "linear":
    return ssm_scan.linear_scan(a, b, reverse)
  scan = associative_scan if impl == "associative" else sequential_scan
  return scan(a, b, reverse)


def _a_log_init(num_state: int):
  def init(key, shape, dtype=jnp.float32):  # S4D-real: A = -(1..s)
    del key
    return jnp.broadcast_to(jnp.log(jnp.arange(1, num_state + 1, dtype=dtype)), shape)
  return init


def _dt_bias_init(key, shape, dtype=jnp.float32):
  """softplus^{-1} of Δ ~ logU[1e-3, 1e-1]."""
  dt = jnp.exp(jax.random.uniform(key, shape, dtype, np.log(1e-3), np.log(1e-1)))
  return dt + jnp.log(-jnp.expm1(-dt))


@flax.struct.dataclass
class Gates:
  """The factors of a selective recurrence's gates and inputs, before expansion:
  A_j = keep_j · exp(−Δ_j ⊗ rate) and B_j x_j = (Δ_j x_j) ⊗ b_j, each [b,l,c,s]."""
  dt: jax.Array     # [b,l,c] Δ_j (softplus, > 0)
  dtx: jax.Array    # [b,l,c] Δ_j x_j, formed once (every read of it shares one product)
  b_in: jax.Array   # [b,l,s] B_j
  rate: jax.Array   # [c,s] exp(a_log) > 0
  keep: jax.Array | None = None  # [b,l] 0 where the recurrence restarts (passage starts)
  x: jax.Array | None = None     # [b,l,c] x_j: the chunked readout forms Δ_j x_j per step

  def with_restarts(self, starts: jax.Array) -> "Gates":
    """A_j = 0 where starts [b,l] is true (the state before j is forgotten)."""
    keep = 1.0 - starts.astype(self.dt.dtype)
    return self.replace(keep=keep if self.keep is None else self.keep * keep)

  def expand(self) -> tuple[jax.Array, jax.Array]:
    """(A [b,l,c,s], B x [b,l,c,s]) materialised."""
    a = jnp.exp(-self.dt[..., None] * self.rate)
    if self.keep is not None:
      a = a * self.keep[..., None, None]
    return a, self.dtx[..., None] * self.b_in[:, :, None, :]

  def _steps(self):
    """Per-position factors, scan axis first, and the step's (A_j, B_j x_j)."""
    keep = jnp.ones(self.dt.shape[:2], self.dt.dtype) if self.keep is None else self.keep
    xs = tuple(jnp.moveaxis(t, 1, 0) for t in (self.dt, self.dtx, self.b_in, keep))

    def gate(dt_j, dtx_j, b_j, keep_j):
      a = jnp.exp(-dt_j[..., None] * self.rate) * keep_j[:, None, None]     # [b,c,s]
      return a, dtx_j[..., None] * b_j[:, None, :]
    return xs, gate

  def _h0(self) -> jax.Array:
    return jnp.zeros(self.dt.shape[:1] + self.rate.shape, self.dt.dtype)    # [b,c,s]

  def scan_readout(self, c_out: jax.Array) -> jax.Array:
    """y_j = Σ_s c_out_j[s] h_j[:, s] [b,l,c] of h_j = A_j h_{j-1} + B_j x_j, fused."""
    xs, gate = self._steps()

    def step(h, inp):
      *factors, c_j = inp
      a, bx = gate(*factors)
      h = a * h + bx
      return h, jnp.einsum("bcs,bs->bc", h, c_j)
    _, y = jax.lax.scan(step, self._h0(), xs + (jnp.moveaxis(c_out, 1, 0),))
    return jnp.moveaxis(y, 0, 1)

  def chunked_readout(self, c_out: jax.Array, gate: jax.Array | None = None) -> jax.Array:
    """`scan_readout` by the two-level chunked scan (`ssm_scan.chunked_readout`), times
    ``gate`` [b,l,c] when given. Needs the input x (`SelectiveGates` sets it)."""
    if self.x is None:
      raise ValueError("Gates.x is None: the chunked readout takes Δ and x apart "
                       "(SelectiveGates sets x; pass x= to a hand-built Gates)")
    return ssm_scan.chunked_readout(self.dt, self.x, self.b_in, self.rate, self.keep, c_out,
                                    gate=gate)

  def scan_states_at(self, ends: jax.Array) -> jax.Array:
    """Σ_j ends[b,j,p] h_j [b,p,c,s]: the states at the marked positions (the scan
    emits h_j; one contraction picks the ends, so its gradient is one matmul rather
    than a reduction inside every step)."""
    xs, gate = self._steps()

    def step(h, inp):
      a, bx = gate(*inp)
      h = a * h + bx
      return h, h
    _, hs = jax.lax.scan(step, self._h0(), xs)                              # [l,b,c,s]
    return jnp.einsum("blp,lbcs->bpcs", ends.astype(hs.dtype), hs)


class SelectiveGates(nn.Module):
  """Input-dependent gates A_j and inputs B_j x_j of a recurrence, as `Gates` factors."""
  inner: int   # c
  state: int   # s

  @nn.compact
  def __call__(self, sel: jax.Array, x: jax.Array) -> Gates:
    """sel [b,l,·] selection features, x [b,l,c] scanned inputs (both float32)."""
    dt = layers.dense(self.inner, ("mlp", None), "dt", jnp.float32)(sel)
    dt_bias = self.param("dt_bias", layers.logical(_dt_bias_init, ("mlp",)), (self.inner,))
    dt = jax.nn.softplus(dt + dt_bias)                                    # [b,l,c]
    b_in = layers.dense(self.state, ("mlp", "state"), "b", jnp.float32)(sel)  # [b,l,s]
    a_log = self.param("a_log", layers.logical(_a_log_init(self.state), ("mlp", "state")),
                       (self.inner, self.state))
    return Gates(dt=dt, dtx=dt * x, b_in=b_in, rate=jnp.exp(a_log), x=x)


class CausalDepthwiseConv(nn.Module):
  """y_j = bias + Σ_k K[k] ⊙ x_{j−(w−1)+k}: the depthwise causal convolution of
  `nn.Conv(c, (w,), padding=[(w − 1, 0)], feature_group_count=c)`, with its
  parameters (kernel [w, 1, c], bias [c]), written as w shifted products — XLA's
  CPU grouped convolution took ~10 ms of a 60 ms ssm train step for this."""
  width: int  # w taps

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    kernel = self.param("kernel", layers.logical(nn.initializers.lecun_normal(),
                                                 (None, None, "mlp")), (self.width, 1, c))
    bias = self.param("bias", layers.logical(nn.initializers.zeros, ("mlp",)), (c,))
    pad = jnp.pad(x, ((0, 0), (self.width - 1, 0), (0, 0)))
    y = sum(pad[:, k:k + x.shape[1]] * kernel[k, 0] for k in range(self.width))
    return y + bias


class MambaBlock(nn.Module):
  """Residual selective-scan block: conv -> selective recurrence -> gated output."""
  spec: ArchSpec  # static sizes

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    s = self.spec
    y = layers.RMSNorm(jnp.float32, name="norm")(x)
    uz = layers.dense((2, s.ssm_inner), ("embed", None, "mlp"), "in_proj", jnp.float32)(y)
    u, z = uz[..., 0, :], uz[..., 1, :]
    u = nn.silu(CausalDepthwiseConv(s.ssm_conv, name="conv")(u))
    gates = SelectiveGates(s.ssm_inner, s.ssm_state, name="gates")(u, u)
    c_out = layers.dense(s.ssm_state, ("mlp", "state"), "c", jnp.float32)(u)
    d_skip = self.param("d_skip", layers.logical(nn.initializers.ones, ("mlp",)),
                        (s.ssm_inner,))
    impl = resolve_scan_impl(s.scan_impl)
    gate = nn.silu(z)
    if impl == "chunked":   # the output gate inside the readout (its gradient per step)
      out = gates.chunked_readout(c_out, gate) + (d_skip * u) * gate
    else:
      if impl == "fused":
        y = gates.scan_readout(c_out)                                     # [b,l,c]
      else:
        h = run_scan(*gates.expand(), s.scan_impl)                        # [b,l,c,s]
        y = jnp.einsum("blcs,bls->blc", h, c_out)
      out = (y + d_skip * u) * gate
    out = layers.dense(s.embed_dim, ("mlp", "embed"), "out_proj", s.compute_dtype)(out)
    return x + out


class SSMEncoder(nn.Module):
  """Selective-scan encoder over [query; context] (the recurrence sees the query first)."""
  spec: ArchSpec  # static sizes

  @nn.compact
  def __call__(self, embed: layers.Embed, query, context, passage_ids) -> ContextMemory:
    s = self.spec
    seg = self.param("segment", layers.logical(nn.initializers.normal(0.02), (None, "embed")),
                     (2, s.embed_dim))
    x = jnp.concatenate([embed(query) + seg[0], embed(context) + seg[1]], axis=1)
    x = x.astype(jnp.float32)
    x = layers.LocalMixer(s.mixer_width, jnp.float32, name="local_mixer")(x)
    for i in range(s.enc_layers):
      x = MambaBlock(s, name=f"block_{i}")(x)
    x = layers.RMSNorm(jnp.float32, name="norm_out")(x)
    q_len = query.shape[1]
    return ContextMemory(encoded=layers.constrain(x[:, q_len:], ("batch", "ctx", "embed")),
                         query_summary=layers.masked_mean(x[:, :q_len], query != 0),
                         passage_ids=passage_ids, ctx_mask=context != 0)


def passage_starts(passage_ids: jax.Array) -> jax.Array:
  """[b, n] bool: first token of each passage (passage id changes)."""
  prev = jnp.pad(passage_ids, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
  return passage_ids != prev


def passage_ends(passage_ids: jax.Array) -> jax.Array:
  """[b, n] bool: last token of each passage (the next token's passage id differs)."""
  nxt = jnp.pad(passage_ids, ((0, 0), (0, 1)), constant_values=-1)[:, 1:]
  return passage_ids != nxt


def passage_end_onehot(passage_ids: jax.Array, num_passages: int) -> jax.Array:
  """[b, p, n] float: 1 at the last token of passage p (all 0 if p is absent)."""
  onehot = passage_ids[:, None, :] == jnp.arange(num_passages)[None, :, None]
  return (onehot & passage_ends(passage_ids)[:, None, :]).astype(jnp.float32)


@flax.struct.dataclass
class SlotContributions:
  """Each context token's additive share of the read slots' end states.

  One of two layouts: with resets at passage starts a token reaches only its
  own passage's slot, so ``terms`` is [b,n,c,s] and ``token_slot`` [b,p,n] the
  one-hot of each token's slot; without resets ``terms`` is [b,n,p,c,s] and
  ``token_slot`` is None.
  """
  terms: jax.Array                 # [b,n,c,s] or [b,n,p,c,s] (gates' dtype): u_j (per slot)
  token_slot: jax.Array | None     # [b,p,n] bool: token n feeds slot p
  # The masked sums' gradient by `ssm_scan.masked_sum` (the slot sum per element) rather
  # than autodiff's dot; off for the scans whose unmasked read keeps the states
  # ('fused', 'linear': the CPU's, whose recorded main-job numbers it would move by
  # float rounding).
  slot_sum_grad: bool = flax.struct.field(pytree_node=False, default=False)

  def states(self, span_mask: jax.Array | None = None) -> jax.Array:
    """Π_S state_p [b,p,c,s] = Σ_{n in S} u_n (every token without a mask)."""
    dtype = self.terms.dtype
    if self.token_slot is None:
      b, n = self.terms.shape[:2]
      w = jnp.ones((b, n), dtype) if span_mask is None else span_mask.astype(dtype)
      return jnp.einsum("bn,bnpcs->bpcs", w, self.terms)
    w = self.token_slot.astype(dtype)
    if span_mask is not None:
      w = w * span_mask.astype(dtype)[:, None, :]
    if self.slot_sum_grad:
      return ssm_scan.masked_sum(w, self.terms)
    return jnp.einsum("bpn,bncs->bpcs", w, self.terms)


def slot_contributions(a: jax.Array, bx: jax.Array, passage_ids: jax.Array,
                       num_slots: int, reset: bool, impl: str) -> SlotContributions:
  """Per-token contributions u_j to the slots' end states, from the run's gates
  a and inputs bx [b,n,c,s] (a already zeroed at passage starts when ``reset``).

  Suffix products by one reverse scan, W_j = a_{j+1} ⊙ W_{j+1} + e_j, u_j = W_j ⊙ bx_j:
  with ``reset`` the scan is segmented at passage ends (e = 1 there, the gate
  across the boundary 0), so W_j = Π_{j<k≤end(j)} a_k; without, W carries the
  slot axis, W_jp = Σ_{ends n ≥ j of passage p} Π_{j<k≤n} a_k.
  """
  a_next = jnp.pad(a[:, 1:], ((0, 0), (0, 1), (0, 0), (0, 0)))        # a_{j+1}; 0 past the end
  if reset:
    is_end = passage_ends(passage_ids)[..., None, None]                # [b,n,1,1]
    a_next = jnp.where(is_end, 0.0, a_next)
    w = run_scan(a_next, jnp.broadcast_to(is_end.astype(a.dtype), a.shape), impl, reverse=True)
    token_slot = passage_ids[:, None, :] == jnp.arange(num_slots)[None, :, None]
    return SlotContributions(w * bx, token_slot)
  ends = jnp.moveaxis(passage_end_onehot(passage_ids, num_slots), 1, 2)  # [b,n,p]
  b, n, c, s = a.shape
  shape = (b, n, num_slots, c, s)
  w = run_scan(jnp.broadcast_to(a_next[:, :, None], shape),
               jnp.broadcast_to(ends[..., None, None].astype(a.dtype), shape), impl, reverse=True)
  return SlotContributions(w * bx[:, :, None], None)


def gate_slot_contributions(gates: Gates, passage_ids: jax.Array,
                            num_slots: int, loop: bool = False) -> SlotContributions:
  """`slot_contributions` with resets at passage starts, from the gate factors: u_j =
  exp(−rate · Σ_{j<k≤end(j)} Δ_k) ⊙ B_j x_j (`ssm_scan.segment_contributions`; the
  same products as the suffix scan, up to float reassociation), without a scan over
  [b,n,c,s] tensors; ``loop``: its segment sums over [b,n,c] by `lax.scan` ('linear')."""
  terms = ssm_scan.segment_contributions(gates.dt, gates.dtx, gates.b_in, gates.rate,
                                         gates.keep, passage_ends(passage_ids), loop=loop)
  token_slot = passage_ids[:, None, :] == jnp.arange(num_slots)[None, :, None]
  return SlotContributions(terms, token_slot)


# The scans whose unmasked read keeps the recurrence's own states at passage ends (not the
# per-token contributions): `slot_states`, `pair_values` and `contributions` (the masked
# sums' gradient) branch on it alike.
SCAN_STATE_READS = ("fused", "linear")


class SSMRetrieval(ReadPort):
  """Read port: readout of the selective recurrence's passage-end states."""
  span_decomposition = "exact"  # Π_S state = masked sum of per-token contributions
  span_pair_method = "read_and_span"  # h_f and Π_S h_f from one set of contributions

  def setup(self):
    s = self.spec
    self.film = layers.dense(s.embed_dim, ("embed", None), "query_film", jnp.float32,
                             kernel_init=nn.initializers.zeros, use_bias=False)
    self.x_proj = layers.dense(s.ssm_inner, ("embed", "mlp"), "x_proj", jnp.float32)
    self.sel_proj = layers.dense(s.ssm_inner, ("embed", "mlp"), "sel_proj", jnp.float32)
    self.gates = SelectiveGates(s.ssm_inner, s.ssm_state, name="gates")
    self.c_proj = layers.dense(s.ssm_state, ("embed", "state"), "c_proj", jnp.float32)
    self.out_proj = layers.dense(s.embed_dim, ("mlp", "embed"), "out", s.compute_dtype)

  def read_gates(self, memory: ContextMemory) -> Gates:
    """The read recurrence's gate factors (query-aware; restarts at passage starts).
    PAD tokens put nothing into the slots (x_j = 0 there, their gates kept), as the
    attention read gives them no weight: h_T is the sum over the real tokens, so Π_S with
    S = every real token is h_T exactly (SPEC §1's identity on padded contexts)."""
    u = memory.encoded.astype(jnp.float32)
    film = 1.0 + self.film(memory.query_summary)                          # [b,e]
    sel = nn.silu(self.sel_proj(u * film[:, None, :]))                   # [b,n,c]
    x = self.x_proj(u) * memory.ctx_mask[..., None].astype(jnp.float32)  # [b,n,c]
    gates = self.gates(sel, x)
    if self.spec.ssm_reset_at_passages:
      gates = gates.with_restarts(passage_starts(memory.passage_ids))
    return gates

  def gates_and_inputs(self, memory: ContextMemory) -> tuple[jax.Array, jax.Array]:
    """Gates A_j and inputs B_j x_j [b,n,c,s] of the read recurrence (query-aware)."""
    return self.read_gates(memory).expand()

  def contributions(self, memory: ContextMemory) -> SlotContributions:
    """Per-token contributions to the slot states (independent of any span): from the
    gate factors with resets ('chunked', 'linear'), else by the reverse suffix scan."""
    s = self.spec
    impl = resolve_scan_impl(s.scan_impl)
    if s.ssm_reset_at_passages and impl in ("chunked", "linear"):
      con = gate_slot_contributions(self.read_gates(memory), memory.passage_ids,
                                    s.num_passages, loop=impl == "linear")
    else:
      a, bx = self.gates_and_inputs(memory)
      con = slot_contributions(a, bx, memory.passage_ids, s.num_passages,
                               s.ssm_reset_at_passages, s.scan_impl)
    return con.replace(slot_sum_grad=impl not in SCAN_STATE_READS)

  def slot_states(self, memory: ContextMemory, span_mask: jax.Array | None = None) -> jax.Array:
    """States at passage ends [b, p, c, s]; with span_mask, Π_S of them (exact).

    Unmasked reads with the fused scan run the recurrence once and keep only the
    states at passage ends; masked reads (probes) use the per-token contributions,
    which the engine computes once for all probes."""
    s = self.spec
    impl = resolve_scan_impl(s.scan_impl)
    if span_mask is None and impl in SCAN_STATE_READS:
      ends = passage_end_onehot(memory.passage_ids, s.num_passages)         # [b,p,n]
      gates = self.read_gates(memory)
      if impl == "fused":
        return gates.scan_states_at(jnp.moveaxis(ends, 1, 2))
      h = run_scan(*gates.expand(), impl)                                   # [b,n,c,s]
      return jnp.einsum("bpn,bncs->bpcs", ends.astype(h.dtype), h)
    return self.contributions(memory).states(span_mask)

  def port_values(self, x: jax.Array, memory: ContextMemory,
                  span_mask: jax.Array | None) -> jax.Array:
    """h_f [b, t, p, c] = C(x_t) · state_p; linear in the states, so Π_S is exact."""
    return self._readout(x, self.slot_states(memory, span_mask))

  def _readout(self, x: jax.Array, states: jax.Array) -> jax.Array:
    c = self.c_proj(x.astype(jnp.float32))                                 # [b,t,s]
    return jnp.einsum("bts,bpcs->btpc", c, states)

  def pair_values(self, x: jax.Array, memory: ContextMemory,
                  span_mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """(h_f, Π_S h_f) for `read_and_span`, the engine's one call for both (this class's
    `span_pair_method`): where both reads go through the per-token contributions
    ('chunked', 'associative', 'sequential'), from one set of them, so that the
    gradients of the two reads meet before the contributions' backward (one pass over
    [b,n,c,s] tensors instead of two); with 'fused' / 'linear' (the unmasked read keeps
    the scan's states) the two reads as `port_values` computes them."""
    impl = resolve_scan_impl(self.spec.scan_impl)
    if span_mask is None or impl in SCAN_STATE_READS:
      return super().pair_values(x, memory, span_mask)
    contributions = self.contributions(memory)
    return (self._readout(x, contributions.states(None)),
            self._readout(x, contributions.states(span_mask)))
