"""scripts/bench_ssd.py on the CPU: the PyTorch port of GluonCV's ssd_512_resnet50_v1_voc (its parameter count worked
out by hand from the architecture, its output shapes and anchors, its NMS against a plain greedy NMS, its targets
against a brute-force matcher), and a smoke run of the script: GluonCV's network on dnnbind's CPU backend, one
training and one inference step, and, with torch installed, the port from the same weights giving the same loss.
The smoke run is a subprocess (the script installs the mxnet alias) and takes minutes on two cores: marked slow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    """The child's environment: the checkout first on PYTHONPATH, the caller's own entries (where GluonCV may
    be installed) after it."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
sys.path.insert(0, str(ROOT / "scripts"))
import bench_ssd


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def _hand_count() -> int:
    """SSD-512 ResNet-50 v1's learned parameters from its layer list (gluoncv resnet.py, feature.py, ssd.py)."""
    total = 3 * 64 * 7 * 7 + 2 * 64  # stem conv (no bias) + BatchNorm
    cin = 64
    for blocks, c in zip((3, 4, 6, 3), (256, 512, 1024, 2048)):
        for b in range(blocks):
            mid = c // 4
            total += cin * mid + mid + 2 * mid  # 1x1 (stride, bias) + BN
            total += mid * mid * 9 + 2 * mid    # 3x3 (no bias) + BN
            total += mid * c + c + 2 * c        # 1x1 (bias) + BN
            if b == 0 and cin != c:
                total += cin * c + 2 * c        # projection (no bias) + BN
            cin = c
    for f in (512, 512, 256, 256):              # FeatureExpander: 1x1 transition + 3x3/2, each BN (gamma kept)
        total += cin * f + 2 * f + f * f * 9 + 2 * f
        cin = f
    for c, depth in zip((1024, 2048, 512, 512, 256, 256), (4, 6, 6, 6, 4, 4)):
        total += c * 9 * depth * 21 + depth * 21 + c * 9 * depth * 4 + depth * 4  # class and box predictors
    return total


