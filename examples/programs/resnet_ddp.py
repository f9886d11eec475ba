"""A torchvision ResNet-18 trained data-parallel on a folder of images (write_images.py writes
one), by its own loop, with Trainyard's module: it reports every step, saves where Trainyard says
(every checkpoint.every_steps, and at the step every rank stops at on a notice) and goes on from
what Trainyard restored, so that a preempted run ends exactly as an uninterrupted one would.

Run as a Trainyard job (examples/programs/resnet.yaml), or under torchrun alone:
  torchrun --nproc_per_node 2 resnet_ddp.py --data DIR --steps 60
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torchvision import transforms

import trainyard


def load_images(root):
    """Every image of the folder as one tensor, and its labels: (train, held-out) splits, the
    last tenth of each class held out."""
    folder = torchvision.datasets.ImageFolder(root, transform=transforms.ToTensor())
    images, labels = [], []
    for path, label in folder.samples:
        images.append(folder.transform(folder.loader(path)))
        labels.append(label)
    x, y = torch.stack(images), torch.tensor(labels)
    x = (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)
    held = torch.zeros(len(y), dtype=torch.bool)
    for c in range(len(folder.classes)):
        idx = (y == c).nonzero().flatten()
        held[idx[int(len(idx) * 0.9):]] = True
    return (x[~held], y[~held]), (x[held], y[held]), len(folder.classes)


def resnet18(classes):
    model = torchvision.models.resnet18(num_classes=classes)
    # 32x32 pictures: a 3x3 first convolution and no pooling after it, as for CIFAR.
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


def batch_indices(step, n, batch, rank, world, seed):
    """This rank's samples for `step` (from 1): a permutation per epoch drawn from (seed, epoch)
    alone, so a resumed run takes the same ones."""
    per_epoch = n // batch
    epoch, k = divmod(step - 1, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    global_batch = order[k * batch:(k + 1) * batch]
    return global_batch[rank::world]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    (x, y), (vx, vy), classes = load_images(args.data)
    net = resnet18(classes)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    if trainyard.restore_dir:
        state = torch.load(os.path.join(trainyard.restore_dir, "resnet.pt"))
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        print(f"rank {rank}: resumed from step {trainyard.start_step}", flush=True)

    start = time.monotonic()
    for step in range(trainyard.start_step + 1, args.steps + 1):
        idx = batch_indices(step, len(y), args.batch, rank, world, args.seed)
        model.train()
        out = model(x[idx])
        loss = F.cross_entropy(out, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        seconds = time.monotonic() - start
        start = time.monotonic()
        trainyard.report(step, loss=loss.item(), total_steps=args.steps,
                         samples_per_second=args.batch / seconds,
                         train_accuracy=(out.argmax(1) == y[idx]).float().mean().item())
        if step % 10 == 0 and rank == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
        if trainyard.should_checkpoint(step):
            if rank == 0:
                torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict()},
                           os.path.join(trainyard.checkpoint_dir, "resnet.pt"))
            trainyard.commit_checkpoint(step)
        if trainyard.should_stop(step):
            print(f"rank {rank}: stopping at step {step}, saved", flush=True)
            return

    model.eval()
    with torch.no_grad():
        accuracy = (net(vx).argmax(1) == vy).float().mean().item()
    trainyard.report(args.steps, val_accuracy=accuracy, total_steps=args.steps)
    if rank == 0:
        print(f"held-out accuracy {accuracy:.3f} over {len(vy)} images", flush=True)
        weights = torch.cat([p.detach().flatten() for p in net.parameters()])
        print(f"weights checksum {weights.double().sum().item():.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
