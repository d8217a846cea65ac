"""The trained digit classifiers: committed weights reproduce the manifest's
accuracies, export, and retraining reproduces the committed weights bit for bit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from codec_tosa_examples.models import BUILTIN_MODELS, load_model
from codec_tosa_examples.models import trained
from codec_tosa_examples.models.trained import train as train_script
from codec_tosa_examples.models.trained.reproduce import cpu_kind, expected_digests

MANIFEST = trained.manifest()
ENTRIES: dict[str, dict] = MANIFEST["models"]

# Retrained in full by the test; the others retrain their first epoch only.
FULL_RETRAIN = "digits_mobilenet"
# Kernels round differently per kind of CPU (capability and vendor): retraining is
# checked against the digests recorded for this machine's kind (trained/reproduce.py)
CPU_KIND = cpu_kind()


def _expected(name: str, epochs: int) -> list[str]:
    digests = expected_digests(ENTRIES[name], CPU_KIND)
    assert digests is not None and len(digests) >= epochs, (
        f"{name}: no digests of {epochs} epoch(s) recorded for a {CPU_KIND} CPU (weights trained on "
        f"{ENTRIES[name]['cpu_capability']}); run `python -m codec_tosa_examples.models.trained.reproduce`")
    return digests[:epochs]


@pytest.fixture
def one_thread() -> Iterator[None]:
    # The manifest's accuracies were computed on one thread; kernels for other
    # thread counts may round differently and flip a borderline argmax.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_manifest_lists_every_model_and_its_weights() -> None:
    assert tuple(ENTRIES) == trained.MODELS
    for name, entry in ENTRIES.items():
        path = trained.WEIGHTS_DIR / f"{name}.pt"
        assert train_script.file_sha256(path) == entry["weights_sha256"], f"{path} is not the file the manifest describes"
        assert entry["epoch_digests"][-1] == entry["state_dict_sha256"]
        assert len(entry["epoch_digests"]) == entry["epochs"]


def test_sources_unchanged_since_training() -> None:
    # The weights reproduce only from the sources they were trained with.
    current = train_script.source_digests()
    for name, entry in ENTRIES.items():
        stale = [f for f, digest in current.items() if entry[f] != digest]
        assert not stale, (
            f"{name}: {stale} changed since training; rerun "
            "`python -m codec_tosa_examples.models.trained.train` and commit weights/"
        )


def test_data_set() -> None:
    d = trained.digits()
    assert d.train_x.shape == (1437, 1, 32, 32) and d.test_x.shape == (360, 1, 32, 32)
    assert d.noisy_x.shape == d.test_x.shape
    assert d.train_x.dtype == d.test_x.dtype == d.noisy_x.dtype == torch.float32
    assert d.train_y.dtype == d.test_y.dtype == torch.int64
    # Stratified: every class in both splits, in proportion.
    assert torch.all(torch.bincount(d.test_y, minlength=10) >= 35)
    assert abs(float(d.train_x.mean())) < 1e-5 and abs(float(d.train_x.std()) - 1.0) < 1e-5
    assert (MANIFEST["data"]["mean"], MANIFEST["data"]["std"]) == (d.mean, d.std)
    # The corruption is fixed: the same on every call, and sigma 0.4.
    again = trained.digits()
    assert torch.equal(again.noisy_x, d.noisy_x) and torch.equal(again.test_x, d.test_x)
    assert abs(float((d.noisy_x - d.test_x).std()) - 0.4) < 0.01
    # A copy per call: modifying one does not change the next.
    d.test_x.zero_()
    assert not torch.equal(trained.digits().test_x, d.test_x)


def test_calibration_images() -> None:
    images = trained.calibration_images()
    assert len(images) == 64
    assert all(len(t) == 1 and t[0].shape == (1, 1, 32, 32) for t in images)
    train_x = trained.digits().train_x
    stacked = torch.cat([t[0] for t in images])
    # Training images, 64 distinct ones.
    assert all(bool((train_x == img).all(dim=(1, 2, 3)).any()) for img in stacked)
    assert len({img.numpy().tobytes() for img in stacked}) == 64
    assert all(torch.equal(a[0], b[0]) for a, b in zip(images, trained.calibration_images()))
    assert not torch.equal(stacked, torch.cat([t[0] for t in trained.calibration_images(seed=1)]))
    assert len(trained.calibration_images(8, seed=3)) == 8


def test_top1_accepts_callables_returning_sequences() -> None:
    model, _ = trained.load("digits_mobilenet")
    x = trained.digits().test_x[:10]
    pred = trained.top1(model, x, batch=4)
    assert pred.shape == (10,) and pred.dtype == torch.int64
    assert torch.equal(trained.top1(lambda b: [model(b)], x, batch=1), pred)
    assert trained.accuracy(pred, pred) == 1.0


@pytest.mark.parametrize("name", trained.MODELS)
def test_committed_weights_give_manifest_accuracies(name: str, one_thread: None) -> None:
    model, (example,) = trained.load(name)
    assert not model.training
    d = trained.digits()
    assert torch.equal(example, d.test_x[:1])
    entry = ENTRIES[name]
    assert sum(p.numel() for p in model.parameters()) == entry["params"]
    clean = trained.accuracy(trained.top1(model, d.test_x), d.test_y)
    noisy = trained.accuracy(trained.top1(model, d.noisy_x), d.test_y)
    assert (clean, noisy) == (entry["clean_top1"], entry["noisy_top1"])
    # The noise costs at least 1% (4 of 360 images), so flows can differ on it.
    assert noisy <= clean - 0.01
    assert clean >= 0.98


@pytest.mark.parametrize("name", trained.MODELS)
def test_builtin_builder_exports(name: str) -> None:
    assert BUILTIN_MODELS[name] is getattr(trained, name)
    model, inputs = load_model(name)
    assert inputs[0].shape == (1, 1, 32, 32)
    exported = torch.export.export(model, inputs)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(*inputs), model(*inputs))


@pytest.mark.slow
def test_retraining_reproduces_committed_weights() -> None:
    # Full retrain of the fastest model (about 22 s on one idle core), bit for bit.
    entry = ENTRIES[FULL_RETRAIN]
    result = train_script.train(FULL_RETRAIN)
    assert result.epoch_digests == _expected(FULL_RETRAIN, entry["epochs"])
    if result.epoch_digests != entry["epoch_digests"]:
        return  # another kind of CPU gives other weights: its recorded digests above are the check
    committed = torch.load(trained.WEIGHTS_DIR / f"{FULL_RETRAIN}.pt", weights_only=True)
    state = result.model.state_dict()
    assert list(state) == list(committed)
    differing = [k for k in state if not torch.equal(state[k], committed[k])]
    assert not differing, f"{FULL_RETRAIN}: retrained tensors differ: {differing}"


@pytest.mark.parametrize("name", [n for n in trained.MODELS if n != FULL_RETRAIN])
def test_first_epoch_reproduces_checkpoint_digest(name: str) -> None:
    # The others take 40-60 s each: retrain their first epoch only (same
    # schedule as the full run) and compare with the manifest's epoch-1 digest.
    result = train_script.train(name, epochs=1)
    assert result.epoch_digests == _expected(name, 1)
