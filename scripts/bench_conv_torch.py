"""Scratch benchmark: the same ResNet-20 (CIFAR) in PyTorch eager on CPU, batch 128.

Usage: python scripts/bench_conv_torch.py [--batch 128] [--reps 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn as tnn
import torch.nn.functional as F


class Block(tnn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = tnn.BatchNorm2d(cout)
        self.c2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = tnn.BatchNorm2d(cout)
        self.sc = None
        if stride != 1 or cin != cout:
            self.sc = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.sc is None else self.sc(x)))


class ResNet20(tnn.Module):
    def __init__(self):
        super().__init__()
        self.c = tnn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.b = tnn.BatchNorm2d(16)
        layers, cin = [], 16
        for i, f in enumerate((16, 32, 64)):
            for j in range(3):
                layers.append(Block(cin, f, 2 if (i > 0 and j == 0) else 1))
                cin = f
        self.layers = tnn.Sequential(*layers)
        self.fc = tnn.Linear(64, 10)

    def forward(self, x):
        x = self.layers(F.relu(self.b(self.c(x))))
        return self.fc(x.mean((2, 3)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--channels-last", action="store_true")
    a = p.parse_args()
    m = ResNet20()
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.batch,))
    if a.channels_last:
        m = m.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), y).backward()
        opt.step()

    def fwd():
        with torch.no_grad():
            m(x)

    m.eval(); fwd(); fwd()
    tf = []
    for _ in range(a.reps):
        t = time.perf_counter(); fwd(); tf.append(time.perf_counter() - t)
    m.train(); step(); step()
    ts = []
    for _ in range(a.reps):
        t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
    f, s = np.median(tf), np.median(ts)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} B={a.batch} cl={a.channels_last} | "
          f"fwd {f*1e3:7.1f} ms ({a.batch/f:6.0f} img/s) | step {s*1e3:7.1f} ms (min {min(ts)*1e3:6.1f}) "
          f"{a.batch/s:6.1f} img/s | step/fwd {s/f:.2f}", flush=True)


if __name__ == "__main__":
    main()
