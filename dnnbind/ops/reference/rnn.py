"""Numpy twin of MXNet's fused ``RNN`` operator (rnn_relu, rnn_tanh, lstm, gru): forward and backward through time.
Layer: ops. Imports numpy only.

Data is TNC (sequence length T, batch N, input size C). The cells are cuDNN's (which MXNet's GPU path calls and its
cpu kernels in rnn_impl.h reproduce), each gate with an input bias and a recurrent bias:

- rnn_relu / rnn_tanh: ``h' = act(Wx x + bx + Wh h + bh)``.
- lstm (gates i, f, g, o): ``c' = f * c + i * g``, ``h' = o * tanh(c')``; with a projection (``projection_size``
  P) the state carried and output is ``r' = Wr h'``. ``clip`` (MXNet's lstm_state_clip_min/max, cuDNN's
  cudnnRNNSetClip) bounds the cell state wherever it is *read*: ``c' = f * clip(c) + i * g`` (the initial state
  included) and ``h' = o * tanh(clip(c'))``, while the cell state kept and returned (cy) is the raw c'. That is what
  cuDNN 9.19 computes (found on an H100 in float64: clipping only the new state, or returning it clipped, does not
  match). The gradient is 0 through a read where the clip bounds the state.
- gru (gates r, z, n): ``n = tanh(Wn x + bxn + r * (Rn h + bhn))`` (the reset gate multiplies the recurrent part
  *after* its bias: cuDNN's placement, not the original paper's), ``h' = (1 - z) * n + z * h``.

Layers stack; a bidirectional layer runs a reverse-time pass too and concatenates both directions' outputs along
the features. In training, dropout with rate p is applied to each layer's output except the last's (the masks
are given, or drawn here).

MXNet's flat parameter vector (``layout``): every weight first, by layer, then direction, then i2h, h2h (and h2r
with a projection); then every bias in the same order (i2h, h2h). Gates are stacked along a matrix's rows.

Variable lengths (``lengths``, MXNet's use_sequence_length): data is padded TNC; batch entry b uses steps
t < lengths[b]. Its output past that is 0, its final state is the state after its last valid step, and the reverse
direction starts at its last valid step. A step past the length leaves the state as it was (a mask per step).

Everything is computed in float64 and returned in the data's dtype.
"""

from __future__ import annotations

import numpy as np

GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}

__all__ = ["GATES", "layout", "param_size", "rnn_backward", "rnn_forward"]


def param_size(mode: str, num_layers: int, input_size: int, state_size: int, bidirectional: bool = False,
               projection_size: int | None = None) -> int:
    """The length of MXNet's flat parameter vector (GetRnnParamSize in rnn-inl.h)."""
    return sum(int(np.prod(shape)) for _, _, _, _, shape in layout(mode, num_layers, input_size, state_size,
                                                                       bidirectional, projection_size))


def layout(mode: str, num_layers: int, input_size: int, state_size: int, bidirectional: bool = False,
           projection_size: int | None = None) -> list:
    """Where each piece sits in the flat vector: ``(layer, direction, name, offset, shape)`` in storage order,
    ``name`` one of wx (i2h weight), wh (h2h weight), wr (h2r projection), bx (i2h bias), bh (h2h bias)."""
    g, h = GATES[mode], state_size
    p = projection_size or h
    d = 2 if bidirectional else 1
    pieces, off = [], 0
    for kind in ("weight", "bias"):
        for layer in range(num_layers):
            cin = input_size if layer == 0 else d * p
            for direction in range(d):
                if kind == "weight":
                    shapes = [("wx", (g * h, cin)), ("wh", (g * h, p))]
                    if projection_size:
                        shapes.append(("wr", (p, h)))
                else:
                    shapes = [("bx", (g * h,)), ("bh", (g * h,))]
                for name, shape in shapes:
                    pieces.append((layer, direction, name, off, shape))
                    off += int(np.prod(shape))
    return pieces


def _unpack(params: np.ndarray, pieces: list) -> dict:
    """(layer, direction) -> {name: array view into params}."""
    out: dict = {}
    for layer, direction, name, off, shape in pieces:
        out.setdefault((layer, direction), {})[name] = params[off:off + int(np.prod(shape))].reshape(shape)
    return out


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _step_masks(lengths, t_len: int, n: int) -> np.ndarray:
    """(T, N, 1) float64: 1 where step t is within batch entry b's sequence."""
    if lengths is None:
        return np.ones((t_len, n, 1))
    return (np.arange(t_len)[:, None] < np.asarray(lengths).reshape(1, n)).astype(np.float64)[:, :, None]


