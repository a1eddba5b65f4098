"""PyTorch's examples/mnist_hogwild on random data (tests/e2e/test_hogwild.py drives it).

``Net().to(device)``, ``model.share_memory()``, then ``mp.Process`` workers that each train
the one model with their own SGD, and the parent evaluates what they trained. ``--style cuda``
picks the device as the example does (``--cuda`` and ``torch.cuda.is_available()``),
``--style accelerator`` as today's examples do (``torch.accelerator``). ``--lockstep`` makes
the workers take their steps in turn (rank 0, rank 1, rank 0, ...), so that a run with several
workers is deterministic and each step reads the weights every earlier step of every worker
wrote. It prints each step's loss, the parent's loss after training and a digest of the
trained weights.
"""

import argparse
import hashlib

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def random_mnist(count, seed):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(count, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (count,), generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


def train(rank, args, model, device, dataset, dataloader_kwargs, turn, next_rank):
    torch.set_num_threads(1)  # a forked worker's OpenMP pool would wait for the parent's
    torch.manual_seed(args.seed + rank)
    loader = torch.utils.data.DataLoader(dataset, **dataloader_kwargs)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model.train()
    for step, (data, target) in enumerate(loader):
        if args.lockstep:
            with turn:
                turn.wait_for(lambda: next_rank.value == rank)
        optimizer.zero_grad()
        output = model(data.to(device))
        loss = F.nll_loss(output, target.to(device))
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item()!r}", flush=True)
        if args.lockstep:
            with turn:
                next_rank.value = (rank + 1) % args.num_processes
                turn.notify_all()


def digest(model):
    weights = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    return hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]


def pick_device(args):
    if args.style == "accelerator":
        if torch.accelerator.is_available():
            return torch.accelerator.current_accelerator()
        return torch.device("cpu")
    use_cuda = args.cuda and torch.cuda.is_available()
    return torch.device("cuda" if use_cuda else "cpu")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--style", choices=["cuda", "accelerator"], default="cuda")
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--start", choices=["spawn", "fork"], default="spawn")
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    device = pick_device(args)
    dataset = random_mnist(64, seed=0)
    kwargs = {"batch_size": args.batch_size, "shuffle": True}
    if device.type != "cpu":
        kwargs.update({"pin_memory": True})

    torch.manual_seed(args.seed)
    mp.set_start_method(args.start, force=True)
    model = Net().to(device)
    model.share_memory()  # gradients are allocated lazily, so they are not shared here
    before = digest(model)

    turn, next_rank = mp.Condition(), mp.Value("i", 0)
    processes = []
    for rank in range(args.num_processes):
        p = mp.Process(
            target=train, args=(rank, args, model, device, dataset, kwargs, turn, next_rank)
        )
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print("exit codes", [p.exitcode for p in processes])

    model.eval()
    with torch.no_grad():
        images, labels = dataset.tensors
        output = model(images.to(device))
        print(f"parent loss {F.nll_loss(output, labels.to(device)).item()!r}")
        print("parent computed on", output.device)
    print("weights", "trained" if digest(model) != before else "untouched", digest(model))


if __name__ == "__main__":
    main()
