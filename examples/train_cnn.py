"""A CIFAR-10-style CNN classifier, written the way CUDA tutorials write it.

Nothing here knows about DirectML: run it unmodified with
    python -m dmlpatch --device sim examples/train_cnn.py
and it trains on privateuseone:0. Synthetic data stands in for CIFAR-10 (no download).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.bn1 = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    print(f"device: {device}")

    images = torch.randn(args.samples, 3, 32, 32)
    labels = torch.randint(0, 10, (args.samples,))
    loader = DataLoader(
        TensorDataset(images, labels),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
    )

    net = Net()
    if torch.cuda.device_count() > 1:
        print(f"using {torch.cuda.device_count()} GPUs")
        net = nn.DataParallel(net)
    net.to(device)

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, (inputs, targets) in enumerate(loader):
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = criterion(net(inputs), targets)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            if i % 8 == 7:
                print(f"[{epoch + 1}, {i + 1:3d}] loss: {running_loss / 8:.4f}")
                running_loss = 0.0

    print("Finished Training")
    print(f"parameters on: {next(net.parameters()).device}")


if __name__ == "__main__":
    main()
