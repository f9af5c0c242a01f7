"""Train the seeds' SimpleCNN (or d2l-zh's ResNet-18) on MNIST with dnnbind: cuDNN/cuBLAS on the GPU, or the
numpy backend on the CPU; on several GPUs with one process each.

    python scripts/train.py                      # 1 epoch, GPU if there is one
    python scripts/train.py --epochs 10 --save runs/mnist.ckpt
    python scripts/train.py --resume runs/mnist.ckpt --epochs 12
    python scripts/train.py --model resnet18 --lr 0.05
    python -m dnnbind.launch --nproc-per-node 2 scripts/train.py --model resnet18   # data parallel, 2 GPUs

Under the launcher (WORLD_SIZE > 1) each process trains on gpu(LOCAL_RANK) on its share of the training set
(DistributedSampler), the Trainer sums the gradients of all processes every step (NCCL), and rank 0 alone prints,
evaluates and writes metrics and checkpoints. --batch-size is per process: a step sees WORLD_SIZE times as many
images, and trainer.step gets that global batch, so the update is the mean gradient over all of them.

Flags follow PyTorch's MNIST example. Checkpoints are one file, written atomically (temp file + rename):
parameters, optimizer state, epoch, step within the epoch, and RNG state; the data order of an epoch is a
function of (seed, epoch), so a resumed run sees the same batches as an uninterrupted one.
"""

import argparse
import csv
import io
import json
import math
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dnnbind as mx  # noqa: E402
from dnnbind import autograd, distributed, gluon, serialization  # noqa: E402
from dnnbind.gluon.utils import atomic_savez  # noqa: E402
from dnnbind.gluon.data import DeviceDataLoader, DistributedSampler  # noqa: E402
from dnnbind.gluon.data.vision import MNIST  # noqa: E402
from models.simple_cnn import SimpleCNN  # noqa: E402

# Defaults (the seeds' and FACTS.md's setting)
EPOCHS = 1            # one epoch reaches ~98.3% test accuracy; 10 reach ~99.1%
MODELS = ("simplecnn", "resnet18")
BATCH_SIZE = 64
LR = 0.01
MOMENTUM = 0.9
LOG_INTERVAL = 100    # steps between progress-bar refreshes of loss and images/s
OUT_DIR = "runs"      # metrics CSV/JSON and the loss/accuracy plot


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train SimpleCNN or ResNet-18 on MNIST with dnnbind")
    p.add_argument("--model", choices=sorted(MODELS), default="simplecnn",
                   help="simplecnn: the seeds' model; resnet18: d2l-zh v1's ResNet-18 (1 channel, 10 classes)")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--momentum", type=float, default=MOMENTUM)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    p.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (default: searched)")
    p.add_argument("--save", default=None, help="checkpoint file written at each epoch end and on Ctrl-C")
    p.add_argument("--resume", default=None, help="checkpoint file to continue from")
    p.add_argument("--limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--resize", type=int, default=0, metavar="N",
                   help="resize the images to N x N first (bilinear; d2l trains its ResNet-18 on 96 x 96)")
    p.add_argument("--log-interval", type=int, default=LOG_INTERVAL)
    p.add_argument("--tf32", action="store_true", help="allow TF32 tensor cores (default: strict FP32)")
    p.add_argument("--out-dir", default=OUT_DIR)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs a line per interval)")
    static = p.add_mutually_exclusive_group()
    static.add_argument("--graph", action="store_true", help="capture the training step as one CUDA graph (GPU, SGD)")
    static.add_argument("--record", action="store_true",
                        help="record the training step's library calls once and replay them from the host, "
                             "no CUDA graph (GPU, SGD)")
    p.add_argument("--trace", action="store_true",
                   help="trace one full training step (every cuDNN/cuBLAS call and kernel), print it, and exit")
    return p.parse_args(argv)


