"""Layer 2 (ops): NVRTC kernels of the detection operators whose work is sequential by nature (ops/defs/
bounding_box.py, ops/defs/multibox.py): non-maximum suppression, greedy bipartite matching, MultiBoxDetection and
MultiBoxTarget. Imports numpy, and dnnbind.kernels on first use (one compile per process, then the disk cache).

Each kernel runs one block per batch item, so a batch is processed in one launch with nothing read back to the host
(the ops stay recordable by hybridize()). Inside a block:

- sorting is by rank: every element counts the elements that sort before it (greater score, or an equal score at a
  lower index), which is a stable sort with no scratch beyond the result (O(n) per element, n threads at a time:
  the same trade as kernels.strided.sort_along);
- a suppression or matching step that depends on the previous one runs as a loop over the reference with the
  block's threads across the candidates and a barrier per step (MXNet's own structure), or in thread 0 where the
  loop is short and each step is O(1).

The arithmetic is the numpy twins' (ops/reference/bounding_box.py, multibox.py) in the same order and type, so the
two backends agree to rounding. Only float and double are compiled (the ops refuse float16 on a GPU).
"""

from __future__ import annotations

import numpy as np

BLOCK = 256

SOURCE = r"""
#define DN_B 256
#define DN_PICKED (-2147483647)  /* MultiBoxTarget: a mined negative (no gt index or encoded one is this) */

template <typename T> __device__ __forceinline__ T dn_area(T a0, T a1, T a2, T a3, int center) {
    T w = center ? a2 : a2 - a0;
    T h = center ? a3 : a3 - a1;
    return (w < T(0) || h < T(0)) ? T(0) : w * h;
}

/* overlap along one axis; in the center format a1/b1 are centers and a2/b2 extents (MXNet's Intersect) */
template <typename T> __device__ __forceinline__ T dn_isect(T a1, T a2, T b1, T b2, int center) {
    T l, r;
    if (!center) {
        l = a1 > b1 ? a1 : b1;
        r = a2 < b2 ? a2 : b2;
    } else {
        T aw = a2 / T(2), bw = b2 / T(2);
        T al = a1 - aw, ar = a1 + aw, bl = b1 - bw, br = b1 + bw;
        l = bl > al ? bl : al;
        r = br < ar ? br : ar;
    }
    T w = r - l;
    return w > T(0) ? w : T(0);
}

template <typename T> __device__ __forceinline__ bool dn_nms_valid(const T* row, int score_i, int id_i, T thresh,
                                                                   T background) {
    return row[score_i] > thresh && (id_i < 0 || row[id_i] != background);
}

/* box_nms's ordering: order[b * n + rank] = i for the valid candidates ranked below topk (greater score first, an
   equal score at the lower index first). A grid of (n / blockDim, batches) blocks, each thread one candidate counting
   the valid ones that sort before it over tiles of scores in shared memory, and stopping once topk of them do (it
   will not be output): a candidate of rank r reads about topk * n / r scores, so the pass costs ~topk * n * log(n)
   compares, not n * n (SSD-512 ranks 20 classes x 24,564 anchors for topk 400). blockDim must be TILE. */
#define DN_RANK_TILE 256
template <typename T>
__global__ void dn_box_nms_rank(const T* x, int* order, int n, int w, int topk, int score_i, int id_i,
                                T valid_thresh, T background) {
    __shared__ T ts[DN_RANK_TILE];
    __shared__ int tv[DN_RANK_TILE];
    const int b = blockIdx.y;
    const T* xb = x + (size_t)b * n * w;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool mine = i < n && dn_nms_valid(xb + (size_t)i * w, score_i, id_i, valid_thresh, background);
    const T s = mine ? xb[(size_t)i * w + score_i] : T(0);
    int rank = 0;
    bool active = mine;
    for (int base = 0; base < n; base += DN_RANK_TILE) {
        if (!__syncthreads_or(active)) break;  /* the whole block is past topk (or holds no candidate) */
        const int j = base + threadIdx.x;
        const bool v = j < n && dn_nms_valid(xb + (size_t)j * w, score_i, id_i, valid_thresh, background);
        tv[threadIdx.x] = v;
        ts[threadIdx.x] = v ? xb[(size_t)j * w + score_i] : T(0);
        __syncthreads();
        if (active) {
            const int lim = n - base < DN_RANK_TILE ? n - base : DN_RANK_TILE;
            for (int t = 0; t < lim; ++t) {
                const T sj = ts[t];
                if (tv[t] && (sj > s || (sj == s && base + t < i))) ++rank;
            }
            if (rank >= topk) active = false;
        }
    }
    if (mine && rank < topk) order[(size_t)b * n + rank] = i;
}

/* box_nms, one block per batch, after dn_box_nms_rank wrote each batch's order. order/keep: n ints of scratch per
   batch. record[b * n + row] = the flat source row of an output row, or -1. convert: 0 none, 1 corner -> center,
   2 center -> corner. */
template <typename T>
__global__ void dn_box_nms(const T* x, T* out, int* record, int* order, int* keep, int n, int w, int topk,
                           int score_i, int id_i, int coord, T valid_thresh, T background, T overlap, int force,
                           int center, int convert) {
    const int b = blockIdx.x;
    const T* xb = x + (size_t)b * n * w;
    T* ob = out + (size_t)b * n * w;
    int* ord = order + (size_t)b * n;
    int* kp = keep + (size_t)b * n;
    int* rec = record + (size_t)b * n;
    __shared__ int nvalid, nkept;
    if (threadIdx.x == 0) nvalid = 0;
    __syncthreads();
    int mine = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        mine += dn_nms_valid(xb + (size_t)i * w, score_i, id_i, valid_thresh, background);
    if (mine) atomicAdd(&nvalid, mine);
    __syncthreads();
    const int k = nvalid < topk ? nvalid : topk;
    for (int r = threadIdx.x; r < k; r += blockDim.x) kp[r] = 1;
    __syncthreads();
    for (int r = 0; r < k; ++r) {
        if (kp[r]) {  /* final: only candidates after r change in step r */
            const T* rb = xb + (size_t)ord[r] * w;
            const T ra = dn_area(rb[coord], rb[coord + 1], rb[coord + 2], rb[coord + 3], center);
            const int rid = id_i >= 0 ? (int)rb[id_i] : 0;
            for (int p = r + 1 + threadIdx.x; p < k; p += blockDim.x) {
                if (!kp[p]) continue;
                const T* pb = xb + (size_t)ord[p] * w;
                if (!force && id_i >= 0 && (int)pb[id_i] != rid) continue;
                T inter = dn_isect(rb[coord], rb[coord + 2], pb[coord], pb[coord + 2], center);
                inter *= dn_isect(rb[coord + 1], rb[coord + 3], pb[coord + 1], pb[coord + 3], center);
                const T pa = dn_area(pb[coord], pb[coord + 1], pb[coord + 2], pb[coord + 3], center);
                const T iou = inter / (ra + pa - inter);
                if (iou > overlap) kp[p] = 0;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {  /* each kept candidate's output row */
        int c = 0;
        for (int r = 0; r < k; ++r) kp[r] = kp[r] ? c++ : -1;
        nkept = c;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        const int at = kp[r];
        if (at < 0) continue;
        const int src = ord[r];
        T* o = ob + (size_t)at * w;
        for (int e = 0; e < w; ++e) o[e] = xb[(size_t)src * w + e];
        rec[at] = b * n + src;
        T* q = o + coord;
        if (convert == 1 && q[0] >= T(0)) {
            T a0 = q[0], a1 = q[1], a2 = q[2], a3 = q[3];
            q[0] = (a0 + a2) / T(2); q[1] = (a1 + a3) / T(2); q[2] = a2 - a0; q[3] = a3 - a1;
        } else if (convert == 2 && q[0] >= T(0)) {
            T a0 = q[0], a1 = q[1], a2 = q[2], a3 = q[3];
            q[0] = a0 - a2 / T(2); q[1] = a1 - a3 / T(2); q[2] = a0 + a2 / T(2); q[3] = a1 + a3 / T(2);
        }
    }
    for (int r = nkept + threadIdx.x; r < n; r += blockDim.x) {
        for (int e = 0; e < w; ++e) ob[(size_t)r * w + e] = T(-1);
        rec[r] = -1;
    }
}

/* box_nms backward: each output row's gradient to its source row (dx zeroed before) */
template <typename T>
__global__ void dn_box_nms_bwd(const T* dy, const int* record, T* dx, int rows, int w) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) {
        const int s = record[i];
        if (s < 0) continue;
        for (int e = 0; e < w; ++e) dx[(size_t)s * w + e] = dy[(size_t)i * w + e];
    }
}

/* true when score a (index i) sorts before score b (index j): NaN last, ties by index (numpy's stable argsort of
   the scores, or of their negation when descending) */
template <typename T> __device__ __forceinline__ bool dn_before(T a, int i, T b, int j, int ascend) {
    const bool na = a != a, nb = b != b;
    if (na || nb) return (!na && nb) || (na && nb && i < j);
    return (ascend ? a < b : a > b) || (a == b && i < j);
}

/* bipartite_matching, one block per batch of an (r, c) score matrix */
template <typename T>
__global__ void dn_bipartite(const T* x, T* rows, T* cols, int* order, int r, int c, T thresh, int ascend,
                             int topk) {
    const int b = blockIdx.x, n = r * c;
    const T* s = x + (size_t)b * n;
    int* ord = order + (size_t)b * n;
    T* rm = rows + (size_t)b * r;
    T* cm = cols + (size_t)b * c;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int rank = 0;
        for (int j = 0; j < n; ++j)
            if (j != i && dn_before(s[j], j, s[i], i, ascend)) ++rank;
        ord[rank] = i;
    }
    for (int i = threadIdx.x; i < r; i += blockDim.x) rm[i] = T(-1);
    for (int i = threadIdx.x; i < c; i += blockDim.x) cm[i] = T(-1);
    __syncthreads();
    if (threadIdx.x != 0) return;
    int count = 0;
    for (int q = 0; q < n; ++q) {
        const int idx = ord[q], i = idx / c, j = idx % c;
        if (rm[i] != T(-1) || cm[j] != T(-1)) continue;
        const T v = s[idx];
        if (ascend ? v < thresh : v > thresh) {
            rm[i] = T(j); cm[j] = T(i);
            ++count;
            if (topk > 0 && count > topk) break;  /* after the match: MXNet's count check, kept */
        } else {
            break;
        }
    }
}

/* MultiBoxDetection, one block per batch. rows: (A, 6) scratch per batch (the packed detections), order/pos: A ints.
   out is (B, A, 6). */
template <typename T>
__global__ void dn_mbox_detect(const T* cls_prob, const T* loc, const T* anchors, T* out, T* rows, int* order,
                               int* pos, int nc, int na, int clip, T threshold, T nms, int do_nms, int force,
                               T vx, T vy, T vw, T vh, int topk) {
    const int b = blockIdx.x;
    const T* p = cls_prob + (size_t)b * nc * na;
    const T* l = loc + (size_t)b * na * 4;
    T* ob = out + (size_t)b * na * 6;
    T* rb = rows + (size_t)b * na * 6;
    int* ord = order + (size_t)b * na;
    int* ps = pos + (size_t)b * na;
    __shared__ int nv;
    for (int i = threadIdx.x; i < na; i += blockDim.x) {
        T score = T(-1);
        int id = 0;
        for (int j = 1; j < nc; ++j) {
            const T v = p[(size_t)j * na + i];
            if (v > score) { score = v; id = j; }
        }
        if (id > 0 && score < threshold) id = 0;
        ps[i] = id;  /* > 0: kept */
        T* o = rb + (size_t)i * 6;  /* unpacked for now: row i */
        o[0] = T(id - 1);
        o[1] = score;
        const T* a = anchors + (size_t)i * 4;
        const T* d = l + (size_t)i * 4;
        const T aw = a[2] - a[0], ah = a[3] - a[1];
        const T ax = (a[0] + a[2]) / T(2), ay = (a[1] + a[3]) / T(2);
        const T ox = d[0] * vx * aw + ax, oy = d[1] * vy * ah + ay;
        const T ow = exp(d[2] * vw) * aw / T(2), oh = exp(d[3] * vh) * ah / T(2);
        T bx[4] = {ox - ow, oy - oh, ox + ow, oy + oh};
        for (int e = 0; e < 4; ++e) {
            T v = bx[e];
            if (clip) v = v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
            o[2 + e] = v;
        }
    }
    for (int i = threadIdx.x; i < na * 6; i += blockDim.x) ob[i] = T(-1);
    __syncthreads();
    if (threadIdx.x == 0) {  /* pack the kept rows in anchor order */
        int c = 0;
        for (int i = 0; i < na; ++i) ps[i] = ps[i] > 0 ? c++ : -1;
        nv = c;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < na; i += blockDim.x)
        if (ps[i] >= 0)
            for (int e = 0; e < 6; ++e) ob[(size_t)ps[i] * 6 + e] = rb[(size_t)i * 6 + e];
    __syncthreads();
    if (nv < 1 || !do_nms) return;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {  /* stable descending rank of the packed scores */
        const T s = ob[(size_t)i * 6 + 1];
        int rank = 0;
        for (int j = 0; j < nv; ++j)
            if (j != i && dn_before(ob[(size_t)j * 6 + 1], j, s, i, 0)) ++rank;
        ord[rank] = i;
    }
    __syncthreads();
    const int nkeep = (topk > 0 && topk < nv) ? topk : nv;
    for (int i = threadIdx.x; i < nv * 6; i += blockDim.x) rb[i] = ob[i];  /* the packed rows, unsorted */
    __syncthreads();
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        if (i < nkeep) {
            for (int e = 0; e < 6; ++e) ob[(size_t)i * 6 + e] = rb[(size_t)ord[i] * 6 + e];
        } else {
            ob[(size_t)i * 6] = T(-1);  /* past nms_topk: MXNet leaves the unsorted row, its id -1 */
        }
    }
    __syncthreads();
    for (int i = 0; i < nkeep; ++i) {
        const T* oi = ob + (size_t)i * 6;
        if (oi[0] >= T(0)) {
            for (int j = i + 1 + threadIdx.x; j < nkeep; j += blockDim.x) {
                T* oj = ob + (size_t)j * 6;
                if (oj[0] < T(0)) continue;
                if (!force && oj[0] != oi[0]) continue;
                T w = (oi[4] < oj[4] ? oi[4] : oj[4]) - (oi[2] > oj[2] ? oi[2] : oj[2]);
                T h = (oi[5] < oj[5] ? oi[5] : oj[5]) - (oi[3] > oj[3] ? oi[3] : oj[3]);
                w = w > T(0) ? w : T(0);
                h = h > T(0) ? h : T(0);
                const T in = w * h;
                const T u = (oi[4] - oi[2]) * (oi[5] - oi[3]) + (oj[4] - oj[2]) * (oj[5] - oj[3]) - in;
                const T iou = u <= T(0) ? T(0) : in / u;
                if (iou >= nms) oj[0] = T(-1);
            }
        }
        __syncthreads();
    }
}

/* MultiBoxTarget, one block per batch. iou: (A, L) float scratch per batch; flags, best_gt: A ints; best_iou: A
   floats; gt_done: L ints; prob: A floats. Outputs (B, A*4), (B, A*4), (B, A). */
template <typename T>
__global__ void dn_mbox_target(const T* anchors, const T* label, const T* cls_pred, T* loc_t, T* loc_m, T* cls_t,
                               float* iou, int* flags, int* best_gt, float* best_iou, int* gt_done, float* prob,
                               int na, int nl, int lw, int nc, float overlap_threshold, T ignore_label,
                               float ratio, float neg_thresh, float vx, float vy, float vw, float vh) {
    const int b = blockIdx.x;
    const T* lb = label + (size_t)b * nl * lw;
    const T* pb = cls_pred + (size_t)b * nc * na;
    float* io = iou + (size_t)b * na * nl;
    int* fl = flags + (size_t)b * na;
    int* bg = best_gt + (size_t)b * na;
    float* bi = best_iou + (size_t)b * na;
    int* gd = gt_done + (size_t)b * nl;
    float* pr = prob + (size_t)b * na;
    __shared__ int ng, positives, best_flat, n_neg;
    __shared__ float red_v[DN_B];
    __shared__ int red_i[DN_B];
    for (int i = threadIdx.x; i < na * 4; i += blockDim.x) {
        loc_t[(size_t)b * na * 4 + i] = T(0);
        loc_m[(size_t)b * na * 4 + i] = T(0);
    }
    for (int i = threadIdx.x; i < na; i += blockDim.x) {
        cls_t[(size_t)b * na + i] = ignore_label;
        fl[i] = -1; bg[i] = -1; bi[i] = -1.f;
    }
    if (threadIdx.x == 0) {
        int k = 0;
        while (k < nl && (float)lb[(size_t)k * lw] != -1.f) ++k;
        ng = k;
        positives = 0;
    }
    __syncthreads();
    if (ng == 0) return;
    for (int i = threadIdx.x; i < ng; i += blockDim.x) gd[i] = 0;
    for (int t = threadIdx.x; t < na * ng; t += blockDim.x) {
        const int j = t / ng, k = t % ng;
        const T* a = anchors + (size_t)j * 4;
        const T* g = lb + (size_t)k * lw + 1;
        T w = (a[2] < g[2] ? a[2] : g[2]) - (a[0] > g[0] ? a[0] : g[0]);
        T h = (a[3] < g[3] ? a[3] : g[3]) - (a[1] > g[1] ? a[1] : g[1]);
        w = T(0) > w ? T(0) : w;
        h = T(0) > h ? T(0) : h;
        const T in = w * h;
        const T u = (a[2] - a[0]) * (a[3] - a[1]) + (g[2] - g[0]) * (g[3] - g[1]) - in;
        io[t] = u == T(0) ? 0.f : (float)(in / u);
    }
    __syncthreads();
    /* 1. greedy matching: the best (anchor, gt) pair among the free ones, first in (anchor, gt) order on ties */
    for (int step = 0; step < ng; ++step) {
        float v = -1.f;
        int at = -1;
        for (int t = threadIdx.x; t < na * ng; t += blockDim.x) {
            const int j = t / ng, k = t % ng;
            if (fl[j] == 1 || gd[k]) continue;
            if (io[t] > v || (io[t] == v && at >= 0 && t < at)) { v = io[t]; at = t; }
        }
        red_v[threadIdx.x] = v; red_i[threadIdx.x] = at;
        __syncthreads();
        for (int half = DN_B / 2; half > 0; half >>= 1) {
            if (threadIdx.x < half) {
                const float v2 = red_v[threadIdx.x + half];
                const int i2 = red_i[threadIdx.x + half];
                const float v1 = red_v[threadIdx.x];
                const int i1 = red_i[threadIdx.x];
                if (i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1))) {
                    red_v[threadIdx.x] = v2; red_i[threadIdx.x] = i2;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            best_flat = (red_i[0] >= 0 && red_v[0] > 1e-6f) ? red_i[0] : -1;
            if (best_flat >= 0) {
                const int j = best_flat / ng, k = best_flat % ng;
                bi[j] = red_v[0]; bg[j] = k; fl[j] = 1; gd[k] = 1;
                ++positives;
            }
        }
        __syncthreads();
        if (best_flat < 0) break;
    }
    /* 2. every other anchor to its best gt; positive above overlap_threshold */
    for (int j = threadIdx.x; j < na; j += blockDim.x) {
        if (fl[j] == 1) continue;
        int best = -1;
        float m = -1.f;
        for (int k = 0; k < ng; ++k)
            if (io[(size_t)j * ng + k] > m) { m = io[(size_t)j * ng + k]; best = k; }
        if (best < 0) continue;
        if (overlap_threshold > 0.f) {
            bi[j] = m; bg[j] = best;
            if (m > overlap_threshold) { fl[j] = 2; atomicAdd(&positives, 1); }  /* 2: positive of this step */
        } else {
            pr[j] = m;  /* kept for the negative mining's own fill-in */
            bg[j] = -2 - best;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < na; j += blockDim.x) if (fl[j] == 2) fl[j] = 1;
    if (threadIdx.x == 0) {
        int k = (int)((float)positives * ratio);
        if (k > na - positives) k = na - positives;
        n_neg = ratio > 0.f ? k : 0;
    }
    __syncthreads();
    if (ratio > 0.f) {
        if (n_neg > 0) {
            for (int j = threadIdx.x; j < na; j += blockDim.x) {
                if (fl[j] == 1) continue;
                if (bi[j] < 0.f && bg[j] <= -2) { bi[j] = pr[j]; bg[j] = -2 - bg[j]; }
                if (bi[j] < neg_thresh) {
                    T mx = pb[j];
                    for (int k = 1; k < nc; ++k) { const T v = pb[(size_t)k * na + j]; if (v > mx) mx = v; }
                    T sum = T(0);
                    for (int k = 0; k < nc; ++k) sum += exp(pb[(size_t)k * na + j] - mx);
                    pr[j] = (float)(exp(pb[j] - mx) / sum);
                    fl[j] = -3;  /* a candidate negative */
                }
            }
            __syncthreads();
            /* (fewer candidates than n_neg: MXNet fails a check; here every candidate becomes a negative) */
            for (int j = threadIdx.x; j < na; j += blockDim.x) {  /* the lowest background probabilities */
                if (fl[j] != -3) continue;
                int rank = 0;
                for (int q = 0; q < na; ++q)
                    if (q != j && fl[q] == -3 && (pr[q] < pr[j] || (pr[q] == pr[j] && q < j))) ++rank;
                bg[j] = rank < n_neg ? DN_PICKED : bg[j];
            }
            __syncthreads();
            for (int j = threadIdx.x; j < na; j += blockDim.x)
                if (fl[j] == -3) fl[j] = bg[j] == DN_PICKED ? 0 : -1;
        }
    } else {
        for (int j = threadIdx.x; j < na; j += blockDim.x) if (fl[j] != 1) fl[j] = 0;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < na; j += blockDim.x) {
        if (fl[j] == 1) {
            const T* g = lb + (size_t)bg[j] * lw;
            cls_t[(size_t)b * na + j] = g[0] + T(1);
            const T* a = anchors + (size_t)j * 4;
            const float al = (float)a[0], at = (float)a[1], ar = (float)a[2], ab = (float)a[3];
            const float aw = ar - al, ah = ab - at, ax = (al + ar) * 0.5f, ay = (at + ab) * 0.5f;
            const float gl = (float)g[1], gt = (float)g[2], gr = (float)g[3], gb = (float)g[4];
            const float gw = gr - gl, gh = gb - gt, gx = (gl + gr) * 0.5f, gy = (gt + gb) * 0.5f;
            T* o = loc_t + (size_t)b * na * 4 + (size_t)j * 4;
            o[0] = T((gx - ax) / aw / vx);
            o[1] = T((gy - ay) / ah / vy);
            o[2] = T(logf(gw / aw) / vw);
            o[3] = T(logf(gh / ah) / vh);
            for (int e = 0; e < 4; ++e) loc_m[(size_t)b * na * 4 + (size_t)j * 4 + e] = T(1);
        } else if (fl[j] == 0) {
            cls_t[(size_t)b * na + j] = T(0);
        }
    }
}
"""

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
RANK_TILE = 256  # dn_box_nms_rank's block size (DN_RANK_TILE)
NAMES = tuple(f"{k}<{t}>" for k in ("dn_box_nms_rank", "dn_box_nms", "dn_box_nms_bwd", "dn_bipartite", "dn_mbox_detect",
                                    "dn_mbox_target") for t in _CTYPE.values())

_module: dict = {}


def kernel(name: str, dtype):
    """The compiled kernel ``name`` for ``dtype`` (float32 or float64)."""
    mod = _module.get("m")
    if mod is None:
        from ..kernels import Module
        mod = _module["m"] = Module(SOURCE, NAMES)
    return mod.get_function(f"{name}<{_CTYPE[np.dtype(dtype)]}>")


def grid_for(n: int, block: int = BLOCK, cap: int = 4096) -> int:
    return max(1, min((int(n) + block - 1) // block, cap))