def _clip(c, clip, clip_nan):
    """c clipped to the bounds and where it was inside them. NOTE: cuDNN keeps the bounds as floats (a float64 run
    matches it only with the bounds rounded to float32), so they are rounded here too."""
    if clip is None:
        return c, None
    lo, hi = float(np.float32(clip[0])), float(np.float32(clip[1]))
    if clip_nan:  # cuDNN's NOT_PROPAGATE_NAN clip is fmin(fmax(c, lo), hi): a NaN becomes lo
        c = np.where(np.isnan(c), lo, c)
    inside = (c >= lo) & (c <= hi)
    return np.clip(c, lo, hi), inside


def _direction_forward(mode, w, xs, h0, c0, masks, reverse, clip, clip_nan):
    """One direction of one layer over all steps. Returns (outputs (T, N, P), h_T, c_T, per-step cache)."""
    t_len = xs.shape[0]
    hsz = w["wh"].shape[0] // GATES[mode]
    ax = xs @ w["wx"].T + w["bx"]  # every step's input part at once
    h, c = h0, c0
    ys = np.zeros((t_len,) + h0.shape)
    steps = []
    for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
        m = masks[t]
        ah = h @ w["wh"].T + w["bh"]
        s = {"t": t, "h": h, "c": c}
        if mode == "lstm":
            a = ax[t] + ah
            i, f = _sigmoid(a[:, :hsz]), _sigmoid(a[:, hsz:2 * hsz])
            g, o = np.tanh(a[:, 2 * hsz:3 * hsz]), _sigmoid(a[:, 3 * hsz:])
            c_in, inside = _clip(c, clip, clip_nan)
            cn = f * c_in + i * g
            c_out, inside_out = _clip(cn, clip, clip_nan)
            tc = np.tanh(c_out)
            hpre = o * tc
            hn = hpre @ w["wr"].T if "wr" in w else hpre
            s.update(c=c_in, i=i, f=f, g=g, o=o, tc=tc, hpre=hpre, inside=inside, inside_out=inside_out)
            c = m * cn + (1 - m) * c
        elif mode == "gru":
            r = _sigmoid(ax[t][:, :hsz] + ah[:, :hsz])
            z = _sigmoid(ax[t][:, hsz:2 * hsz] + ah[:, hsz:2 * hsz])
            n = np.tanh(ax[t][:, 2 * hsz:] + r * ah[:, 2 * hsz:])
            hn = (1 - z) * n + z * h
            s.update(r=r, z=z, n=n, ahn=ah[:, 2 * hsz:])
        else:
            a = ax[t] + ah
            hn = np.maximum(a, 0) if mode == "rnn_relu" else np.tanh(a)
            s.update(hn=hn, a=a)
        ys[t] = m * hn
        h = m * hn + (1 - m) * h
        steps.append(s)
    return ys, h, c, steps


def _direction_backward(mode, w, xs, masks, steps, dys, dh, dc, dw):
    """Backward of _direction_forward: accumulates into ``dw`` (same keys as w); returns (dxs, dh0, dc0)."""
    dxs = np.zeros(xs.shape)
    for s in reversed(steps):  # the forward's steps, last processed first
        t, h = s["t"], s["h"]
        m = masks[t]
        dhn = m * (dys[t] + dh)  # the new state is the output, and is carried on where the step is valid
        carry = (1 - m) * dh
        if mode == "lstm":
            if "wr" in w:
                dw["wr"] += dhn.T @ s["hpre"]
                dhpre = dhn @ w["wr"]
            else:
                dhpre = dhn
            i, f, g, o, tc = s["i"], s["f"], s["g"], s["o"], s["tc"]
            dtc = dhpre * o * (1 - tc * tc)
            dcn = (dtc if s["inside_out"] is None else dtc * s["inside_out"]) + m * dc
            dgates = np.concatenate([dcn * g * i * (1 - i), dcn * s["c"] * f * (1 - f), dcn * i * (1 - g * g),
                                     dhpre * tc * o * (1 - o)], axis=1)
            dc_in = dcn * f if s["inside"] is None else dcn * f * s["inside"]
            dc = dc_in + (1 - m) * dc
            dax = dah = dgates
            dh_direct = 0.0
        elif mode == "gru":
            r, z, n, ahn = s["r"], s["z"], s["n"], s["ahn"]
            dn = dhn * (1 - z)
            dan = dn * (1 - n * n)
            daz = dhn * (h - n) * z * (1 - z)
            dar = dan * ahn * r * (1 - r)
            dax = np.concatenate([dar, daz, dan], axis=1)
            dah = np.concatenate([dar, daz, dan * r], axis=1)
            dh_direct = dhn * z
        else:
            da = dhn * ((s["a"] > 0) if mode == "rnn_relu" else (1 - s["hn"] * s["hn"]))
            dax = dah = da
            dh_direct = 0.0
        dw["wx"] += dax.T @ xs[t]
        dw["bx"] += dax.sum(axis=0)
        dw["wh"] += dah.T @ h
        dw["bh"] += dah.sum(axis=0)
        dxs[t] = dax @ w["wx"]
        dh = dh_direct + dah @ w["wh"] + carry
    return dxs, dh, dc