def build_model(name):
    """(model, initializer). SimpleCNN starts from PyTorch's default init (the accuracy anchors' start); ResNet-18
    is d2l_compare.py's (resnet.md's, 7x7 stem) with the book's Xavier init, built there once for both scripts."""
    if name == "simplecnn":
        return SimpleCNN(fuse_relu=True), mx.init.TorchDefault()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import d2l_compare  # NOTE: installs the mxnet alias (default device cpu(0)); every array here names its device
    return d2l_compare.SPECS["resnet"].build_mx(), d2l_compare.INIT()


def resized(images, size, chunk=10000):
    """(N, H, W, 1) uint8 images as (N, size, size, 1) uint8, bilinear as d2l's ``Resize(96)``: OpenCV's resize
    where OpenCV is installed (what MXNet resizes with; ~1 s for MNIST), else gluon's transforms.Resize (the same
    pixel-centre rule in numpy, a chunk at a time so its float intermediate stays small; ~40 s on 2 cores)."""
    try:
        import cv2
    except ImportError:
        from dnnbind.gluon.data.vision import transforms
        resize = transforms.Resize(size)
        return np.concatenate([resize(images[i:i + chunk]) for i in range(0, len(images), chunk)])
    out = np.empty((len(images), size, size, 1), np.uint8)
    for i, im in enumerate(images):
        out[i, :, :, 0] = cv2.resize(im[:, :, 0], (size, size), interpolation=cv2.INTER_LINEAR)
    return out


def pick_device(choice, world=1):
    if world > 1:  # one process per GPU under python -m dnnbind.launch
        if choice == "cpu" or mx.num_gpus() == 0:
            raise SystemExit(f"cannot train on the cpu in a launched world of {world} processes: gradients are "
                             f"summed with NCCL, which needs one GPU per process ({mx.num_gpus()} usable here)")
        return mx.gpu(distributed.local_rank())
    if choice == "cpu" or (choice == "auto" and mx.num_gpus() == 0):
        if choice == "auto":
            print(f"no GPU ({mx.runtime.gpu_status()[1]}): training on the CPU numpy backend")
        return mx.cpu()
    return mx.gpu(0)


def evaluate(net, images, labels, device, batch_size):
    """Test loss and accuracy, batch by batch, without recording."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    total_loss, correct = 0.0, 0
    for i in range(0, len(labels), batch_size):
        x = mx.array(images[i:i + batch_size], device=device)
        y = mx.array(labels[i:i + batch_size], device=device)
        out = net(x)
        total_loss += float(loss_fn(out, y).sum().item())
        correct += int((out.numpy().argmax(axis=1) == labels[i:i + batch_size]).sum())
    return total_loss / len(labels), correct / len(labels)


def model_params(net) -> dict:
    """collect_params() keyed without the model's own prefix (MXNet's ``strip_prefix``): names are given per
    process (simplecnn0_, simplecnn1_, ...), so a model built second in a process must still read a checkpoint
    written by one built first."""
    n = len(net.prefix)
    return {k[n:] if k.startswith(net.prefix) else k: v for k, v in net.collect_params().items()}


def save_checkpoint(path, net, trainer, epoch, step, history, args):
    """One npz file, atomically (temp file in the same folder, fsync, rename): a crash mid-write leaves the previous
    checkpoint intact, and a failed write leaves no temp file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    arrays = {f"param/{k}": v.data().numpy() for k, v in model_params(net).items()}
    states = io.BytesIO()
    trainer.save_states(states)  # the optimizer state goes inside this file: no second file to keep in step
    meta = {"epoch": epoch, "step": step, "history": history, "args": vars(args),
            "np_rng": np.random.get_state()[1].tolist()}
    arrays["trainer_states"] = np.frombuffer(states.getvalue(), np.uint8)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    atomic_savez(path, arrays)


