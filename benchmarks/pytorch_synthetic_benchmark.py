"""Horovod's PyTorch synthetic benchmark, for hvdprof: the same flags and the same report.

Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py`` trains a torchvision model
(ResNet-50 by default, ``hvd.SyncBatchNorm`` as its norm layer) with
``hvd.DistributedOptimizer`` on one fixed random batch, times ``--num-iters`` iterations of
``--num-batches-per-iter`` batches each after ``--num-warmup-batches``, and prints each
iteration's images per second and their mean with a 1.96-sigma band. It is what people run
to compare Horovod setups, tuned or not. This is the same benchmark written for hvdprof
(``import hvdprof.torch as hvd``), with the same flags and output lines, so that its
numbers read as Horovod's do. Differences, each because of the 2-core CPU machines the
project is measured on:

* ``--model`` defaults to ``small_resnet``, a residual conv net defined here (a ResNet-50
  step takes seconds on two cores, and the torchvision wheel for the project's torch does
  not import). Any ``torchvision.models`` name works where torchvision does.
* ``--image-size`` (default 64; Horovod's images are 224 x 224) and smaller batch
  defaults.
* ``--autotune`` (and ``--autotune-log-file``): what ``horovodrun --autotune`` does,
  here ``HVDPROF_AUTOTUNE=1`` set before ``hvd.init()``; ``hvdprof run --autotune`` does the
  same from outside.

    hvdprof run -np 2 -- python benchmarks/pytorch_synthetic_benchmark.py [--autotune]

``benchmarks/synthetic_autotune.py`` runs it with and without ``--autotune``, interleaved.
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable
from typing import Any


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="PyTorch synthetic benchmark (hvdprof)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce"
    )
    p.add_argument("--model", default="small_resnet", help="model to benchmark")
    p.add_argument("--batch-size", type=int, default=16, help="input batch size")
    p.add_argument(
        "--num-warmup-batches",
        type=int,
        default=5,
        help="number of warm-up batches that don't count towards benchmark",
    )
    p.add_argument(
        "--num-batches-per-iter", type=int, default=10, help="number of batches per iteration"
    )
    p.add_argument("--num-iters", type=int, default=40, help="number of benchmark iterations")
    p.add_argument("--no-cuda", action="store_true", help="disables CUDA training")
    p.add_argument("--use-adasum", action="store_true", help="use adasum algorithm to do reduction")
    p.add_argument(
        "--autotune", action="store_true", help="tune the runtime while training (HVDPROF_AUTOTUNE)"
    )
    p.add_argument(
        "--autotune-log-file", default="", help="autotune log (HVDPROF_AUTOTUNE_LOG), CSV"
    )
    p.add_argument("--image-size", type=int, default=64, help="height and width of the images")
    return p.parse_args(argv)


def small_resnet(norm_layer: Callable[[int], Any], num_classes: int = 1000) -> Any:
    """A stem, two residual stages and a 1000-way head: about 0.6 M parameters in 17
    tensors, a step of tens of milliseconds on two cores at batch 16, 64 x 64."""
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, channels: int, stride: int) -> None:
            super().__init__()
            inner = channels * stride
            self.conv1 = nn.Conv2d(channels, inner, 3, stride=stride, padding=1, bias=False)
            self.norm1 = norm_layer(inner)
            self.conv2 = nn.Conv2d(inner, inner, 3, padding=1, bias=False)
            self.norm2 = norm_layer(inner)
            self.skip = (
                nn.Identity()
                if stride == 1
                else nn.Conv2d(channels, inner, 1, stride=stride, bias=False)
            )

        def forward(self, x: Any) -> Any:
            y = self.conv1(x).relu()
            y = self.norm2(self.conv2(self.norm1(y)))
            return (y + self.skip(x)).relu()

    return nn.Sequential(
        nn.Conv2d(3, 32, 5, stride=2, padding=2, bias=False),
        norm_layer(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        Residual(32, 1),
        Residual(32, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def build_model(name: str, norm_layer: Callable[[int], Any]) -> Any:
    if name == "small_resnet":
        return small_resnet(norm_layer)
    try:
        from torchvision import models
    except Exception as exc:  # the wheel may be missing or not match torch
        raise SystemExit(
            f"--model {name}: torchvision is not usable here ({exc}); use --model small_resnet"
        ) from None
    if not hasattr(models, name):
        raise SystemExit(f"--model {name}: torchvision.models has no such model")
    return getattr(models, name)(norm_layer=norm_layer)


def main(argv: list[str] | None = None) -> None:
    args = options(argv)
    if args.autotune:  # before init: the runtime reads its configuration there
        os.environ["HVDPROF_AUTOTUNE"] = "1"
    if args.autotune_log_file:
        os.environ["HVDPROF_AUTOTUNE_LOG"] = args.autotune_log_file

    import numpy as np
    import torch
    import torch.nn.functional as F

    import hvdprof.torch as hvd

    use_cuda = not args.no_cuda and torch.cuda.is_available()
    hvd.init()
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True

    model = build_model(args.model, hvd.SyncBatchNorm)
    # Adasum needs no learning-rate scaling; the average does (Horovod's rule)
    lr_scaler = 1 if args.use_adasum else hvd.size()
    if use_cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    side = args.image_size
    data = torch.randn(args.batch_size, 3, side, side)
    target = torch.randint(0, 1000, (args.batch_size,))
    if use_cuda:
        data, target = data.cuda(), target.cuda()

    def train_one_batch() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def say(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    device = "GPU" if use_cuda else "CPU"
    say(f"Model: {args.model}")
    say(f"Batch size: {args.batch_size}")
    say(f"Number of {device}s: {hvd.size()}")
    say("Running warmup...")
    timeit.timeit(train_one_batch, number=args.num_warmup_batches)
    say("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(train_one_batch, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        say(f"Iter #{i}: {rate:.1f} img/sec per {device}")
        rates.append(rate)
    mean, band = float(np.mean(rates)), 1.96 * float(np.std(rates))
    say(f"Img/sec per {device}: {mean:.1f} +-{band:.1f}")
    size = hvd.size()
    say(f"Total img/sec on {size} {device}(s): {size * mean:.1f} +-{size * band:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
