"""bench/image_folder_torch.py: the PyTorch side of bench/image_folder.lua: torchvision's
ImageFolder (PIL decoding) with RandomResizedCrop(224), RandomHorizontalFlip, ToTensor,
Normalize, through a DataLoader with batch_size 32, shuffle, num_workers W (default 0; one
epoch, threads set by the caller's environment). Prints "samples_per_s N".
Usage: python3 bench/image_folder_torch.py ROOT [W]"""
import sys
import time

import torch
import torchvision
import torchvision.transforms as T

torch.set_num_threads(1)
tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
ds = torchvision.datasets.ImageFolder(sys.argv[1], transform=tf)
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers)
t0 = time.perf_counter()
n = 0
for x, y in loader:
    n += x.shape[0]
print("samples_per_s %.1f" % (n / (time.perf_counter() - t0)))
