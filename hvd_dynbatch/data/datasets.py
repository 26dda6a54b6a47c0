"""Datasets by name, as train and test splits that hand out batches by sample index.

* `digits`: the embedded default, `digits.npz` beside this module: the test set of the UCI
  Optical Recognition of Handwritten Digits data (E. Alpaydin and C. Kaynak, 1998, CC BY
  4.0; 1,797 8x8 grey images of pixel counts 0-16, 10 classes), as scikit-learn also ships
  it: real data, no download, read in milliseconds. A fixed seeded split keeps 360 images
  for testing.
* `synthetic`: noise images, 3x32x32 unless `image_size` sets another side, each with a faint
  pattern of its class, so a CNN learns them in a few epochs and accuracy is meaningful; for
  throughput and comparison runs. Larger images come fewer (at least 256 for training), so
  that the set stays near 50 MB in memory: 256 at 224 px, ResNet-50's ImageNet size.
* `imagefolder`: the ImageNet-subset layout (Imagenette and the like): `DATA_DIR/train/CLASS/*`
  and `DATA_DIR/val/CLASS/*`, with the usual ImageNet preprocessing scaled to `image_size`:
  the shorter side resized to 8/7 of it (256 for 224), then a random crop and horizontal flip
  for training and a centre crop for validation, normalised by the ImageNet channel
  statistics. `write_image_folder` generates a small one, so the path runs without a download.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DynBatchError

DATASETS = ("digits", "synthetic", "imagefolder")
SYNTHETIC_SHAPE = (3, 32, 32)      # at the default image size
# The image side of each dataset with an `image_size` when none is given; the digits have none.
IMAGE_SIZES = {"synthetic": 32, "imagefolder": 64}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
# The usual ImageNet channel statistics.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class TensorSplit:
    """A split held in memory as tensors."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def fetch(self, indices: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return self.x[idx], self.y[idx]

    def take_skipped(self) -> int:
        """Samples in memory are always readable: none is ever replaced."""
        return 0


