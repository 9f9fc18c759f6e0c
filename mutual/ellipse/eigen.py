"""cv::eigenNonSymmetric of a float64 3 x 3 matrix as OpenCV computes it: JAMA's orthes and hqr2,
operation for operation, every product and quotient fenced (`floats`). fitEllipseDirect
(`direct_fit`) takes its conic from the eigenvectors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mutual.ellipse import floats


def _cdiv(xr, xi, yr, yi, zero):
  """JAMA's complex division (xr + i xi) / (yr + i yi): (real, imaginary)."""

  def mul(a, b):
    return floats.mul(a, b, zero)

  def div(a, b):
    return floats.div(a, b, zero)

  wide = jnp.abs(yr) > jnp.abs(yi)
  r = div(yi, jnp.where(yr != 0, yr, 1.0))
  d = yr + mul(r, yi)
  wide_out = div(xr + mul(r, xi), d), div(xi - mul(r, xr), d)
  r = div(yr, jnp.where(yi != 0, yi, 1.0))
  d = yi + mul(r, yr)
  tall_out = div(mul(r, xr) + xi, d), div(mul(r, xi) - xr, d)
  return tuple(jnp.where(wide, a, b) for a, b in zip(wide_out, tall_out))


# One function of some 290 lines on purpose: JAMA's orthes and hqr2 unrolled for 3 x 3, every
# operation in OpenCV's order, so that it reads side by side with JAMA's code; its steps share the
# working matrix and its fenced arithmetic, and split they would pass a dozen values each way.
def eigen_nonsymmetric3(matrix, zero):
  """cv::eigenNonSymmetric of a float64 [3, 3] matrix as OpenCV computes it: JAMA's orthes
  (Householder reduction to Hessenberg form) and hqr2 (shifted QR to real Schur form, then
  back substitution), operation for operation. Returns (eigenvalues float64 [3], real parts,
  sorted as cv::sortIdx sorts them: ascending, stable, then reversed; eigenvectors float64
  [3, 3], one per row in that order, unnormalised as hqr2 leaves them (a complex pair's rows
  are its real and imaginary parts); converged bool (hqr2 sets no limit; here 300 steps))."""

  def mul(a, b):
    return floats.mul(a, b, zero)

  def div(a, b):
    return floats.div(a, b, zero)

  def where(c, a, b):
    return [[jnp.where(c, a[i][j], b[i][j]) for j in range(3)] for i in range(3)]

  eps = 2.0**-52
  h = [[matrix[i, j] for j in range(3)] for i in range(3)]
  zero64 = jnp.zeros((), jnp.float64)
  one64 = jnp.ones((), jnp.float64)

  # orthes: one Householder step (m = 1) for 3 x 3.
  scale = (zero64 + jnp.abs(h[1][0])) + jnp.abs(h[2][0])
  active = scale != 0.0
  safe = jnp.where(active, scale, 1.0)
  o2 = div(h[2][0], safe)
  o1 = div(h[1][0], safe)
  norm2 = (zero64 + mul(o2, o2)) + mul(o1, o1)
  g = jnp.sqrt(norm2)
  g = jnp.where(o1 > 0, -g, g)
  norm2 = jnp.where(active, norm2 - mul(o1, g), 1.0)
  o1 = o1 - g
  reduced = [row[:] for row in h]
  for j in (1, 2):
    f = div((zero64 + mul(o2, reduced[2][j])) + mul(o1, reduced[1][j]), norm2)
    reduced[1][j] = reduced[1][j] - mul(f, o1)
    reduced[2][j] = reduced[2][j] - mul(f, o2)
  for i in range(3):
    f = div((zero64 + mul(o2, reduced[i][2])) + mul(o1, reduced[i][1]), norm2)
    reduced[i][1] = reduced[i][1] - mul(f, o1)
    reduced[i][2] = reduced[i][2] - mul(f, o2)
  o1 = jnp.where(active, mul(scale, o1), 0.0)
  reduced[1][0] = mul(scale, g)
  h = where(active, reduced, h)
  # ortran: accumulate the transformation.
  v = [[one64 if i == j else zero64 for j in range(3)] for i in range(3)]
  accumulate = h[1][0] != 0.0
  o2 = h[2][0]
  updated = [row[:] for row in v]
  for j in (1, 2):
    gj = (zero64 + mul(o1, v[1][j])) + mul(o2, v[2][j])
    gj = div(div(gj, jnp.where(accumulate, o1, 1.0)), jnp.where(accumulate, h[1][0], 1.0))
    updated[1][j] = v[1][j] + mul(gj, o1)
    updated[2][j] = v[2][j] + mul(gj, o2)
  v = where(accumulate, updated, v)

  norm = zero64
  for i in range(3):
    for j in range(max(i - 1, 0), 3):
      norm = norm + jnp.abs(h[i][j])

  def small(ha, l):
    s = jnp.abs(ha[l - 1, l - 1]) + jnp.abs(ha[l, l])
    return jnp.abs(ha[l, l - 1]) < eps * jnp.where(s == 0.0, norm, s)

  def one_root(ha, da, ea, n1, exshift):
    k = jnp.clip(n1, 0, 2)
    value = ha[k, k] + exshift
    return ha.at[k, k].set(value), da.at[k].set(value), ea.at[k].set(0.0)

  def two_roots(ha, va, da, ea, n1, exshift):
    """Rows and columns n1 - 1, n1 (n1 = 1 or 2, traced) on float64 [3, 3] arrays."""
    a = n1 - 1
    index = jnp.arange(3)
    w = mul(ha[n1, a], ha[a, n1])
    p = div(ha[a, a] - ha[n1, n1], 2.0)
    q = mul(p, p) + w
    z = jnp.sqrt(jnp.abs(q))
    ha = ha.at[n1, n1].set(ha[n1, n1] + exshift)
    ha = ha.at[a, a].set(ha[a, a] + exshift)
    x = ha[n1, n1]
    real = q >= 0
    zr = jnp.where(p >= 0, p + z, p - z)
    upper = x + zr
    lower = jnp.where(zr != 0.0, x - div(w, jnp.where(zr != 0.0, zr, 1.0)), upper)
    xr = ha[n1, a]
    s = jnp.abs(xr) + jnp.abs(zr)
    pr, qr = div(xr, jnp.where(s != 0, s, 1.0)), div(zr, jnp.where(s != 0, s, 1.0))
    r = jnp.sqrt(mul(pr, pr) + mul(qr, qr))
    pr, qr = div(pr, jnp.where(r != 0, r, 1.0)), div(qr, jnp.where(r != 0, r, 1.0))

    def rotate(first, second, keep):
      new_first = mul(qr, first) + mul(pr, second)
      new_second = mul(qr, second) - mul(pr, first)
      return jnp.where(keep, new_first, first), jnp.where(keep, new_second, second)

    top, bottom = rotate(ha[a], ha[n1], index >= a)  # row modification
    hr = ha.at[a].set(top).at[n1].set(bottom)
    left, right = rotate(hr[:, a], hr[:, n1], index <= n1)  # column modification
    hr = hr.at[:, a].set(left).at[:, n1].set(right)
    left, right = rotate(va[:, a], va[:, n1], index >= 0)  # accumulate
    vr = va.at[:, a].set(left).at[:, n1].set(right)
    da = da.at[a].set(jnp.where(real, upper, x + p)).at[n1].set(jnp.where(real, lower, x + p))
    ea = ea.at[a].set(jnp.where(real, 0.0, z)).at[n1].set(jnp.where(real, 0.0, -z))
    return jnp.where(real, hr, ha), jnp.where(real, vr, va), da, ea

  def qr_step(ha, va, it, exshift):
    """A double QR step on float64 [3, 3] arrays; on 3 x 3 only with n1 = 2, l = 0, m = 0.
    Rows and columns are updated as vectors: each element gets OpenCV's operations."""
    diagonal = jnp.eye(3, dtype=bool)
    index = jnp.arange(3)
    x, y, w = ha[2, 2], ha[1, 1], mul(ha[2, 1], ha[1, 2])
    wilkinson = it == 10  # Wilkinson's original ad hoc shift
    exshift = jnp.where(wilkinson, exshift + x, exshift)
    ha = jnp.where(wilkinson & diagonal, ha - x, ha)
    s = jnp.abs(ha[2, 1]) + jnp.abs(ha[1, 0])
    x = jnp.where(wilkinson, mul(0.75, s), x)
    y = jnp.where(wilkinson, mul(0.75, s), y)
    w = jnp.where(wilkinson, mul(mul(-0.4375, s), s), w)
    s = div(y - x, 2.0)  # MATLAB's ad hoc shift
    s = mul(s, s) + w
    matlab = (it == 30) & (s > 0)
    s = jnp.sqrt(jnp.where(matlab, s, 1.0))
    s = jnp.where(y < x, -s, s)
    s = x - div(w, div(y - x, 2.0) + s)
    ha = jnp.where(matlab & diagonal, ha - s, ha)
    exshift = jnp.where(matlab, exshift + s, exshift)
    x, y, w = (jnp.where(matlab, 0.964, t) for t in (x, y, w))
    # Two consecutive small sub-diagonal elements: m = l = 0.
    z = ha[0, 0]
    r, s = x - z, y - z
    p = div(mul(r, s) - w, ha[1, 0]) + ha[0, 1]
    q = ha[1, 1] - z - r - s
    r = ha[2, 1]
    s = jnp.abs(p) + jnp.abs(q) + jnp.abs(r)
    p, q, r = div(p, s), div(q, s), div(r, s)
    ha = ha.at[2, 0].set(0.0)
    # k = 0 (not last): its x is the shift's; x == 0 ends the step.
    go = x != 0.0
    s = jnp.sqrt(mul(p, p) + mul(q, q) + mul(r, r))
    s = jnp.where(p < 0, -s, s)
    go = go & (s != 0)
    safe = jnp.where(s != 0, s, 1.0)
    p = p + s
    xk, yk, zk = div(p, safe), div(q, safe), div(r, safe)
    qk, rk = div(q, jnp.where(p != 0, p, 1.0)), div(r, jnp.where(p != 0, p, 1.0))
    pj = ha[0] + mul(qk, ha[1])  # row modification, all columns
    pj = pj + mul(rk, ha[2])
    hk = jnp.stack([ha[0] - mul(pj, xk), ha[1] - mul(pj, yk), ha[2] - mul(pj, zk)])

    def columns0(a):  # column modification (and accumulation), all rows
      pi = mul(xk, a[:, 0]) + mul(yk, a[:, 1])
      pi = pi + mul(zk, a[:, 2])
      return jnp.stack([a[:, 0] - pi, a[:, 1] - mul(pi, qk), a[:, 2] - mul(pi, rk)], axis=1)

    ha, va = jnp.where(go, columns0(hk), ha), jnp.where(go, columns0(va), va)
    stopped = x == 0.0
    # k = 1 (last).
    p, q = ha[1, 0], ha[2, 0]
    x1 = jnp.abs(p) + jnp.abs(q)
    scaled = x1 != 0.0
    safe = jnp.where(scaled, x1, 1.0)
    p, q = jnp.where(scaled, div(p, safe), p), jnp.where(scaled, div(q, safe), q)
    s = jnp.sqrt(mul(p, p) + mul(q, q) + mul(zero64, zero64))
    s = jnp.where(p < 0, -s, s)
    go = ~stopped & scaled & (s != 0)
    safe = jnp.where(s != 0, s, 1.0)
    below = mul(-s, x1)
    p = p + s
    xk, yk = div(p, safe), div(q, safe)
    qk = div(q, jnp.where(p != 0, p, 1.0))
    hk = ha.at[1, 0].set(below)
    pj = hk[1] + mul(qk, hk[2])  # row modification, columns 1 and 2
    right = index >= 1
    hk = hk.at[1].set(jnp.where(right, hk[1] - mul(pj, xk), hk[1]))
    hk = hk.at[2].set(jnp.where(right, hk[2] - mul(pj, yk), hk[2]))

    def columns1(a):
      pi = mul(xk, a[:, 1]) + mul(yk, a[:, 2])
      return jnp.stack([a[:, 0], a[:, 1] - pi, a[:, 2] - mul(pi, qk)], axis=1)

    return jnp.where(go, columns1(hk), ha), jnp.where(go, columns1(va), va), exshift

  def pack(h, v, d, e):
    return (
      jnp.stack([jnp.stack(r) for r in h]),
      jnp.stack([jnp.stack(r) for r in v]),
      jnp.stack(d),
      jnp.stack(e),
    )

  def unpack(ha, va, da, ea):
    rows = lambda a: [[a[i, j] for j in range(3)] for i in range(3)]  # noqa: E731
    return rows(ha), rows(va), [da[i] for i in range(3)], [ea[i] for i in range(3)]

  def cond(state):
    return (state[4] >= 0) & (state[7] < 300)

  def body(state):
    ha, va, da, ea, n1, it, exshift, steps = state
    s2, s1 = small(ha, 2), small(ha, 1)
    l = jnp.where(n1 == 2, jnp.where(s2, 2, jnp.where(s1, 1, 0)), jnp.where((n1 == 1) & s1, 1, 0))
    h1, d1, e1 = one_root(ha, da, ea, n1, exshift)
    one = (h1, va, d1, e1)
    two = two_roots(ha, va, da, ea, jnp.clip(n1, 1, 2), exshift)
    hq, vq, exshift_q = qr_step(ha, va, it, exshift)
    step = (hq, vq, da, ea)
    is_one, is_two = l == n1, l == n1 - 1
    new = tuple(jnp.where(is_one, a, jnp.where(is_two, b, c)) for a, b, c in zip(one, two, step))
    deflated = is_one | is_two
    return (
      *new,
      jnp.where(is_one, n1 - 1, jnp.where(is_two, n1 - 2, n1)),
      jnp.where(deflated, 0, it + 1),
      jnp.where(deflated, exshift, exshift_q),
      steps + 1,
    )

  start = (*pack(h, v, [zero64] * 3, [zero64] * 3), jnp.int32(2), jnp.int32(0), zero64, 0)
  ha, va, da, ea, n1, _, _, _ = jax.lax.while_loop(cond, body, start)
  h, v, d, e = unpack(ha, va, da, ea)
  converged = n1 < 0

  # Back substitution to the vectors of the upper triangular form.
  for n1 in (2, 1, 0):  # noqa: PLR1704 (hqr2's name)
    p, q = d[n1], e[n1]
    # A real eigenvalue.
    hr = [row[:] for row in h]
    l = jnp.int32(n1)
    hr[n1][n1] = one64
    z = s = zero64
    for i in range(n1 - 1, -1, -1):
      w = hr[i][i] - p
      r = zero64
      for j in range(i + 1, n1 + 1):
        r = jnp.where(j >= l, r + mul(hr[i][j], hr[j][n1]), r)
      paired = e[i] < 0.0
      alone = div(-r, jnp.where(w != 0.0, w, mul(eps, norm)))
      # e[i] > 0: the real equations of a complex pair (i, i + 1).
      xq, yq = hr[i][i + 1], hr[i + 1][i]
      qq = mul(d[i] - p, d[i] - p) + mul(e[i], e[i])
      t = div(mul(xq, s) - mul(z, r), qq)
      below = jnp.where(jnp.abs(xq) > jnp.abs(z), div(-r - mul(w, t), xq), div(-s - mul(yq, t), z))
      settle = ~paired
      pair = e[i] != 0.0
      hr[i][n1] = jnp.where(settle, jnp.where(pair, t, alone), hr[i][n1])
      hr[i + 1][n1] = jnp.where(settle & pair, below, hr[i + 1][n1])
      t = jnp.abs(hr[i][n1])
      big = settle & (mul(mul(eps, t), t) > 1)
      for j in range(i, n1 + 1):
        hr[j][n1] = jnp.where(big, div(hr[j][n1], jnp.where(big, t, 1.0)), hr[j][n1])
      l = jnp.where(settle, i, l)
      z, s = jnp.where(paired, w, z), jnp.where(paired, r, s)
    # The second of a complex pair (n1 - 1, n1); a 3 x 3 matrix has at most one pair.
    hc = [row[:] for row in h]
    if n1 >= 1:
      a, b = hc[n1][n1 - 1], hc[n1 - 1][n1]
      tall = jnp.abs(a) > jnp.abs(b)
      safe = jnp.where(a != 0, a, 1.0)
      cr, ci = _cdiv(zero64, -b, hc[n1 - 1][n1 - 1] - p, q, zero)
      hc[n1 - 1][n1 - 1] = jnp.where(tall, div(q, safe), cr)
      hc[n1 - 1][n1] = jnp.where(tall, div(-(hc[n1][n1] - p), safe), ci)
      hc[n1][n1 - 1] = zero64
      hc[n1][n1] = one64
      for i in range(n1 - 2, -1, -1):
        ra = sa = zero64
        for j in range(n1 - 1, n1 + 1):
          ra = ra + mul(hc[i][j], hc[j][n1 - 1])
          sa = sa + mul(hc[i][j], hc[j][n1])
        hc[i][n1 - 1], hc[i][n1] = _cdiv(-ra, -sa, hc[i][i] - p, q, zero)
        t = jnp.maximum(jnp.abs(hc[i][n1 - 1]), jnp.abs(hc[i][n1]))
        big = mul(mul(eps, t), t) > 1
        for j in range(i, n1 + 1):
          for c in (n1 - 1, n1):
            hc[j][c] = jnp.where(big, div(hc[j][c], jnp.where(big, t, 1.0)), hc[j][c])
    h = where(q == 0, hr, where(q < 0, hc, h))
  # Back transformation.
  vb = [row[:] for row in v]
  for j in (2, 1, 0):
    for i in range(3):
      total = zero64
      for k in range(j + 1):
        total = total + mul(vb[i][k], h[k][j])
      vb[i][j] = total
  v = where(norm != 0.0, vb, v)
  values = jnp.stack(d)
  order = jnp.argsort(values, stable=True)[::-1]
  vectors = jnp.stack([jnp.stack(r) for r in v]).T
  return values[order], vectors[order], converged
