"""Chunked (two-level) selective scans: O(l) work, no loop primitive, and in the
gate-factored forms no stored [b,l,c,s] gate tensor (issue #37, item 2).

Shape legend (einsum letters):
  b batch, l scanned positions, k chunks (K = ceil(l / Q)), q positions within a
  chunk (Q), c channels, s state size, '…' trailing axes of a materialised scan.

The recurrence h_j = A_j ⊙ h_{j−1} + B_j x_j (h_{−1} = 0) is cut into K chunks of
Q positions, all chunks processed at once:
  `chunked_scan` (materialised gates a, b: the general form, used for the read
  port without resets and on [b,l,c]-sized sums): each chunk from a zero state
  (Q unrolled steps over [b,k,…]), the carry S_{k+1} = P_k ⊙ S_k + h^loc_{k,Q−1}
  across chunks (K steps; P_k the product of chunk k's gates), then the fix-up
  h = h^loc + (Π of the gates so far) ⊙ S_k.
  `chunked_readout` (the encoder's y_j = C_j · h_j from the `ssm.Gates` factors
  Δ, Δx [b,l,c], B, C [b,l,s], rate [c,s]; A_j = exp(−Δ_j ⊗ rate)): each chunk's
  end state from zero as one reduction over the chunk, Σ_q (Π_{m>q} A_m) ⊙ B_q x_q;
  the carry (K steps over [b,c,s]); then the states themselves, Q steps of
  h = A_i ⊙ h + B_i x_i from the entering states, each read out in its step. Its
  gradient is written out (a `jax.custom_vjp`, `_readout_bwd`): the same three
  passes from the right for g_j = ∂L/∂h_j, with per-step reductions.
  `segment_contributions` (the read port's per-token shares of its passage-end
  states): exp(−rate · Σ_{j<k≤end} Δ_k) ⊙ B_j x_j directly, no scan over [b,l,c,s].
With Q ≈ 2√l that is ≈ 2.5√l short sequential steps instead of l (a `lax.scan`:
one loop iteration per position; XLA's cost analysis counts a loop body once, an
accelerator pays a launch per iteration) or the log-depth associative scan, which
stores and re-slices [b,l,c,s] tensors log₂ l times (memory-bound). The per-(c, s)
decay of this model, A_j = exp(−Δ_j[c] · rate[c,s]), rules out the matmul form of
Mamba-2's SSD (one scalar decay per head, so that C B^T ∘ L is a matmul): within a
chunk the quadratic form would cost Q exponentials per state element, and XLA
(CPU) stores its [b,k,q,q,c,s] kernel; the short unrolled scan keeps one
multiply-add per element and step.

Numerics: nothing is divided and no cumulative product is inverted. Products of
gates over a span are exp(−rate · Σ Δ) with the sum of non-negative Δ taken over
exactly that span (running sums along the chunk, or a 0/1-gated scan; never a
difference of cumulative sums), times the product of the restart flags, so
products that underflow give 0; they equal Π exp(−Δ_m rate) up to float
reassociation, as do the carried states. tests/test_ssm_scan.py: values and
gradients against the sequential `lax.scan` at 1e-5. The restart flags `keep` are
0/1 masks and get no gradient from these functions (the model derives them from
passage ids); forward-mode differentiation (jvp) of the custom-gradient functions
is not defined.

Bytes (XLA's CPU cost analysis, scale_bench p400k n = 256, CER step of the ssm):
2,832 MB per example with the associative scan, 571 MB with these (attention:
169); since CER's one run on D− 2,138 and 525 (attention 124; 2026-11-30); 351 since
`chunked_readout` takes Δ and x apart and the block's output gate (2026-11-30, late).
Several choices below are for that compiler, each noted where made.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


def chunk_len(length: int) -> int:
  """Q = ceil(2√l), K = l/Q ≈ √l/2 chunks: the fewest steps in all would be Q = √l,
  but a carry step costs more than a chunk step (it slices [b,k,c,s] tensors), and
  bytes per compiled CER step fall with Q up to about 2√l (p400k, l = 262: 23.8
  [b,l,c,s]-sized passes at Q = 17, 20.7 at Q = 33)."""
  return max(1, math.isqrt(max(4 * length - 1, 0)) + 1)


def _chunks(x: jax.Array, q: int) -> jax.Array:
  """[b,l,…] -> [b,k,q,…], zero-padded at the end of the scan axis."""
  l = x.shape[1]
  k = -(-l // q)
  x = jnp.pad(x, [(0, 0), (0, k * q - l)] + [(0, 0)] * (x.ndim - 2))
  return x.reshape(x.shape[:1] + (k, q) + x.shape[2:])


def _unchunk(x: jax.Array, length: int) -> jax.Array:
  """[b,k,q,…] -> [b,l,…] (the padding dropped)."""
  return x.reshape(x.shape[:1] + (-1,) + x.shape[3:])[:, :length]


def _carry(decay: jax.Array, local_end: jax.Array, reverse: bool = False) -> jax.Array:
  """[b,k,…] states entering each chunk: S_0 = 0, S_{k+1} = decay_k ⊙ S_k + local_end_k
  (from the last chunk back when ``reverse``)."""
  n = local_end.shape[1]
  order = range(n - 1, -1, -1) if reverse else range(n)
  state = jnp.zeros_like(local_end[:, 0])
  out = [None] * n
  for i in order:
    out[i] = state
    state = decay[:, i] * state + local_end[:, i]
  return jnp.stack(out, axis=1)


def chunked_scan(a: jax.Array, b: jax.Array, reverse: bool = False,
                 chunk: int | None = None) -> jax.Array:
  """All states h_j of h_j = a_j ⊙ h_{j−1} + b_j along axis 1 (h_{−1} = 0), over
  materialised gates a (broadcastable to b, same rank) and inputs b [b,l,…].

  ``reverse``: h_j = a_j ⊙ h_{j+1} + b_j (h_l = 0). ``chunk``: Q (default `chunk_len`).
  """
  length = b.shape[1]
  q = chunk or chunk_len(length)
  ac, bc = _chunks(a, q), _chunks(b, q)                     # [b,k,q,…]
  steps = range(q - 1, -1, -1) if reverse else range(q)
  h = jnp.zeros(bc.shape[:2] + bc.shape[3:], b.dtype)      # [b,k,…]
  prod = jnp.ones(ac.shape[:2] + ac.shape[3:], a.dtype)
  hs, ps = [None] * q, [None] * q
  for i in steps:                                           # 1. local, every chunk at once
    h = ac[:, :, i] * h + bc[:, :, i]
    prod = ac[:, :, i] * prod                               # Π of the gates so far
    hs[i], ps[i] = h, prod
  hs, ps = jnp.stack(hs, 2), jnp.stack(ps, 2)               # [b,k,q,…]
  s_in = _carry(prod, h, reverse)                           # 2. carry [b,k,…]
  return _unchunk(hs + ps * s_in[:, :, None], length)      # 3. fix-up


def _steps(x: jax.Array | None, q: int) -> list:
  """[b,l,…] -> Q arrays [b,k,…], position i of every chunk (None stays None).

  Strided slices x[:, i::Q] of the (padded) input rather than slices of its
  [b,k,q,…] reshape: XLA's CPU cost analysis charges a fusion that slices through
  a reshape the whole operand (Q times over for the Q steps), a strided slice only
  the slice."""
  if x is None:
    return [None] * q
  k = -(-x.shape[1] // q)
  pad = lambda t: jnp.pad(t, [(0, 0), (0, k - t.shape[1])] + [(0, 0)] * (t.ndim - 2))
  return [pad(x[:, i::q]) for i in range(q)]      # the last chunk's missing positions: 0


def _gate(dt_i: jax.Array, keep_i: jax.Array | None, rate: jax.Array) -> jax.Array:
  """A [b,k,c,s] = keep · exp(−Δ ⊗ rate) of one position of every chunk."""
  a = jnp.exp(-dt_i[..., None] * rate)
  return a if keep_i is None else a * keep_i[..., None, None]


def _decay(sums: jax.Array, keeps: jax.Array | None, rate: jax.Array) -> jax.Array:
  """Π A = exp(−rate · Σ Δ) · Π keep [..,c,s] from Σ Δ [..,c] and Π keep [..] (≤ 1)."""
  p = jnp.exp(-sums[..., None] * rate)
  return p if keeps is None else p * keeps[..., None, None]


def _within(dtc: jax.Array, keepc: jax.Array | None, rate: jax.Array, kind: str) -> jax.Array:
  """[b,k,q,c,s] products of each chunk's gates at the positions m ≤ i ('prefix') or
  m > i ('suffix') of position i, from running sums of Δ along the chunk (sums of
  non-negative terms; no difference of cumulative sums) and of the restart flags."""
  if kind == "prefix":
    sums = jax.lax.cumsum(dtc, axis=2)
    keeps = None if keepc is None else jax.lax.cumprod(keepc, axis=2)
  else:
    shift = lambda t, fill: jnp.concatenate(          # value at i+1, `fill` past the end
        [t[:, :, 1:], jnp.full_like(t[:, :, :1], fill)], axis=2)
    sums = shift(jax.lax.cumsum(dtc, axis=2, reverse=True), 0.0)
    keeps = None if keepc is None else shift(jax.lax.cumprod(keepc, axis=2, reverse=True), 1.0)
  return _decay(sums, keeps, rate)


def _carry_chunks(dtc: jax.Array, keepc: jax.Array | None, rate: jax.Array,
                  ends: jax.Array, reverse: bool = False) -> jax.Array:
  """[b,k,c,s] state entering each chunk: S_0 = 0, S_{k+1} = P_k ⊙ S_k + ends_k with
  P_k = Π of chunk k's gates (from the last chunk back when ``reverse``): K short
  steps over [b,c,s], each with its own exponential (XLA (CPU) re-runs a chain of
  cheap element-wise steps inside every consumer of its states, not one with an
  exponential in each step)."""
  total = jnp.sum(dtc, axis=2)                                          # [b,k,c]
  kept = None if keepc is None else jnp.prod(keepc, axis=2)             # [b,k]
  n = ends.shape[1]
  state, out = jnp.zeros_like(ends[:, 0]), [None] * n
  for i in (range(n - 1, -1, -1) if reverse else range(n)):
    out[i] = state
    state = _decay(total[:, i], None if kept is None else kept[:, i], rate) * state + ends[:, i]
  return jnp.stack(out, axis=1)


def _readout_fwd(dt, x, b_in, rate, keep, c_out, gate, q):
  """(y ⊙ gate [b,l,c], residuals): chunk-end states, the carry, then the carried
  states u_j = A_j ⊙ h_{j−1} position by position (the residuals), each read out in
  its step. Δx is formed after slicing (Δ_i ⊙ x_i per step), and the backward pass
  forms ∂y = ∂(y ⊙ gate) ⊙ gate per step too: a step that slices a product of whole
  [b,l,c] operands is charged both operands whole by XLA's CPU cost analysis (it
  computes only the slice either way)."""
  dtc, bc = _chunks(dt, q), _chunks(b_in, q)
  keepc = None if keep is None else _chunks(keep, q)
  bx = (dtc * _chunks(x, q))[..., None] * bc[:, :, :, None, :]          # [b,k,q,c,s] fused
  h_end = jnp.sum(_within(dtc, keepc, rate, "suffix") * bx, axis=2)     # 1. [b,k,c,s]
  s_in = _carry_chunks(dtc, keepc, rate, h_end)                         # 2. entering [b,k,c,s]
  dts, xs, bs, cs, ks = (_steps(t, q) for t in (dt, x, b_in, c_out, keep))
  dtxs = [d * v for d, v in zip(dts, xs)]
  h, us, ys = s_in, [], []
  for i in range(q):                      # 3. u_i = A_i ⊙ h_{i−1}; h_i = u_i + B_i x_i
    us.append(_gate(dts[i], ks[i], rate) * h)
    h = us[i] + dtxs[i][..., None] * bs[i][..., None, :]
    ys.append(jnp.einsum("bkcs,bks->bkc", us[i], cs[i])                 # C_i · h_i [b,k,c]
              + dtxs[i] * jnp.sum(bs[i] * cs[i], axis=-1, keepdims=True))
  y = _unchunk(jnp.stack(ys, 2), dt.shape[1])
  if gate is None:
    return y, (dt, x, b_in, rate, keep, c_out, gate, None, tuple(us))
  return y * gate, (dt, x, b_in, rate, keep, c_out, gate, y, tuple(us))


def _readout_bwd(q, res, dy):
  """Gradients of the sequential recurrence, chunked like the forward pass.

  g_j = ∂L/∂h_j = A_{j+1} ⊙ g_{j+1} + dy_j ⊗ C_j runs from the right: each
  chunk's share at its start (a reduction over the chunk), the carry across chunks
  (K steps, from the last chunk back), then g position by position. With the saved
  carried states u_j = A_j ⊙ h_{j−1}: ∂Δ_j = −Σ_s rate ⊙ g_j ⊙ u_j, ∂rate =
  −Σ Δ_j g_j ⊙ u_j, ∂(Δx)_j = Σ_s g_j B_j, ∂B_j = Σ_c g_j (Δx)_j, ∂C_j = Σ_c (u_j +
  B_j x_j) dy_j. The restart flags `keep` get no gradient (a 0/1 mask, constant).

  XLA (CPU) notes, for the bytes this moves: u rather than h is saved so that A_j
  appears in the g chain only, computed there as exp(Δ ⊗ (−rate)) so that it is not
  merged with the forward pass's exp(−Δ ⊗ rate) (a shared gate would be stored,
  and the chain of cheap ops re-run inside every consumer); contractions with
  the per-position factors are einsums (a reduction of a product with a broadcast
  slice stores the broadcast).
  """
  dt, x, b_in, rate, keep, c_out, gate, y, us = res
  length = dt.shape[1]
  dtc, cc = _chunks(dt, q), _chunks(c_out, q)
  dyc = _chunks(dy if gate is None else dy * gate, q)                   # ∂y, chunked
  keepc = None if keep is None else _chunks(keep, q)
  e = dyc[..., None] * cc[:, :, :, None, :]                             # [b,k,q,c,s] fused
  r = jnp.sum(_within(dtc, keepc, rate, "prefix") * e, axis=2)          # 1. [b,k,c,s]
  t_in = _carry_chunks(dtc, keepc, rate, r, reverse=True)               # 2. from the right
  dts, xs, bs, cs, ks, dys, gs = (_steps(t, q) for t in (dt, x, b_in, c_out, keep, dy, gate))
  dtxs = [d * v for d, v in zip(dts, xs)]
  dys = dys if gate is None else [d * v for d, v in zip(dys, gs)]       # ∂y per step
  g, d_rate, neg_rate = t_in, jnp.zeros_like(rate), -rate
  out = {name: [None] * q for name in ("dt", "dtx", "b", "c")}
  for i in range(q - 1, -1, -1):          # 3. g_i from the right, and the reductions
    g = g + dys[i][..., None] * cs[i][..., None, :]                    # g_i
    # g ⊙ u is not formed once for both: as one product XLA would store it.
    out["dt"][i] = -jnp.sum((g * rate) * us[i], axis=-1)
    d_rate = d_rate - jnp.sum((g * dts[i][..., None]) * us[i], axis=(0, 1))
    out["dtx"][i] = jnp.einsum("bkcs,bks->bkc", g, bs[i])
    out["b"][i] = jnp.einsum("bkcs,bkc->bks", g, dtxs[i])
    out["c"][i] = (jnp.einsum("bkcs,bkc->bks", us[i], dys[i])
                   + bs[i] * jnp.sum(dtxs[i] * dys[i], axis=-1, keepdims=True))
    a = jnp.exp(dts[i][..., None] * neg_rate)
    g = (a if ks[i] is None else a * ks[i][..., None, None]) * g
  grad = {k: _unchunk(jnp.stack(v, 2), length) for k, v in out.items()}
  d_keep = None if keep is None else jnp.zeros_like(keep)
  d_dtx = grad["dtx"]                                  # through Δx = Δ ⊙ x
  d_gate = None if gate is None else dy * y
  return (grad["dt"] + d_dtx * x, d_dtx * dt, grad["b"], d_rate, d_keep, grad["c"],
          d_gate)


_readout = jax.custom_vjp(lambda dt, x, b_in, rate, keep, c_out, gate, q:
                          _readout_fwd(dt, x, b_in, rate, keep, c_out, gate, q)[0],
                          nondiff_argnums=(7,))
_readout.defvjp(_readout_fwd, _readout_bwd)


def chunked_readout(dt: jax.Array, x: jax.Array, b_in: jax.Array, rate: jax.Array,
                    keep: jax.Array | None, c_out: jax.Array,
                    chunk: int | None = None, gate: jax.Array | None = None) -> jax.Array:
  """y_j = Σ_s c_out_j[s] h_j[:, s] [b,l,c] of h_j = A_j ⊙ h_{j−1} + B_j x_j with
  A_j = keep_j · exp(−dt_j ⊗ rate), B_j x_j = (dt_j x_j) ⊗ b_in_j (the `ssm.Gates`
  factors: dt, x [b,l,c] — Δ and the input, not their product —, b_in, c_out
  [b,l,s], rate [c,s], keep [b,l] or None); times ``gate`` [b,l,c] when given
  (the block's output gate, applied here so that the gradient's ∂y = ∂out ⊙ gate
  is formed per step, from slices).

  Only [b,k,c,s] states (one position of every chunk at a time), the entering
  states and [b,l,c] / [b,l,s] factors are formed, forward and backward: the
  gradient is written out (`_readout_bwd`, a `jax.custom_vjp`; forward-mode
  differentiation is not defined) so that no per-position state is kept for it.
  """
  return _readout(dt, x, b_in, rate, keep, c_out, gate, chunk or chunk_len(dt.shape[1]))


def segment_suffix(dt: jax.Array, keep: jax.Array | None, is_end: jax.Array,
                   chunk: int | None = None, loop: bool = False
                   ) -> tuple[jax.Array, jax.Array]:
  """Per position j, over the positions k with j < k ≤ end(j) (the last position of
  j's segment; segments end where ``is_end`` [b,l] is true): D_j = Σ dt_k [b,l,c]
  and κ_j = Π keep_k [b,l] (keep = 1 when None), κ_j = 0 when no end follows j.

  Both are reverse recurrences with 0/1 gates (0 at segment ends), so they run as
  chunked scans over [b,l,c] / [b,l] (``loop``: as `linear_scan`s, one loop step
  per position — on the CPU they compile in a fraction of the unrolled chunks'
  time): sums of non-negative terms, no differences of cumulative sums.
  """
  gate = 1.0 - is_end.astype(dt.dtype)                      # [b,l]
  nxt = lambda t: jnp.pad(t[:, 1:], [(0, 0), (0, 1)] + [(0, 0)] * (t.ndim - 2))
  scan = ((lambda a, b: linear_scan(jnp.broadcast_to(a, b.shape), b, reverse=True))
          if loop else functools.partial(chunked_scan, reverse=True, chunk=chunk))
  d = scan(gate[..., None], gate[..., None] * nxt(dt))
  kept = nxt(jnp.ones_like(gate) if keep is None else keep)   # 0 past the last position
  kappa = scan(gate * kept, 1.0 - gate)
  return d, kappa


def _terms_fwd(dtx, b_in, rate, d, kappa):
  """u [b,l,c,s] = exp(−rate · D) · κ ⊙ Δx ⊗ B (one fused element-wise pass)."""
  u = jnp.exp(-d[..., None] * rate) * kappa[..., None, None] * (dtx[..., None]
                                                                 * b_in[:, :, None, :])
  return u, (dtx, b_in, rate, d, kappa, u)


def _terms_bwd(res, du):
  """With t = du ⊙ W and du ⊙ u: ∂(Δx) = Σ_s t B, ∂B = Σ_c t Δx, ∂D = −Σ_s rate ⊙ du ⊙ u,
  ∂rate = −Σ_{b,l} D du ⊙ u; κ (0/1 restart products) gets none."""
  dtx, b_in, rate, d, kappa, u = res
  t = du * jnp.exp(d[..., None] * -rate) * kappa[..., None, None]   # (−rate: see _readout_bwd)
  d_dtx = jnp.einsum("blcs,bls->blc", t, b_in)
  d_b = jnp.einsum("blcs,blc->bls", t, dtx)
  d_d = -jnp.sum(du * u * rate, axis=-1)
  d_rate = -jnp.sum(du * u * d[..., None], axis=(0, 1))
  return d_dtx, d_b, d_rate, d_d, jnp.zeros_like(kappa)


_terms = jax.custom_vjp(lambda dtx, b_in, rate, d, kappa: _terms_fwd(dtx, b_in, rate, d, kappa)[0])
_terms.defvjp(_terms_fwd, _terms_bwd)


def segment_contributions(dt: jax.Array, dtx: jax.Array, b_in: jax.Array, rate: jax.Array,
                          keep: jax.Array | None, is_end: jax.Array,
                          chunk: int | None = None, loop: bool = False) -> jax.Array:
  """u_j = (Π_{j<k≤end(j)} A_k) ⊙ B_j x_j [b,l,c,s]: each position's share of its
  segment's end state, from the gate factors (as in `chunked_readout`), as
  exp(−rate · D_j) · κ_j ⊙ dtx_j ⊗ b_in_j with `segment_suffix`'s D and κ: one
  element-wise pass writes u (no scan over [b,l,c,s]); its gradient is written out
  (`_terms_bwd`: reductions of ∂u with the factors, no [b,l,c,s] product stored by
  autodiff)."""
  d, kappa = segment_suffix(dt, keep, is_end, chunk, loop)
  return _terms(dtx, b_in, rate, d, jax.lax.stop_gradient(kappa))


@jax.custom_vjp
def masked_sum(w: jax.Array, terms: jax.Array) -> jax.Array:
  """Σ_n w[b,p,n] terms[b,n,c,s] -> [b,p,c,s]; its gradient w.r.t. the terms as the
  small sum over the slots, Σ_p w[b,p,n] ∂[b,p,c,s], element by element: as the dot
  autodiff writes, XLA (CPU) lays the [b,n,c,s] cotangent out [b,c·s,n] and transposes
  it inside every consumer (the contributions' backward: 3.1x the time of this form,
  one thread, b = 8, n = 256, c = 148, s = 16, p = 8)."""
  return jnp.einsum("bpn,bncs->bpcs", w, terms)


def _masked_sum_fwd(w, terms):
  return masked_sum(w, terms), (w, terms)


def _masked_sum_bwd(res, g):
  w, terms = res
  d_terms = jnp.sum(w[:, :, :, None, None] * g[:, :, None], axis=1)       # [b,n,c,s]
  return jnp.einsum("bpcs,bncs->bpn", g, terms), d_terms


masked_sum.defvjp(_masked_sum_fwd, _masked_sum_bwd)


# ------------------------------------------------------------------ materialised, sequential
def _states(a: jax.Array, b: jax.Array) -> jax.Array:
  """All h_j of h_j = a_j ⊙ h_{j−1} + b_j along axis 0 (h_{−1} = 0): [l,…]."""
  def step(h, ab):
    h = ab[0] * h + ab[1]
    return h, h
  return jax.lax.scan(step, jnp.zeros_like(b[0]), (a, b))[1]


@jax.custom_vjp
def _linear_scan_l(a: jax.Array, b: jax.Array) -> jax.Array:
  return _states(a, b)


def _linear_fwd(a, b):
  h = _states(a, b)
  return h, (a, h)


def _linear_bwd(res, g):
  """The adjoint recurrence, from the right: λ_j = g_j + a_{j+1} ⊙ λ_{j+1} (λ_l = 0)
  is ∂L/∂b_j, and ∂L/∂a_j = λ_j ⊙ h_{j−1}: one multiply-add per element and step in
  the loop, the rest element-wise over whole tensors."""
  a, h = res
  a_next = jnp.concatenate([a[1:], jnp.zeros_like(a[:1])], 0)

  def step(lam, inputs):
    lam = inputs[0] * lam + inputs[1]
    return lam, lam
  lam = jax.lax.scan(step, jnp.zeros_like(g[0]), (a_next, g), reverse=True)[1]
  h_prev = jnp.concatenate([jnp.zeros_like(h[:1]), h[:-1]], 0)
  return lam * h_prev, lam


_linear_scan_l.defvjp(_linear_fwd, _linear_bwd)


def linear_scan(a: jax.Array, b: jax.Array, reverse: bool = False) -> jax.Array:
  """All states [b,l,…] of h_j = a_j ⊙ h_{j−1} + b_j over materialised gates a, b
  [b,l,…] (``reverse``: h_j = a_j ⊙ h_{j+1} + b_j): the sequential `lax.scan`, with
  its gradient written out (`_linear_bwd`). Autodiff of the scan builds the gradient
  inside the loop body, one iteration per position with its residual slices; on the
  2-core CPU at the smoke grid's ssm shapes ([32, 80, 64, 8]) the encoder readout's
  gradient took 17.9 ms that way and 8.6 ms this way (forward 2.3 ms either way)."""
  a_l, b_l = jnp.moveaxis(a, 1, 0), jnp.moveaxis(b, 1, 0)
  if reverse:
    return jnp.moveaxis(_linear_scan_l(a_l[::-1], b_l[::-1])[::-1], 0, 1)
  return jnp.moveaxis(_linear_scan_l(a_l, b_l), 0, 1)