class ImageFolderSplit:
    """Image files in one folder per class, decoded on demand with Pillow.

    `augment`: a random crop and flip per image (training); else a centre crop. A file that
    cannot be decoded raises `DynBatchError` naming it; with `skip_bad`, it is replaced in its
    batch by the next readable sample of the split instead (the batch keeps its size, so the
    step keeps its weight), with one warning per file, and `take_skipped()` counts it.
    """

    def __init__(self, root: Path, image_size: int, augment: bool = False,
                 skip_bad: bool = False):
        classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.files, labels = [], []
        for label, name in enumerate(classes):
            for f in sorted((root / name).iterdir()):
                if f.suffix.lower() in IMAGE_EXTENSIONS:
                    self.files.append(f)
                    labels.append(label)
        if not self.files:
            raise DynBatchError(f"no images under {root} (expected {root}/CLASS/*.jpg)")
        self.classes, self.image_size, self.augment = classes, image_size, augment
        self.skip_bad, self._bad, self._skipped = skip_bad, set(), 0
        self.y = torch.as_tensor(labels, dtype=torch.long)
        self._mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def _load(self, path: Path) -> torch.Tensor:
        try:
            return self._decode(path)
        except Exception as exc:  # Pillow raises several kinds for a broken file
            raise DynBatchError(f"cannot read image {path}: {exc}; replace or remove it, or "
                                f"pass --skip-bad-samples") from None

    def _decode(self, path: Path) -> torch.Tensor:
        from PIL import Image

        size = self.image_size
        with Image.open(path) as img:
            img = img.convert("RGB")
            scale = round(size * 8 / 7) / min(img.size)
            img = img.resize((max(size, round(img.width * scale)),
                              max(size, round(img.height * scale))))
            if self.augment:
                left, top = (int(torch.randint(0, room + 1, ()))
                             for room in (img.width - size, img.height - size))
            else:
                left, top = (img.width - size) // 2, (img.height - size) // 2
            img = img.crop((left, top, left + size, top + size))
            if self.augment and torch.rand(()) < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)
        return (pixels.permute(2, 0, 1) - self._mean) / self._std

    def fetch(self, indices: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        used = [self._readable(int(i)) for i in indices]
        x = torch.stack([image for image, _ in used]) if used else \
            torch.empty(0, 3, self.image_size, self.image_size)
        return x, self.y[torch.as_tensor([i for _, i in used], dtype=torch.int64)]

    def _readable(self, index: int) -> Tuple[torch.Tensor, int]:
        """Sample `index` decoded, or under `skip_bad` the next readable one (and its index)."""
        for tried in range(len(self.files)):
            i = (index + tried) % len(self.files)
            if i in self._bad:
                continue
            try:
                image = self._load(self.files[i])
            except DynBatchError as exc:
                if not self.skip_bad:
                    raise
                self._bad.add(i)
                print(f"hvd-dynbatch: warning: skipping a bad sample: {exc}", file=sys.stderr,
                      flush=True)
                continue
            self._skipped += i != index
            return image, i
        raise DynBatchError(f"no image of {len(self.files)} can be read")

    def take_skipped(self) -> int:
        """Samples replaced since the last call (in this process)."""
        skipped, self._skipped = self._skipped, 0
        return skipped


def write_image_folder(root, classes: int = 10, train_per_class: int = 40,
                       val_per_class: int = 10, size: Tuple[int, int] = (80, 64),
                       seed: int = 0) -> None:
    """Write a small ImageFolder of generated JPEGs under `root`/train and `root`/val.

    Class k's images are a smooth colour pattern of its own, shifted at random, plus noise:
    learnable, but not in one step. `size` is (width, height).
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = size
    yy, xx = np.mgrid[0:2 * height, 0:2 * width] / max(width, height)
    for k in range(classes):
        freq, phase = rng.uniform(1, 4, (2, 3)), rng.uniform(0, 2 * np.pi, 3)
        pattern = np.stack([np.sin(2 * np.pi * (freq[0, c] * xx + freq[1, c] * yy) + phase[c])
                            for c in range(3)], axis=-1)
        for part, count in (("train", train_per_class), ("val", val_per_class)):
            folder = Path(root) / part / f"class{k:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                dy, dx = rng.integers(0, height), rng.integers(0, width)
                image = pattern[dy:dy + height, dx:dx + width]
                image = 127.5 + 80 * image + rng.normal(0, 40, image.shape)
                Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
                    folder / f"{i:04d}.jpg", quality=90)


@dataclass
class Dataset:
    """A train and a test split with the shape of one input and the number of classes."""

    train: object
    test: object
    input_shape: Tuple[int, int, int]
    num_classes: int


def load_dataset(name: str, data_dir: Optional[str] = None, seed: int = 0,
                 image_size: Optional[int] = None, skip_bad: bool = False) -> Dataset:
    """Load dataset `name`; raise `DynBatchError` for an unknown name or a missing folder.
    `skip_bad`: replace training images that cannot be read (see `ImageFolderSplit`)."""
    if name == "digits":
        return _digits()
    if name == "synthetic":
        return _synthetic(seed, image_size or IMAGE_SIZES[name])
    if name == "imagefolder":
        return _imagefolder(data_dir, image_size or IMAGE_SIZES[name], skip_bad)
    raise DynBatchError(f"unknown dataset '{name}'; choose one of {', '.join(DATASETS)}")


def _digits() -> Dataset:
    with np.load(Path(__file__).with_name("digits.npz")) as digits:
        images, labels = digits["images"], digits["labels"]
    x = torch.as_tensor(images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.as_tensor(labels, dtype=torch.long)
    order = torch.as_tensor(np.random.default_rng(12345).permutation(len(y)))
    test, train = order[:360], order[360:]
    return Dataset(TensorSplit(x[train], y[train]), TensorSplit(x[test], y[test]), (1, 8, 8), 10)


def _synthetic(seed: int, side: int, signal: float = 0.25) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    shape, classes = (3, side, side), 10
    train_size = max(256, 4096 * 32 * 32 // (side * side))
    test_size = train_size // 4
    # Each class adds its own smooth pattern (4x4 noise upsampled) to white noise: a CNN
    # learns it in a few epochs, so accuracy means something.
    patterns = F.interpolate(torch.randn(classes, 3, 4, 4, generator=gen), size=shape[1:],
                             mode="bilinear", align_corners=False)
    y = torch.randint(0, classes, (train_size + test_size,), generator=gen)
    x = torch.randn(train_size + test_size, *shape, generator=gen) + signal * patterns[y]
    return Dataset(TensorSplit(x[:train_size], y[:train_size]),
                   TensorSplit(x[train_size:], y[train_size:]), shape, classes)


def _imagefolder(data_dir: Optional[str], image_size: int, skip_bad: bool) -> Dataset:
    if not data_dir:
        raise DynBatchError("dataset 'imagefolder' needs --data-dir")
    root = Path(data_dir)
    for part in ("train", "val"):
        if not (root / part).is_dir():
            raise DynBatchError(f"data directory {root} has no '{part}' folder "
                                f"(expected {root}/train/CLASS/* and {root}/val/CLASS/*)")
    train = ImageFolderSplit(root / "train", image_size, augment=True, skip_bad=skip_bad)
    test = ImageFolderSplit(root / "val", image_size, skip_bad=skip_bad)
    if test.classes != train.classes:
        only = [f"only in {part}: {', '.join(sorted(set(a) - set(b)))}"
                for part, a, b in (("train", train.classes, test.classes),
                                   ("val", test.classes, train.classes)) if set(a) - set(b)]
        raise DynBatchError(f"{root}/train and {root}/val have different class folders "
                            f"({'; '.join(only)})")
    if len(train.classes) < 2:
        raise DynBatchError(f"{root}/train has {len(train.classes)} class folder; a classifier "
                            f"needs at least 2 (one folder per class)")
    return Dataset(train, test, (3, image_size, image_size), len(train.classes))