def load_checkpoint(path, net, trainer, device, model=None):
    """Restore a save_checkpoint file into net and trainer; returns its meta. Everything is checked before anything
    changes: a corrupt or truncated file, or one for another model, is one ValueError naming the file."""
    z = serialization.load_npz(path)  # damage of any kind: a ValueError naming the file
    try:
        meta = json.loads(bytes(z["meta"]).decode())
        if not (isinstance(meta, dict) and all(isinstance(meta.get(k), int) and meta[k] >= 0 for k in ("epoch", "step"))
                and isinstance(meta.get("history"), list) and isinstance(meta.get("args"), dict)):
            raise ValueError("expected epoch, step, history and args")
    except (KeyError, ValueError) as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise ValueError(f"{path}: not a train.py checkpoint, or its meta entry is damaged ({exc})") from None
    saved_model = meta["args"].get("model", "simplecnn")
    if model is not None and saved_model != model:
        raise ValueError(f"{path}: a checkpoint of --model {saved_model}, not --model {model}")
    params = model_params(net)
    problems = [f"no parameter {k}" for k in params if f"param/{k}" not in z]
    problems += [f"parameter {k[6:]} is not in this model" for k in z if k.startswith("param/") and k[6:] not in params]
    problems += [f"{k} has shape {z[f'param/{k}'].shape} in the file, {v.shape} in the model"
                 for k, v in params.items() if f"param/{k}" in z and z[f"param/{k}"].shape != v.shape]
    if "trainer_states" not in z:
        problems.append("no trainer_states entry")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError(f"{path}: not a checkpoint of this model: {'; '.join(problems[:5])}{more}")
    states = io.BytesIO(z["trainer_states"].tobytes())
    states.name = f"{path} (its trainer_states entry)"
    trainer.load_states(states)  # checks before it changes the Trainer
    for k, v in params.items():
        v.set_data(mx.array(z[f"param/{k}"], device=device))
    return meta


