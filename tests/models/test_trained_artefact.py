"""A trained model end to end through its artefact (issue 23): the digits DS-CNN
lowered by the README's Python recipe at the default policy, calibrated on
training images, then run in ExecuTorch's runtime (the TOSA reference model
inside) on held-out test images, against its labels and its own FP32 logits.
benchmarks/accuracy.py measures every flow this way on the whole test set."""

from __future__ import annotations

import pytest
import torch

from codec_tosa import CodecSpec, CodecTosaPartitioner
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.validation.metrics import sqnr_db
from codec_tosa_examples.models import trained

MODEL = "digits_ds_cnn"
IMAGES = 96  # of the 360 test images, clean and noisy
CALIBRATION = 32  # training images


@pytest.fixture(scope="module")
def logits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(FP32 eager, artefact) logits per test set."""
    from executorch.exir import to_edge_transform_and_lower

    torch.set_num_threads(1)
    model, example = trained.load(MODEL)
    partitioner = CodecTosaPartitioner(CodecSpec(), calibration=trained.calibration_images(CALIBRATION))
    with torch.no_grad():
        program = torch.export.export(model, example)
    pte = bytes(to_edge_transform_and_lower(program, partitioner=[partitioner]).to_executorch().buffer)
    d = trained.digits()
    out = {}
    for name, images in (("clean", d.test_x[:IMAGES]), ("noisy", d.noisy_x[:IMAGES])):
        with torch.no_grad():
            fp32 = model(images)
        ran = torch.cat([run_pte(pte, [images[i:i + 1].contiguous()])[0].reshape(1, -1) for i in range(IMAGES)])
        out[name] = (fp32, ran)
    return out


def test_clean_images_keep_fp32_accuracy(logits) -> None:
    fp32, ran = logits["clean"]
    labels = trained.digits().test_y[:IMAGES]
    assert trained.accuracy(ran.argmax(1), labels) >= trained.accuracy(fp32.argmax(1), labels) - 1 / IMAGES
    # at W every conv+relu domain is coded at its post-relu range: 36 dB on the
    # whole set (docs/results/accuracy.md); coding it at the signed pre-relu range gave 34.5
    assert sqnr_db(fp32.numpy(), ran.numpy()) > 35.0


def test_noisy_images_stay_close_to_fp32(logits) -> None:
    # inputs beyond the calibrated range: every INT8 flow loses here (stock's
    # DS-CNN 18.8 dB, 7 of 360 images changed), none may collapse
    fp32, ran = logits["noisy"]
    assert int((ran.argmax(1) != fp32.argmax(1)).sum()) <= IMAGES // 20
    assert sqnr_db(fp32.numpy(), ran.numpy()) > 15.0
