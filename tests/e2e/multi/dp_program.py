"""A CUDA-style DataParallel training loop (tests/e2e/multi drives it).

Run under dmlpatch it trains on the DirectML adapters dmlpatch selected. With
``--reference N`` it runs on the CPU and computes what DataParallel over N devices computes:
the model applied to each of the N chunks of the batch (BatchNorm sees each chunk's own
statistics), the outputs concatenated, one backward through all of it.
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reference", type=int, default=0)
    parser.add_argument("--always-wrap", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = Net()
    if args.always_wrap or torch.cuda.device_count() > 1:
        net = nn.DataParallel(net)
    net = net.to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(args.steps):
        images = torch.randn(16, 3, 14, 14, generator=data).to(device)
        labels = torch.randint(0, 10, (16,), generator=data).to(device)
        optimizer.zero_grad()
        if args.reference:
            outputs = torch.cat([net(chunk) for chunk in images.chunk(args.reference)])
        else:
            outputs = net(images)
        loss = F.cross_entropy(outputs, labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    module = net.module if isinstance(net, nn.DataParallel) else net
    print(
        json.dumps(
            {
                "wrapped": isinstance(net, nn.DataParallel),
                "device_count": torch.cuda.device_count(),
                "device": str(next(module.parameters()).device),
                "losses": losses,
                "parameters": [p.detach().cpu().flatten().tolist() for p in module.parameters()],
            }
        )
    )


if __name__ == "__main__":
    main()