def write_metrics(out_dir, history):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(history, f, indent=1)
    if history:
        with open(os.path.join(out_dir, "metrics.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(history[0]))
            w.writeheader()
            w.writerows(history)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ep = [h["epoch"] for h in history]
    a1.plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    a1.plot(ep, [h["test_loss"] for h in history], "o-", label="test")
    a1.set_xlabel("epoch"), a1.set_ylabel("loss"), a1.legend()
    a2.plot(ep, [100 * h["test_acc"] for h in history], "o-", color="C2")
    a2.set_xlabel("epoch"), a2.set_ylabel("test accuracy (%)")
    fig.suptitle("dnnbind SimpleCNN on MNIST")
    fig.tight_layout()
    png = os.path.join(out_dir, "metrics.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


class NaNLoss(RuntimeError):
    pass


def static_step(net, trainer, loss_fn, args, device):
    """The training step recorded once over fixed input buffers and replayed per batch (dnnbind.graph)."""
    from dnnbind.graph import training_step
    flag, replay = ("--graph", "graph") if args.graph else ("--record", "host")
    if not device.is_gpu or args.optimizer != "sgd":
        raise SystemExit(f"{flag} needs a GPU and --optimizer sgd (Adam's step-dependent lr is not recorded)")
    t0 = time.perf_counter()
    step = training_step(net, loss_fn, trainer, (args.batch_size, 1, 28, 28), replay=replay, device=device)
    what = "as one CUDA graph" if replay == "graph" else "as its library calls, replayed from the host"
    print(f"recorded the training step {what} in {time.perf_counter() - t0:.2f} s")
    return step


def trace_one_step(net, trainer, loss_fn, loader, args, device):
    """The seeds' walk-through, measured: every library call of one step, with its scope and GPU time."""
    loader.reset(1)
    batches = iter(loader)
    for _ in range(3):  # warm-up: conv algorithms chosen, kernels compiled, memory pool warm
        data, label = next(batches)
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(data.shape[0])
    mx.synchronize(device)
    data, label = next(batches)
    with mx.trace() as t:
        with autograd.record():
            output = net(data)
            loss = loss_fn(output, label)
        loss.backward()
        trainer.step(data.shape[0])
    print(t.table())
    os.makedirs(args.out_dir, exist_ok=True)
    t.to_json(os.path.join(args.out_dir, "trace.json"))
    t.to_chrome(os.path.join(args.out_dir, "trace_chrome.json"))
    print(f"wrote {args.out_dir}/trace.json and {args.out_dir}/trace_chrome.json (open in ui.perfetto.dev)")
    return t


def main(argv=None):
    args = parse_args(argv)
    # Launched (dnnbind.launch, torchrun, mpirun or srun with more than one process): meet the other processes;
    # rank 0 alone talks and writes files.
    world = distributed.placement().world_size
    if world > 1:
        if args.graph or args.record or args.trace:
            raise SystemExit("--graph, --record and --trace run in a single process, not under dnnbind.launch")
        distributed.init()
    lead = world == 1 or distributed.rank() == 0
    if not lead:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - kept open: the other ranks' logs would repeat rank 0's
        args.save, args.no_progress = None, True
    device = pick_device(args.device, world)
    mx.set_math_mode("tf32" if args.tf32 else "fp32")
    np.random.seed(args.seed)  # the same on every rank: the same initial weights (the Trainer broadcasts rank 0's)

    # Data: the whole set lives on the device; each epoch is one shuffled upload, each batch a view.
    train_set, test_set = MNIST(root=args.data_dir, train=True), MNIST(root=args.data_dir, train=False)
    images, labels = train_set.data, train_set.label
    if args.limit:
        images, labels = images[:args.limit], labels[:args.limit]
    if world > 1:  # this rank's share: disjoint, the same size on every rank (so all take the same steps)
        share = np.fromiter(DistributedSampler(len(labels), world, distributed.rank(), seed=args.seed), np.int64)
        images, labels = images[share], labels[share]
    test_images = test_set.data
    if args.resize:  # once, on the host, before the upload: the loader then serves N x N batches
        images, test_images = resized(images, args.resize), resized(test_images, args.resize)
    loader = DeviceDataLoader(images, labels, args.batch_size, device, shuffle=True, seed=args.seed)
    test_x = test_images.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    test_y = test_set.label.astype(np.int32)

    net, init = build_model(args.model)
    net.initialize(init, ctx=device)
    net(mx.array(test_x[:2], device=device))  # deferred shapes resolved now, so the Trainer packs every param
    opt_params = {"learning_rate": args.lr, "wd": args.weight_decay}
    if args.optimizer == "sgd":
        opt_params["momentum"] = args.momentum
    try:
        trainer = gluon.Trainer(net.collect_params(), args.optimizer, opt_params)
    except (TypeError, ValueError) as exc:  # NaN, inf or out-of-range --lr, --momentum, --weight-decay
        raise SystemExit(f"bad optimizer setting: {exc}") from None
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    if args.trace:
        return trace_one_step(net, trainer, loss_fn, loader, args, device)

    start_epoch, skip_steps, history = 1, 0, []
    if args.resume:
        try:
            meta = load_checkpoint(args.resume, net, trainer, device, args.model)
        except (OSError, ValueError) as exc:  # one line, no traceback: the message names the file and the problem
            raise SystemExit(f"cannot resume: {exc}") from None
        start_epoch, skip_steps, history = meta["epoch"], meta["step"], meta["history"]
        if skip_steps == 0:  # saved at an epoch end: continue with the next one
            start_epoch += 1
        if start_epoch > args.epochs:
            done = meta["epoch"] if skip_steps == 0 else meta["epoch"] - 1
            print(f"nothing to do: {args.resume} has finished {done} epoch{'s' * (done != 1)} and --epochs is "
                  f"{args.epochs}; pass --epochs {start_epoch} or more to train further")
            return history
        print(f"resumed from {args.resume}: epoch {start_epoch}, step {skip_steps}")

    where = f"{world} processes, {device} each" if world > 1 else f"{device}"
    print(f"training {args.model} on {where} ({mx.math_mode()}), {len(labels) * world} images, batch "
          f"{args.batch_size}{' per process' if world > 1 else ''}, {args.optimizer} lr {args.lr}")
    recorded = static_step(net, trainer, loss_fn, args, device) if args.graph or args.record else None
    state = {"epoch": start_epoch, "step": skip_steps}
    interrupted, png = False, None

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True  # finish the current step, then save and stop

    old_handler = signal.signal(signal.SIGINT, on_sigint)
    try:
        for epoch in range(start_epoch, args.epochs + 1):
            state["epoch"] = epoch
            loader.reset(epoch)
            steps = len(loader)
            bar = None
            if not args.no_progress:
                try:
                    from tqdm import tqdm
                    bar = tqdm(total=steps, desc=f"epoch {epoch}", unit="step", leave=True, dynamic_ncols=True)
                except ImportError:
                    bar = None
            t0, seen, loss_sum, loss_count = time.perf_counter(), 0, None, 0
            for step, (data, label) in enumerate(loader):
                if step < skip_steps:  # resuming mid-epoch: these batches were already trained on
                    continue
                if recorded is not None:
                    # the whole step recorded once: stage the batch into its input buffers and replay
                    loss = recorded(data, label)
                else:
                    # forward and loss, taped
                    with autograd.record():
                        output = net(data)
                        loss = loss_fn(output, label)
                    # backward through cuDNN/cuBLAS backward calls, then one fused update over the flat buffers
                    loss.backward()
                    # the gradients of every process are summed: divide by the batch of the whole world
                    trainer.step(batch_size=data.shape[0] * world)
                # running loss stays on the device; read it back only at log points (a sync costs a step)
                batch_loss = loss.sum()
                loss_sum = batch_loss if loss_sum is None else loss_sum + batch_loss
                loss_count += data.shape[0]
                seen += data.shape[0]
                state["step"] = step + 1
                if (step + 1) % args.log_interval == 0 or step + 1 == steps:
                    mean = float(loss_sum.item()) / loss_count
                    if not math.isfinite(mean):
                        raise NaNLoss(f"loss became {mean} at epoch {epoch} step {step + 1}: try a smaller --lr")
                    rate = seen / (time.perf_counter() - t0)
                    if bar is not None:
                        bar.set_postfix(loss=f"{mean:.4f}", img_s=f"{rate:,.0f}")
                        bar.update((step + 1) - bar.n)
                    else:
                        print(f"epoch {epoch} step {step + 1}/{steps} loss {mean:.4f} {rate:,.0f} img/s")
                    train_loss, loss_sum, loss_count = mean, None, 0
                if interrupted:
                    break
            if bar is not None:
                bar.close()
            if interrupted:
                print("interrupted: saving checkpoint" if args.save else "interrupted")
                if args.save:
                    save_checkpoint(args.save, net, trainer, epoch, state["step"], history, args)
                return history
            skip_steps = 0
            epoch_time = time.perf_counter() - t0
            if not lead:
                continue  # rank 0 evaluates and writes; the others go on (NCCL waits for them at the next step)
            test_loss, test_acc = evaluate(net, test_x, test_y, device, args.test_batch_size)
            history.append({"epoch": epoch, "train_loss": train_loss, "test_loss": test_loss, "test_acc": test_acc,
                            "epoch_seconds": epoch_time, "images_per_second": seen / epoch_time})
            print(f"epoch {epoch}: test loss {test_loss:.4f}, test accuracy {100 * test_acc:.2f}%, "
                  f"{epoch_time:.2f} s ({seen / epoch_time:,.0f} img/s)")
            if args.save:
                save_checkpoint(args.save, net, trainer, epoch, 0, history, args)
            png = write_metrics(args.out_dir, history)
        if history:
            print(f"metrics: {os.path.join(args.out_dir, 'metrics.csv')}" + (f", plot: {png}" if png else ""))
    except NaNLoss as exc:
        print(f"stopping: {exc}", file=sys.stderr)
        raise SystemExit(2)
    finally:
        signal.signal(signal.SIGINT, old_handler)
    return history


if __name__ == "__main__":
    main()
