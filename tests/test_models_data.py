"""Models by name and datasets by name, including an ImageFolder written on the spot."""
import pytest
import torch

from hvd_dynbatch.data.datasets import load_dataset, write_image_folder
from hvd_dynbatch.data.loader import BatchLoader
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.training.models import MODELS, build_model, least_batch
from evaluation import top1_top5
from launcher import train_one_process


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 64, 64)])
def test_every_model_maps_a_batch_to_class_scores(name, shape):
    model = build_model(name, shape, 7)
    assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_unknown_model_names_the_choices():
    with pytest.raises(DynBatchError, match="unknown model 'vgg'; choose one of linear"):
        build_model("vgg", (1, 8, 8), 10)


def test_digits_is_the_real_uci_set_split_for_testing():
    data = load_dataset("digits")
    assert len(data.train) + len(data.test) == 1797 and len(data.test) == 360
    x, y = data.train.fetch([0, 5, 9])
    assert x.shape == (3, 1, 8, 8) and 0 <= x.min() and x.max() <= 1
    assert set(data.test.y.tolist()) == set(range(10))


def test_synthetic_images_come_at_the_size_asked_for_and_fewer_when_large():
    small, large = load_dataset("synthetic"), load_dataset("synthetic", image_size=224)
    assert (small.input_shape, len(small.train), len(small.test)) == ((3, 32, 32), 4096, 1024)
    # ResNet-50's ImageNet size: 256 training images, 154 MB, not 4,096 (2.5 GB).
    assert (large.input_shape, len(large.train), len(large.test)) == ((3, 224, 224), 256, 64)
    x, _ = large.train.fetch([0, 255])
    assert x.shape == (2, 3, 224, 224)


def test_synthetic_labels_are_learnable_and_seeded():
    a, b = load_dataset("synthetic", seed=1), load_dataset("synthetic", seed=1)
    assert torch.equal(a.train.y, b.train.y)
    assert len(set(a.train.y.tolist())) > 5


def test_imagefolder_is_resized_cropped_and_labelled(tmp_path):
    write_image_folder(tmp_path, classes=2, train_per_class=6, val_per_class=6, size=(20, 14))
    data = load_dataset("imagefolder", str(tmp_path), image_size=12)
    assert data.input_shape == (3, 12, 12) and data.num_classes == 2
    x, y = data.train.fetch([0, 11])
    assert x.shape == (2, 3, 12, 12) and y.tolist() == [0, 1]
    # Validation crops are fixed; training crops and flips vary between fetches.
    assert torch.equal(data.test.fetch([3])[0], data.test.fetch([3])[0])
    assert any(not torch.equal(data.train.fetch([3])[0], data.train.fetch([3])[0])
               for _ in range(10))


def test_loader_workers_fetch_what_the_split_gives(tmp_path):
    write_image_folder(tmp_path, classes=3, train_per_class=4, val_per_class=4, size=(16, 16))
    split = load_dataset("imagefolder", str(tmp_path), image_size=12).test
    loader = BatchLoader(split, workers=2)
    indices = [7, 0, 11, 3, 5]
    x, y = loader.fetch(indices)
    expected_x, expected_y = split.fetch(indices)
    assert torch.equal(x, expected_x) and torch.equal(y, expected_y)
    assert loader.fetch([2])[0].shape == (1, 3, 12, 12)


def test_imagefolder_without_a_val_folder_is_a_clear_error(tmp_path):
    (tmp_path / "train" / "a").mkdir(parents=True)
    with pytest.raises(DynBatchError, match="has no 'val' folder"):
        load_dataset("imagefolder", str(tmp_path))


def test_imagefolder_class_mismatch_names_the_folders_and_one_class_is_refused(tmp_path):
    write_image_folder(str(tmp_path / "two"), classes=3, train_per_class=1, val_per_class=1)
    for name in ("class01", "class02"):
        (tmp_path / "two" / "val" / name).rename(tmp_path / "two" / "val" / f"x{name}")
    with pytest.raises(DynBatchError, match="only in train: class01, class02; only in val: "
                                            "xclass01, xclass02"):
        load_dataset("imagefolder", str(tmp_path / "two"))
    write_image_folder(str(tmp_path / "one"), classes=1, train_per_class=1, val_per_class=1)
    with pytest.raises(DynBatchError, match="has 1 class folder; a classifier needs at least 2"):
        load_dataset("imagefolder", str(tmp_path / "one"))


def train_on_image_folder(tmp_path, folder: dict, options: list) -> tuple:
    """Write a generated ImageFolder, train one rank on it for 2 epochs of batch 4, and
    return the run's summary and its saved weights."""
    write_image_folder(tmp_path / "data", **folder)
    weights, records = train_one_process(["--dataset", "imagefolder", "--data-dir",
                                          str(tmp_path / "data"), "--global-batch", "4",
                                          "--epochs", "2", *options], tmp_path)
    return records[-1], weights


@pytest.mark.processes
def test_training_on_an_imagefolder_end_to_end(tmp_path):
    summary, weights = train_on_image_folder(
        tmp_path, dict(classes=6, train_per_class=2, val_per_class=2, size=(20, 14)),
        ["--image-size", "16", "--model", "cnn", "--loader-workers", "2"])
    assert summary["steps"] == 6 and summary["samples"] == 24
    # The reported accuracies are the saved model's on the centre-cropped validation images.
    data = load_dataset("imagefolder", str(tmp_path / "data"), image_size=16)
    top1, top5 = top1_top5(weights, "cnn", data)
    assert (summary["final_accuracy"], summary["final_top5"]) == pytest.approx((top1, top5))


def test_batch_norm_models_need_two_samples():
    assert least_batch(build_model("resnet18", (3, 16, 16), 4)) == 2
    assert least_batch(build_model("cnn", (3, 16, 16), 4)) == 1


@pytest.mark.processes
def test_a_batch_norm_model_never_trains_on_one_sample(tmp_path):
    """13 images in batches of 4 leave one for the epoch's last step: skipped, not a crash."""
    summary, _ = train_on_image_folder(
        tmp_path, dict(classes=13, train_per_class=1, val_per_class=1, size=(16, 16)),
        ["--image-size", "8", "--model", "resnet18"])
    assert summary["steps"] == 6 and summary["samples"] == 24