def test_port_parameter_count_matches_the_architecture():
    torch = _torch()
    counts = bench_ssd.torch_counts(bench_ssd.build_torch_ssd(torch))
    assert counts["trainable"] == _hand_count()
    # BatchNorm statistics: 2 per channel of every BatchNorm
    bn = 64 + sum(n * (2 * (c // 4) + c) + c for n, c in zip((3, 4, 6, 3), (256, 512, 1024, 2048))) + 2 * 1536
    assert counts["bn_stats"] == 2 * bn
    assert counts["anchors"] == 4 * (128 * 128 * 4 + 64 * 64 * 6 + 32 * 32 * 6 + 16 * 16 * 6 + 16 * 16 * 4 * 2)


def test_port_outputs_anchors_and_detections():
    torch = _torch()
    net = bench_ssd.build_torch_ssd(torch).eval()
    size = 256  # feature maps 16, 8, 4, 2, 1, 1 (512 gives 32 ... 1: the same code, 4x the time)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        cls, box, anchors = net(x)
        ids, scores, boxes = net.detect(x)
    n = 16 * 16 * 4 + 8 * 8 * 6 + 4 * 4 * 6 + 2 * 2 * 6 + 1 * 4 + 1 * 4
    assert cls.shape == (2, n, 21) and box.shape == (2, n, 4) and anchors.shape == (1, n, 4)
    # the first anchors of the first cell (step 16): sizes 51.2 and sqrt(51.2 * 102.4), then ratio 2 of 51.2
    s = 51.2
    expect = [[8, 8, s, s], [8, 8, (s * 102.4) ** 0.5, (s * 102.4) ** 0.5], [8, 8, s * 2 ** 0.5, s / 2 ** 0.5]]
    np.testing.assert_allclose(anchors[0, :3].numpy(), expect, rtol=1e-6)
    assert ids.shape == (2, 100, 1) and scores.shape == (2, 100, 1) and boxes.shape == (2, 100, 4)
    kept = scores[..., 0] > 0
    assert bool(kept.any())
    assert bool((scores[..., 0][:, 1:] <= scores[..., 0][:, :-1]).all())  # sorted, -1 rows at the end


def _greedy_nms(rows: np.ndarray) -> np.ndarray:
    """MXNet box_nms (per class, score > 0.01, best 400 first) written as the textbook loop."""
    valid = [r for r in rows if r[1] > bench_ssd.SCORE_THRESH]
    valid = sorted(valid, key=lambda r: -r[1])[:bench_ssd.NMS_TOPK]
    kept = []
    for r in valid:
        ok = True
        for k in kept:
            if k[0] != r[0]:
                continue
            iw = max(0.0, min(r[4], k[4]) - max(r[2], k[2]))
            ih = max(0.0, min(r[5], k[5]) - max(r[3], k[3]))
            inter = iw * ih
            union = (r[4] - r[2]) * (r[5] - r[3]) + (k[4] - k[2]) * (k[5] - k[3]) - inter
            if inter / union > bench_ssd.NMS_THRESH:
                ok = False
                break
        if ok:
            kept.append(r)
    out = np.full((min(len(rows), bench_ssd.POST_NMS), 6), -1.0)
    kept = np.array(kept[:len(out)]).reshape(-1, 6)
    out[:len(kept)] = kept
    return out


@pytest.mark.parametrize("rows", [7, 60, 450])
def test_port_nms_equals_greedy_nms(rows):
    torch = _torch()
    rng = np.random.default_rng(rows)
    xy = rng.uniform(0, 60, (2, rows, 2))
    wh = rng.uniform(5, 40, (2, rows, 2))
    result = np.concatenate([rng.integers(0, 3, (2, rows, 1)), rng.uniform(0, 1, (2, rows, 1)), xy, xy + wh], -1)
    result[0, :3, 1] = 0.005  # under the score threshold
    got = bench_ssd.box_nms(torch, torch.from_numpy(result)).numpy()
    for b in range(2):
        np.testing.assert_allclose(got[b], _greedy_nms(result[b]), rtol=1e-12)


def test_numpy_targets_match_a_brute_force_matcher():
    """Every anchor of IoU >= 0.5 with a box takes its best box; each box's best anchor is matched to it; the rest
    are background; box targets encode the matched box (SSDTargetGenerator's rules)."""
    rng = np.random.default_rng(3)
    anchors = np.concatenate([rng.uniform(20, 100, (300, 2)), rng.uniform(10, 60, (300, 2))], 1)
    xy = rng.uniform(0, 80, (2, 3, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(15, 50, (2, 3, 2))], -1)
    ids = rng.integers(0, 20, (2, 3)).astype(np.float32)
    cls, box = bench_ssd.numpy_targets(anchors, boxes, ids)
    corner = np.concatenate([anchors[:, :2] - anchors[:, 2:] / 2, anchors[:, :2] + anchors[:, 2:] / 2], 1)
    for b in range(2):
        iou = np.array([[_iou(a, g) for g in boxes[b]] for a in corner])
        best_anchor = iou.argmax(0)
        for j, a in enumerate(corner):
            if j in best_anchor:
                g = int(np.flatnonzero(best_anchor == j)[0])
            elif iou[j].max() >= 0.5:
                g = int(iou[j].argmax())
            else:
                assert cls[b, j] == 0 and not box[b, j].any()
                continue
            assert cls[b, j] == ids[b, g] + 1
            m, w = boxes[b, g], anchors[j]
            enc = [((m[0] + m[2]) / 2 - w[0]) / w[2] / 0.1, ((m[1] + m[3]) / 2 - w[1]) / w[3] / 0.1,
                   np.log((m[2] - m[0]) / w[2]) / 0.2, np.log((m[3] - m[1]) / w[3]) / 0.2]
            np.testing.assert_allclose(box[b, j], enc, rtol=1e-4, atol=1e-5)


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_port_loss_mines_three_negatives_per_positive():
    """SSDMultiBoxLoss by hand: cross entropy on positives and on the 3 * positives hardest negatives, smooth L1 on the
    positives' boxes, both over the batch's positive count."""
    torch = _torch()
    rng = np.random.default_rng(1)
    cls_pred = rng.standard_normal((2, 40, 21)).astype(np.float32)
    box_pred = rng.standard_normal((2, 40, 4)).astype(np.float32) * 2
    cls_t = np.zeros((2, 40), np.float32)
    cls_t[0, [3, 7]] = [5, 9]
    cls_t[1, 11] = 2
    box_t = rng.standard_normal((2, 40, 4)).astype(np.float32)
    got = bench_ssd.ssd_loss(torch, *(torch.from_numpy(a) for a in (cls_pred, box_pred, cls_t, box_t))).numpy()
    logp = cls_pred - np.log(np.exp(cls_pred).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, cls_t.astype(int)[..., None], -1)[..., 0]
    num_pos = 3
    for b in range(2):
        pos = cls_t[b] > 0
        neg = np.flatnonzero(~pos)
        hard = neg[np.argsort(-ce[b, neg], kind="stable")[:3 * pos.sum()]]
        d = np.abs(box_pred[b] - box_t[b])
        smooth = np.where(d > 1, d - 0.5, 0.5 * d * d)[pos].sum()
        want = (ce[b, pos].sum() + ce[b, hard].sum() + smooth) / num_pos
        assert abs(got[b] - want) < 1e-4 * abs(want)


def test_help_needs_neither_gpu_nor_gluoncv():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_ssd.py"), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, check=False, env=_env())
    assert out.returncode == 0, out.stderr
    assert "--modes" in out.stdout and "dnnbind-train-hybrid" in out.stdout and "torch-train-amp" in out.stdout


@pytest.mark.slow  # about 2-4 minutes on two cores: GluonCV's ResNet-50 on the numpy backend
def test_cpu_smoke_run(tmp_path):
    why = bench_ssd.gluoncv_error()
    if why is not None:
        pytest.skip(f"GluonCV does not import on dnnbind yet: {why}")
    path = tmp_path / "bench_ssd.json"
    # batch 2, not 1: the last expander layer is 1x1, and a training BatchNorm over 1 value per channel is refused
    # (by torch, and by dnnbind, where MXNet returns beta); 128x128 keeps it to minutes
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_ssd.py"), "--device", "cpu", "--batch", "2",
                          "--size", "128", "--steps", "1", "--modes", "dnnbind-train", "dnnbind-infer",
                          "torch-train", "torch-train-amp", "--json", str(path)],
                         capture_output=True, text=True, timeout=1200, cwd=ROOT, check=False,
                         env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["model"] == "ssd_512_resnet50_v1_voc" and result["batch"] == 2 and result["input"] == [3, 128, 128]
    runs = result["runs"]
    for key in ("dnnbind-train", "dnnbind-infer"):
        assert runs[key]["status"] == "ok", runs[key]
        assert np.isfinite(runs[key]["first_loss"]) and np.isfinite(runs[key]["final_loss"])
    assert runs["torch-train-amp"]["status"] == "skipped"
    assert result["targets"] == "gluoncv SSDTargetGenerator"
    assert result["parameter_counts"]["dnnbind"]["trainable"] == _hand_count()
    if runs["torch-train"]["status"] == "skipped":
        return  # no torch here
    assert runs["torch-train"]["status"] == "ok", runs["torch-train"]
    counts = result["parameter_counts"]
    assert counts["torch"] == counts["dnnbind"], counts
    assert result["numpy_targets_agree"]["cls"] == 1.0, result["numpy_targets_agree"]
    check = result["weights_check"]
    assert check["anchors_max_abs_diff"] == 0.0, check
    assert abs(check["loss_dnnbind"] - check["loss_torch"]) < 1e-3 * abs(check["loss_torch"]), check
    first = runs["dnnbind-train"]["first_loss"], runs["torch-train"]["first_loss"]
    assert abs(first[0] - first[1]) < 1e-3 * abs(first[1]), first


def test_ratios_compare_within_a_task():
    runs = {"dnnbind-train": {"status": "ok", "ms": 30.0}, "torch-train": {"status": "ok", "ms": 20.0},
            "torch-train-amp": {"status": "ok", "ms": 10.0}, "dnnbind-infer": {"status": "ok", "ms": 6.0},
            "torch-infer": {"status": "ok", "ms": 8.0}, "torch-infer-amp": {"status": "failed"}}
    bench_ssd.add_ratios(runs)
    assert runs["dnnbind-train"]["vs_torch_same_math"] == 1.5 and runs["dnnbind-train"]["vs_torch_best"] == 3.0
    assert runs["dnnbind-infer"]["vs_torch_same_math"] == 0.75 and runs["dnnbind-infer"]["vs_torch_best"] == 0.75
    assert "vs_torch_best" not in runs["torch-infer-amp"]  # a failed mode gets no ratios


@pytest.mark.gpu
def test_gpu_every_mode_runs_from_the_same_weights(tmp_path):
    """On the GPU, batch 4 at 512x512, 2 timed steps: every mode runs; the port, given GluonCV's weights, gives its
    first loss in strict FP32 (the weights check); the hybridized step starts from the eager step's loss; the training
    modes lower the loss."""
    why = bench_ssd.gluoncv_error()
    if why is not None:
        pytest.skip(f"GluonCV does not import on dnnbind yet: {why}")
    path = tmp_path / "bench_ssd.json"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_ssd.py"), "--batch", "4", "--warmup", "2",
                          "--steps", "2", "--json", str(path)], capture_output=True, text=True, timeout=1500,
                         cwd=ROOT, check=False, env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(path.read_text())
    runs = result["runs"]
    torch_here = runs["torch-train"]["status"] != "skipped"
    for key, r in runs.items():
        if key.startswith("torch") and not torch_here:
            continue
        assert r["status"] == "ok", (key, r.get("reason"), r.get("traceback"))
        assert np.isfinite(r["ms"]) and r["ms"] > 0
    for key in ("dnnbind-train", "dnnbind-train-hybrid") + (("torch-train", "torch-train-amp") if torch_here else ()):
        assert runs[key]["final_loss"] < runs[key]["first_loss"], (key, runs[key])
    eager, hybrid = runs["dnnbind-train"]["first_loss"], runs["dnnbind-train-hybrid"]["first_loss"]
    assert abs(eager - hybrid) < 1e-3 * abs(eager), (eager, hybrid)
    if torch_here:
        assert result["parameter_counts"]["torch"] == result["parameter_counts"]["dnnbind"]
        check = result["weights_check"]
        assert abs(check["loss_dnnbind"] - check["loss_torch"]) < 1e-3 * abs(check["loss_torch"]), check
        assert runs["dnnbind-train"]["vs_torch_same_math"] > 0