def rnn_forward(x, params, hx, cx=None, *, mode: str, state_size: int, num_layers: int,
                bidirectional: bool = False, projection_size: int | None = None, lengths=None, clip=None,
                clip_nan: bool = False, p: float = 0.0, masks=None, rng=None):
    """(y, hy, cy, cache). ``x`` (T, N, C); ``params`` MXNet's flat vector; ``hx`` (L*D, N, P); ``cx`` (L*D, N, H)
    for lstm (else None). ``lengths`` (N,) or None. ``clip`` (min, max) or None. Dropout p between layers uses
    ``masks`` (one (T, N, D*P) array per layer but the last, values 0 or 1/(1-p)) or draws them from ``rng`` (a
    numpy Generator); p = 0 draws nothing. ``cache`` is what rnn_backward needs."""
    dtype = x.dtype
    t_len, n, c_in = x.shape
    d = 2 if bidirectional else 1
    pieces = layout(mode, num_layers, c_in, state_size, bidirectional, projection_size)
    w = _unpack(np.asarray(params, np.float64), pieces)
    hx = np.asarray(hx, np.float64)
    cx = np.asarray(cx, np.float64) if cx is not None else None
    step_masks = _step_masks(lengths, t_len, n)
    inp = np.asarray(x, np.float64)
    hy, cy = np.zeros(hx.shape), (np.zeros(cx.shape) if cx is not None else None)
    layers, drops = [], []
    for layer in range(num_layers):
        outs, caches = [], []
        for direction in range(d):
            k = layer * d + direction
            c0 = cx[k] if cx is not None else np.zeros((n, state_size))
            ys, h_t, c_t, steps = _direction_forward(mode, w[(layer, direction)], inp, hx[k], c0, step_masks,
                                                     direction == 1, clip, clip_nan)
            hy[k] = h_t
            if cy is not None:
                cy[k] = c_t
            outs.append(ys)
            caches.append(steps)
        layers.append((inp, caches))
        inp = np.concatenate(outs, axis=2) if d == 2 else outs[0]
        if p > 0 and layer < num_layers - 1:
            if masks is not None:
                mask = np.asarray(masks[layer], np.float64)
            else:
                gen = rng if rng is not None else np.random.default_rng()
                mask = (gen.random(inp.shape) >= p) / (1.0 - p)
            inp = inp * mask
            drops.append(mask)
    cache = {"mode": mode, "w": w, "pieces": pieces, "layers": layers, "drops": drops, "masks": step_masks,
             "d": d, "size": int(np.size(params)), "dtype": dtype, "lstm": cx is not None,
             "shapes": (x.shape, hx.shape)}
    y = inp.astype(dtype)
    return y, hy.astype(dtype), (cy.astype(dtype) if cy is not None else None), cache


def rnn_backward(cache, dy, dhy=None, dcy=None):
    """(dx, dparams, dhx, dcx) for the forward that returned ``cache``; ``dhy``/``dcy`` None mean zeros. dparams
    is in MXNet's flat layout; dcx is None without a cell state."""
    mode, w, d = cache["mode"], cache["w"], cache["d"]
    x_shape, h_shape = cache["shapes"]
    dtype = cache["dtype"]
    n = x_shape[1]
    hsz = w[(0, 0)]["wh"].shape[0] // GATES[mode]
    dw = {k: {name: np.zeros(a.shape) for name, a in v.items()} for k, v in w.items()}
    dhy = np.zeros(h_shape) if dhy is None else np.asarray(dhy, np.float64)
    c_shape = (h_shape[0], n, hsz)
    dcy = np.zeros(c_shape) if dcy is None else np.asarray(dcy, np.float64)
    dhx, dcx = np.zeros(h_shape), np.zeros(c_shape)
    grad = np.asarray(dy, np.float64)
    num_layers = len(cache["layers"])
    for layer in range(num_layers - 1, -1, -1):
        inp, caches = cache["layers"][layer]
        if layer < num_layers - 1 and cache["drops"]:
            grad = grad * cache["drops"][layer]
        p = grad.shape[2] // d
        dinp = np.zeros(inp.shape)
        for direction in range(d):
            k = layer * d + direction
            dxs, dh0, dc0 = _direction_backward(mode, w[(layer, direction)], inp, cache["masks"],
                                                caches[direction], grad[:, :, direction * p:(direction + 1) * p],
                                                dhy[k], dcy[k], dw[(layer, direction)])
            dinp += dxs
            dhx[k] = dh0
            dcx[k] = dc0
        grad = dinp
    flat = np.zeros(cache["size"])
    for layer, direction, name, off, shape in cache["pieces"]:
        flat[off:off + int(np.prod(shape))] = dw[(layer, direction)][name].ravel()
    return (grad.astype(dtype), flat.astype(dtype), dhx.astype(dtype),
            dcx.astype(dtype) if cache["lstm"] else None)
