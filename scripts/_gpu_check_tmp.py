import numpy as np, time, dnnbind, dnnbind.trace as trace
rng = np.random.default_rng(0)
g = dnnbind.gpu(0)
x = dnnbind.array(rng.standard_normal((64, 1, 28, 28)).astype(np.float32), device=g)
w = dnnbind.array(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), device=g)
b = dnnbind.array(rng.standard_normal((32,)).astype(np.float32), device=g)
W = dnnbind.array(rng.standard_normal((10, 32 * 26 * 26)).astype(np.float32), device=g)
def step():
    y = dnnbind.activation_forward(dnnbind.conv_forward(x, w, b), "relu")
    return dnnbind.linear_forward(y.reshape((64, -1)), W)
step(); dnnbind.synchronize()
with trace() as t:
    with trace.scope("net"):
        for i in range(2):
            with trace.scope(f"iter{i}"):
                step()
print(t)
t.to_chrome("/tmp/out.json")
# overhead: untraced vs traced per step
for label in ("untraced", "traced"):
    dnnbind.synchronize(); t0 = time.perf_counter()
    if label == "traced":
        with trace() as tt:
            for _ in range(200): step()
    else:
        for _ in range(200): step()
    dnnbind.synchronize(); print(label, f"{(time.perf_counter() - t0) / 200 * 1e6:.1f} us/step")
# graph capture under a trace
from dnnbind.graph import CapturedStep
with trace() as tg:
    cs = CapturedStep(step, inputs=[x])
    cs()
print(tg.summary()["notes"], len(tg.records))
